"""Every string the kit writes into a manifest reads back as that string, to the readers that
read manifests: the API server's (sigs.k8s.io/yaml: go-yaml v2, then JSON), YAML 1.2's core
schema and PyYAML's YAML 1.1. The readers below are written from go-yaml v2's resolve.go and
the YAML 1.2 spec (10.3.2), apart from the dumper's own rule; the real API server's verdict is
in test_k8s_real.py.

Here the tests that run in this process; those that start processes in
tests/process/backends/test_k8s_yaml.py."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.tools.jobspec import load_spec
from ddpkit.tools.templating import dump_yaml_all, to_json, yaml_str


class NonString:
    """What a reader made of a plain scalar it resolved to a number, boolean, null or date."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"NonString({self.text!r})"


# go-yaml v2 resolve.go: resolveMap, then by the first character: a number (Go's
# strconv.ParseInt/ParseUint with base 0 after dropping underscores, yamlStyleFloat, 0b),
# a timestamp (time.Parse with 2006-1-2 layouts), or ParseFloat for a leading dot.
GO_MAP = {
    *["y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF"],
    *["true", "True", "TRUE", "false", "False", "FALSE", "null", "Null", "NULL", "~", "<<"],
    *(f"{s}.{w}" for s in ("", "+", "-") for w in ("inf", "Inf", "INF")),
    ".nan", ".NaN", ".NAN",
}  # fmt: skip
GO_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
GO_TIME = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d")


def go_yaml_v2_resolves(s: str) -> bool:
    if s == "" or s in GO_MAP:
        return True
    if s[0] == ".":
        return bool(re.fullmatch(r"\.[0-9]+([eE][-+]?[0-9]+)?", s))
    if s[0] not in "+-0123456789":
        return False
    date = re.fullmatch(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(.*)", s, re.DOTALL)
    if date and s[0].isdigit():
        y, m, d, rest = date.groups()
        head = f"{y}-{int(m):02d}-{int(d):02d}" if m.isdigit() and d.isdigit() else s
        for layout in GO_TIME:
            try:
                datetime.strptime(head + rest.rstrip("Zz").split("+")[0], layout)
                return True
            except ValueError:
                pass
    plain = s.replace("_", "")
    return bool(GO_INT.fullmatch(plain) or GO_FLOAT.fullmatch(plain))


# YAML 1.2 core schema (tag resolution, 10.3.2).
CORE = re.compile(
    r"null|Null|NULL|~|true|True|TRUE|false|False|FALSE"
    r"|[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"
    r"|[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
    r"|[-+]?\.(inf|Inf|INF)|\.nan|\.NaN|\.NAN"
)


def strict_loader(resolves):
    class Loader(yaml.SafeLoader):
        def resolve(self, kind, value, implicit):
            if kind is yaml.ScalarNode and implicit[0] and resolves(value):
                return "!non-string"
            return super().resolve(kind, value, implicit)

    Loader.add_constructor("!non-string", lambda loader, node: NonString(node.value))
    return Loader


READERS = {
    "go-yaml v2": strict_loader(go_yaml_v2_resolves),
    "YAML 1.2 core": strict_loader(lambda s: s == "" or bool(CORE.fullmatch(s))),
    "PyYAML (YAML 1.1)": yaml.SafeLoader,
}

# What users type: exponents, octal- and sexagesimal-looking numbers, YAML 1.1 booleans,
# nulls, dates, Go's number prefixes, and the characters YAML reads as line breaks.
TYPED = [
    "1e-3", "1E5", "+1e3", ".5", "5.", "-.5e2", "0755", "0o17", "0x1F", "0X1F", "0b101",
    "1_000", "1:30", "190:20:30", "yes", "No", "ON", "off", "y", "N", "null", "~", "NULL",
    "", "2024-01-01", "2024-1-2", "2024-01-01T10:00:00Z", "2024-01-01 10:00:00", ".inf",
    "-.Inf", ".NaN", "<<", "089", "1__0", "true", "False", "a\x85b", "x\u2028y", "p\u2029",
    "tab\there", "é ü", "\U0001f600", " lead", "trail ", "a: b", "#c", "- x", "line\nnext",
]  # fmt: skip


def roundtrip(values: list[str]) -> None:
    text = dump_yaml_all([{"args": values, "env": [{"name": "V", "value": v} for v in values]}])
    for name, loader in READERS.items():
        (doc,) = yaml.load_all(text, Loader=loader)
        assert doc["args"] == values, (name, text)
        assert [e["value"] for e in doc["env"]] == values, (name, text)


@pytest.mark.parametrize("value", TYPED)
def test_a_value_a_user_types_reads_back_as_that_string_to_every_reader(value: str) -> None:
    roundtrip([value, f"--flag={value}"])
    for scalar in (yaml_str(value), to_json(value)):  # the templates' filters
        for name, loader in READERS.items():
            assert yaml.load(f"k: {scalar}\n", Loader=loader) == {"k": value}, (name, scalar)


def test_the_strict_readers_catch_what_pyyaml_leaves_bare() -> None:
    """The readers above are stricter than PyYAML's: without the kit's quoting, the values
    the API server refused come back as numbers (so the tests above can fail)."""
    bare = yaml.safe_dump(["1e-3", "0o17", "y", "2024-1-2"])
    (doc,) = yaml.load_all(bare, Loader=READERS["go-yaml v2"])
    assert all(isinstance(v, NonString) for v in doc), bare
    (doc,) = yaml.load_all(yaml.safe_dump(["1e3"]), Loader=READERS["YAML 1.2 core"])
    assert isinstance(doc[0], NonString)


def test_a_users_flags_and_env_reach_the_manifest_as_strings() -> None:
    """Through the whole render: the user's flags after `--` and env values."""
    spec = load_spec(None, ["k8s.pvc_size=1Gi"], train_args=["--lr", "1e-3", "--seed", "0755"])
    spec.env = {f"V{i}": v for i, v in enumerate(TYPED)}
    text = k8s.render(spec)
    for name, loader in READERS.items():
        docs = list(yaml.load_all(text, Loader=loader))
        (c,) = docs[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        assert c["args"][-4:] == ["--lr", "1e-3", "--seed", "0755"], name
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert [env[f"V{i}"] for i in range(len(TYPED))] == TYPED, name
        assert all(isinstance(e.get("value", ""), str) for e in c["env"]), name
