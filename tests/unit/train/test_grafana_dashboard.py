"""docs/grafana-ddpkit.json loads as a Grafana dashboard (the fields Grafana's dashboard JSON
model needs, unique panel ids, panels that do not overlap) and every query names series the
exporter really exports (train/observe/exposition.py METRICS)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddpkit.train.observe import exposition

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana-ddpkit.json"


def _exported() -> set[str]:
    """Every series name in the text format: a counter's with its _total."""
    return {name + ("_total" if kind == "counter" else "")
            for name, (kind, _) in exposition.METRICS.items()}  # fmt: skip


def test_the_dashboard_has_the_fields_grafana_loads():
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d["title"], str) and d["uid"] and isinstance(d["schemaVersion"], int)
    assert d["__inputs"][0]["pluginId"] == "prometheus"  # Import asks for the data source
    (var,) = d["templating"]["list"]
    assert var["name"] == "run" and "ddpkit_run_info" in var["query"]["query"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        assert p["type"] in ("stat", "timeseries", "bargauge", "table") and p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0  # Grafana's 24 columns
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]  # no panel drawn over another
        cells |= mine
        assert p["targets"] and all(t["refId"] and t["expr"] for t in p["targets"])


def test_every_query_names_metrics_the_exporter_exports():
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    exprs.append(d["templating"]["list"][0]["query"]["query"])
    used = {m for e in exprs for m in re.findall(r"\bddpkit_[a-z_]+", e)}
    assert used <= _exported(), sorted(used - _exported())
    for e in exprs:  # each series is filtered by the dashboard's run variable
        if "label_values" not in e:
            assert all(f'{m}{{run=~"$run"}}' in e for m in re.findall(r"\bddpkit_[a-z_]+", e)), e
    # and it shows every figure the exporter has
    assert used == _exported(), sorted(_exported() - used)


def test_docs_observability_lists_every_metric():
    docs = (DASHBOARD.parent / "observability.md").read_text()
    listed = set(re.findall(r"^\| `(ddpkit_[a-z_]+)` \|", docs, flags=re.M))
    assert listed == _exported(), (sorted(_exported() - listed), sorted(listed - _exported()))
