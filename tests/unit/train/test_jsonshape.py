"""The one shape check for JSON the kit reads back (ddpkit.train.jsonshape): what it accepts,
and the one phrase that says where and what for what it does not."""

from __future__ import annotations

import pytest
from ddpkit.train.jsonshape import ListOf, MapOf, Opt, ShapeError, check, load, loads

from tests.badjson import WHOLE

RECORD = {"job": (str, int), "exit_code": Opt(int), "ratio": Opt(float)}


@pytest.mark.parametrize(
    "doc",
    [
        {"job": "12"},
        {"job": 12, "exit_code": 0, "ratio": 0.5},
        {"job": "a", "ratio": 3},  # a number may be written without a fraction
        {"job": "a", "unknown": [1]},  # keys a newer version adds are allowed
    ],
)
def test_documents_of_the_shape_pass_unchanged(doc):
    assert check(doc, RECORD) is doc


@pytest.mark.parametrize(
    "doc,message",
    [
        ([1, 2], "a list, not an object"),
        (3, "an integer (3), not an object"),
        (None, "null, not an object"),
        ({}, "no 'job' key"),
        ({"job": None}, "job: null, not a string or an integer"),
        ({"job": True}, "job: a boolean, not a string or an integer"),  # JSON true is no id
        ({"job": "1", "exit_code": 1.0}, "exit_code: a number (1.0), not an integer"),
        ({"job": "1", "exit_code": "0"}, "exit_code: a string ('0'), not an integer"),
        ({"job": "1", "ratio": False}, "ratio: a boolean, not a number"),
    ],
)
def test_the_first_difference_is_one_phrase_naming_where(doc, message):
    with pytest.raises(ShapeError) as e:
        check(doc, RECORD)
    assert str(e.value) == message


def test_nested_objects_maps_and_lists_name_the_path():
    shape = {"files": MapOf({"bytes": int}), "rows": Opt(ListOf({"op": str}))}
    with pytest.raises(ShapeError, match=r"^files\['a'\]: an integer \(3\), not an object$"):
        check({"files": {"a": 3}}, shape)
    with pytest.raises(ShapeError, match=r"^files\['a'\]\.bytes: a string \('1'\), not an"):
        check({"files": {"a": {"bytes": "1"}}}, shape)
    with pytest.raises(ShapeError, match=r"^rows\[1\]: no 'op' key$"):
        check({"files": {}, "rows": [{"op": "x"}, {}]}, shape)


def test_a_long_value_is_shortened_in_the_message():
    with pytest.raises(ShapeError) as e:
        check({"job": "1", "exit_code": "x" * 500}, RECORD)
    assert len(str(e.value)) < 100


@pytest.mark.parametrize("label,body", WHOLE, ids=[label for label, _ in WHOLE])
def test_every_whole_document_damage_is_a_shape_error_of_one_line(tmp_path, label, body):
    path = tmp_path / "doc.json"
    path.write_bytes(body)
    with pytest.raises(ShapeError) as e:
        load(path, RECORD)
    assert "\n" not in str(e.value) and str(e.value), label


def test_loads_and_load_return_the_checked_document(tmp_path):
    (tmp_path / "r.json").write_text('{"job": "7", "exit_code": 0}\n')
    assert load(tmp_path / "r.json", RECORD) == {"job": "7", "exit_code": 0}
    assert loads("[1]", ListOf(int)) == [1]
    with pytest.raises(FileNotFoundError):  # missing is the caller's to tell apart
        load(tmp_path / "missing.json", RECORD)
