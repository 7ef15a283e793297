"""A new built-in engine is one package plus one line in the registry.

The toy engine below is a package written into a temporary directory (as `slurm/` or `k8s/`
is in the kit) and registered with the one line a kit engine adds to
ddpkit.tools.backends.registry.BACKENDS (added for the test and taken out after it: tests
write nothing into the checkout, so the line cannot be written into registry.py). Nothing
else of the kit names it, yet its `[toy]` table is typed like `[slurm]`, its rules run for
its jobs only, and the launcher renders and submits through it, Make variables and
`ddpkit init` included.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools import init, submit
from ddpkit.tools.backends import registry
from ddpkit.tools.jobspec import SpecError, load_spec

BACKEND = '''
"""A toy engine: "submits" by writing its rendered job where a queue would pick it up."""
from dataclasses import dataclass, field

from ddpkit.tools.backends import Backend, JobState, JobStatus, last_job, record_job, state_dir
from ddpkit.tools.jobspec import node_command, standalone
from ddpkit.tools.templating import shell_join
from ddpkit.train import contract
from ddpkit.train.dataclass_fields import at_least, checks


@dataclass
class ToyOptions:
    __backend_options__ = True  # its checks run for toy jobs only, as [slurm]'s do
    queue: str = "default"
    slots: int = field(default=1, metadata=checks(at_least(1)))


class ToyBackend(Backend):
    name = "toy"
    file_ext = "sh"
    Options = ToyOptions
    make_vars = {"TOYQ": "queue"}
    job_file_lines = ('# queue = "fast"',)

    def render(self, spec):
        # Where this node is, in the contract's names, from the toy scheduler's own variables
        # (the node's host, its index, the retries so far): the worker reads only those names.
        place = (f'export {contract.NODE_NAME_ENV}="$TOY_HOST" {contract.NODE_NUMBER_ENV}="$TOY_INDEX" '
                 f'{contract.SCHEDULER_ATTEMPT_ENV}="${{TOY_RETRIES:-0}}"')
        argv = node_command(spec, standalone(spec.nproc_per_node))  # the one builder's, as it is
        return f"# queue={spec.toy.queue} slots={spec.toy.slots}\\n{place}\\n{shell_join(argv)}\\n"

    def submit(self, spec, opts):
        path = state_dir() / "toy" / f"{spec.name}.sh"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.render(spec))
        record_job(self.name, spec.name, path=str(path))
        print(f"queued {path}")
        return 0

    def poll(self, job):
        return JobStatus(job, JobState.PENDING, detail=last_job(self.name)["path"])

    def logs(self, job, opts):
        return 0

    def cancel(self, job, opts):
        return 0
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package in tmp_path/toyengine, the one registry line, a project dir as cwd."""
    (tmp_path / "toyengine").mkdir()
    (tmp_path / "toyengine" / "__init__.py").write_text("")
    (tmp_path / "toyengine" / "backend.py").write_text(BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.BACKENDS, "toy", "toyengine.backend:ToyBackend")  # the line
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hello')\n")
    monkeypatch.chdir(project)
    return project


def test_its_table_is_typed_and_checked_like_the_kit_engines(toy: Path) -> None:
    spec = load_spec(None, ["toy.queue=fast", "toy.slots=4"])
    assert (spec.toy.queue, spec.toy.slots) == ("fast", 4)
    assert load_spec(None).toy.slots == 1  # its defaults, without a [toy] table
    with pytest.raises(
        SpecError, match=r"unknown key 'bogus'; valid keys in \[toy\]: queue, slots"
    ):
        load_spec(None, ["toy.bogus=1"])
    (toy / "job.toml").write_text('script = "train.py"\n[toy]\nslots = "four"\n')
    with pytest.raises(SpecError, match="toy.slots must be int"):
        load_spec(toy / "job.toml")


def test_the_launcher_renders_and_submits_through_it(toy: Path, capsys) -> None:
    assert submit.run(["render", "toy", "train.py", "--nodes", "2", "--set", "toy.queue=q"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# queue=q slots=1\n") and " -- train.py" in out
    with pytest.raises(SpecError, match="toy.slots"):  # its rule, for its own jobs
        submit.run(["render", "toy", "train.py", "--set", "toy.slots=0"])
    assert submit.run(["render", "local", "train.py", "--set", "toy.slots=0"]) == 0  # not others'
    capsys.readouterr()
    assert submit.run(["submit", "toy", "train.py"]) == 0
    queued = Path(capsys.readouterr().out.split()[-1])
    assert queued.read_text().startswith("# queue=default slots=1\n")
    assert submit.run(["status", "toy"]) == 0
    assert f"pending {queued}" in capsys.readouterr().out


def test_print_spec_make_and_init_know_it(toy: Path, capsys) -> None:
    assert submit.run(["render", "toy", "--print-spec", "--set", "toy.queue=q"]) == 0
    assert '[toy]\nqueue = "q"\nslots = 1\n' in capsys.readouterr().out
    argv = submit.make_argv(["submit", "toy", "--make"], {"TOYQ": "fast"})
    assert argv[-2:] == ["--set", "toy.queue=fast"]
    text = init.render("demo", 1, {"script": "train.py"})
    assert text.endswith('\n[toy]\n# queue = "fast"\n')
    assert "\n[slurm]\n" in text  # the kit engines' lines, from their packages too


# --- what a job load imports of the engines (issue 34: launch overhead) ----------------------


def test_the_options_hint_names_each_kit_engines_own_options() -> None:
    """registry.OPTIONS only spares the imports: each entry is the Backend's own Options."""
    assert set(registry.OPTIONS) == set(registry.BACKENDS)
    for name, path in registry.OPTIONS.items():
        hinted = None if path is None else registry._imported(path)
        assert registry.builtin_class(name).Options is hinted, name


def test_a_local_render_loads_no_other_engine_and_no_torch(tmp_path: Path) -> None:
    """`ddpkit run`'s CLI process types every engine's table from its options module alone:
    no engine's backend, render or client, and no torch (about 2 CPU-seconds a launch)."""
    (tmp_path / "train.py").write_text("print('hello')\n")
    probe = (
        "import sys\n"
        "from ddpkit.tools import submit\n"
        "assert submit.run(['render', 'local', 'train.py', '--set', 'slurm.partition=p']) == 0\n"
        "heavy = [m for m in sys.modules if m == 'torch' or m.startswith(('ddpkit.slurm.',"
        " 'ddpkit.k8s.', 'ddpkit.docker.')) and not m.endswith('.options')]\n"
        "print('LOADED', heavy)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "LOADED []", r.stdout[-2000:]
