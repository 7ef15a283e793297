"""Every string the kit writes into a manifest reads back as that string, to the readers that
read manifests: the API server's (sigs.k8s.io/yaml: go-yaml v2, then JSON), YAML 1.2's core
schema and PyYAML's YAML 1.1. The readers below are written from go-yaml v2's resolve.go and
the YAML 1.2 spec (10.3.2), apart from the dumper's own rule; the real API server's verdict is
in test_k8s_real.py.

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_k8s_yaml.py. Helpers both use are in
tests/unit/backends/test_k8s_yaml.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.backends.test_k8s_yaml import roundtrip

ALPHABET = "0123456789.eE+-_:oOxXbByYnNtTfF~ aAzZ/#'\"\\@&*!%|>?[]{},\t\n\r\x85\u2028\u2029\xa0é"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=ALPHABET, max_size=8), min_size=1, max_size=20))
@example(["1e-3", "0755", "1:30", "yes", "~", "2024-01-01", "a\x85b"])
def test_any_string_reads_back_as_that_string_to_every_reader(values: list[str]) -> None:
    roundtrip(values)


def test_a_value_that_is_not_utf8_is_refused_at_render_in_one_line(tmp_path, one_line_error):
    """A byte that is not UTF-8 reaches the shell backends as the byte; a manifest holds text
    only (the pod would get U+FFFD), so render k8s refuses it instead of changing it."""
    ddpkit = Path(sys.executable).with_name("ddpkit")
    r = subprocess.run([ddpkit, "render", "k8s", "--", "--data-dir", b"data\xff"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "holds the byte 0xff, which is not UTF-8" in one_line_error(r)
    assert r.stdout == ""
