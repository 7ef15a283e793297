"""A job whose checkpoints go to an object store, rendered for the container backends: the
credentials reach the container by name only (never a value in the command or manifest), and
the render says in one line where the checkpoints go.

Here the tests that start processes or take longer; the in-process ones in
tests/unit/backends/test_objstore_render.py."""

from __future__ import annotations

from tests.unit.backends.test_objstore_render import SECRET, _render


def test_k8s_says_once_where_the_checkpoints_go(tmp_path):
    store = _render(tmp_path, "k8s", "ckpt_dir=s3://bucket/run")
    assert store.returncode == 0, store.stderr
    notes = [ln for ln in store.stdout.splitlines() if "checkpoints" in ln and ln.startswith("#")]
    assert notes == [
        "# checkpoints go to s3://bucket/run: name the store's credentials in k8s.secret_env "
        '(e.g. AWS_ACCESS_KEY_ID = "s3/access-key") and AWS_ENDPOINT_URL in env; without '
        "k8s.pvc the run dir's logs go with the pod"
    ]
    assert SECRET not in store.stdout
    plain = _render(tmp_path, "k8s")
    assert [ln for ln in plain.stdout.splitlines() if ln.startswith("# no k8s.pvc")] == [
        "# no k8s.pvc: checkpoints stay on each pod's disk and are lost with the pod; "
        "set k8s.pvc (or k8s.pvc_size)"
    ]


def test_a_store_url_is_never_folded_into_a_path(tmp_path):
    """pathlib reads `s3://b/run` as `s3:/b/run`: no claim mount at such a path, and a
    replica group's dir stays a URL."""
    from ddpkit.train.launch.replica_groups import group_dir

    assert group_dir("s3://bucket/run/", 1) == "s3://bucket/run/group-1"
    r = _render(tmp_path, "k8s", "ckpt_dir=s3://bucket/run", "k8s.pvc=claim")
    assert r.returncode == 0, r.stderr
    assert "s3:/bucket" not in r.stdout.replace("s3://bucket", "")
    assert "DDPKIT_CKPT_DIR" in r.stdout and "s3://bucket/run" in r.stdout
