"""samples/grafana-gpuwatch.json: importable, and its queries cannot drift from the exporter.

Every metric a query names must be one the exporter exports (taken from a real scrape of
a session that has every metric), and every query must be written down in
docs/prometheus.md, and the reverse. tests/e2e/test_prometheus_server.py runs each query on
a real Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import synthetic
from conftest import ROOT
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.analysis.forecast import foresight
from gpuwatch.prometheus import SessionCollector
from gpuwatch.protocol import Message

DASHBOARD = ROOT / "samples" / "grafana-gpuwatch.json"
DOC = ROOT / "docs" / "prometheus.md"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def dashboard_queries() -> list[str]:
    """Every PromQL query of the dashboard: panels, annotations and variables."""
    d = load()
    exprs = [n["expr"] for n in _walk(d) if isinstance(n.get("expr"), str)]
    for var in d["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def exported_names() -> set[str]:
    """Sample names a scrape of a session with every metric holds (``_total`` included)."""
    s = synthetic.build(2)
    s.ingest(
        Message("phase", synthetic.PID, 10**6, synthetic.end_time(2) + 1, body={
            "event": "begin", "name": "forward", "id": 10**6, "depth": 0,
        })
    )  # fmt: skip
    s.ingest(
        Message("memory", synthetic.PID, 10**6 + 1, synthetic.end_time(2) + 2, body={
            "dev": 0, "allocated": 1, "reserved": 2, "inactive_split": 0,
            "alloc_retries": 0, "alloc_ooms": 0,
        })
    )  # fmt: skip
    s.count_reject("json")
    foresight(s).update()  # the forecasts, as the live sources' foresight keeps them
    registry = CollectorRegistry()
    registry.register(SessionCollector(s, host="h"))
    text = generate_latest(registry).decode()
    return {x.name for f in text_string_to_metric_families(text) for x in f.samples}


def test_every_metric_a_query_uses_is_exported() -> None:
    exported = exported_names()
    used = {m for q in dashboard_queries() for m in re.findall(r"\bgpuwatch_[a-z0-9_]+", q)}
    assert used, "no gpuwatch metric in the dashboard"
    assert used - exported == set()
    # The four lines of the terminal dashboard and the phases are all there.
    for name in (
        "gpuwatch_gpu_memory_used_bytes",
        "gpuwatch_process_torch_allocated_bytes",
        "gpuwatch_process_torch_reserved_bytes",
        "gpuwatch_process_predicted_bytes",
        "gpuwatch_process_phase_info",
    ):
        assert name in used


def test_the_drift_check_can_fail() -> None:
    exported = exported_names()
    assert "gpuwatch_gpu_memory_used_bytes" in exported
    assert "gpuwatch_gpu_memory_used" not in exported  # a query must name it exactly
    assert "gpuwatch_process_phases_total" in exported  # counters as scraped: with _total


def test_docs_show_exactly_the_dashboards_queries() -> None:
    doc = DOC.read_text()
    blocks = re.findall(r"```promql\n(.*?)```", doc, flags=re.S)
    documented = {line for b in blocks for line in b.splitlines() if line.strip()}
    panels = {q for q in dashboard_queries() if not q.startswith("label_values(")}
    assert panels - documented == set(), "queries missing from docs/prometheus.md"
    assert documented - panels == set(), "docs/prometheus.md shows queries the JSON lacks"
    for q in dashboard_queries():
        if q.startswith("label_values("):
            assert q in doc


def test_dashboard_is_importable_with_a_datasource_input_and_variables() -> None:
    d = load()
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    assert d["__inputs"][0]["pluginId"] == "prometheus"
    names = {v["name"]: v for v in d["templating"]["list"]}
    assert names["DS_PROMETHEUS"]["type"] == "datasource"
    assert names["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"host", "gpu"} <= set(names)
    assert names["gpu"]["multi"] and names["gpu"]["includeAll"]
    # Every query goes to the chosen Prometheus.
    for node in _walk(d):
        if "expr" in node or node.get("type") == "query":
            assert node.get("datasource") == DATASOURCE, node
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    rows = [p for p in panels if p["type"] == "row"]
    assert rows[0]["repeat"] == "gpu" and "$gpu" in rows[0]["title"]
    kinds = {p["type"] for p in panels}
    assert {"timeseries", "state-timeline"} <= kinds
    for p in panels:
        if p["type"] != "row":
            assert p["targets"] and p["description"], p["title"]


def test_cluster_row_has_the_gpu_grid_and_the_rank_peaks() -> None:
    d = load()
    panels = {p["title"]: p for p in d["panels"]}
    rows = [p for p in d["panels"] if p["type"] == "row"]
    cluster = next(r for r in rows if r["title"].startswith("Cluster"))
    assert "repeat" not in cluster  # once, for every host: not under a GPU row
    below = [p for p in d["panels"] if p["gridPos"]["y"] > cluster["gridPos"]["y"]]
    grid = next(p for p in below if p["type"] == "stat")
    (target,) = grid["targets"]
    # One cell per host:gpu: used over total, aggregated by exactly those labels.
    assert target["legendFormat"] == "{{host}}:{{gpu}}" and target.get("instant")
    assert re.fullmatch(
        r"max by \(host, gpu\) \(gpuwatch_gpu_memory_used_bytes / "
        r"gpuwatch_gpu_memory_total_bytes\)",
        target["expr"],
    )
    assert grid["fieldConfig"]["defaults"]["unit"] == "percentunit"
    steps = grid["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps][-1] == 0.95  # red where the alert fires
    per_phase = panels["Peak allocated per phase: the highest rank, and the median"]
    exprs = [t["expr"] for t in per_phase["targets"]]
    assert exprs[0].startswith("max by (phase) (gpuwatch_process_phase_peak_allocated_bytes")
    assert exprs[1].startswith("quantile by (phase) (0.5, gpuwatch_process_phase_peak")
    ranks = next(p for p in below if p["type"] == "bargauge")
    (target,) = ranks["targets"]
    assert "max by (host, pid, rank) (gpuwatch_process_phase_peak_allocated_bytes" in target["expr"]
    assert "{{rank}}" in target["legendFormat"] and "{{host}}" in target["legendFormat"]
    for p in (per_phase, ranks):
        assert all('slurm_job=~"$slurm_job", job_id=~"$job_id"' in t["expr"] for t in p["targets"])
    variables = {v["name"]: v for v in d["templating"]["list"]}
    job = variables["slurm_job"]
    assert job["query"]["query"] == "label_values(gpuwatch_rank_info, slurm_job)"
    assert job["includeAll"] and job["allValue"] == ".*"  # All: non-Slurm processes too
    # The job the cluster view compares ranks within (issue 40), among the Slurm jobs picked.
    job = variables["job_id"]
    picked = 'label_values(gpuwatch_rank_info{slurm_job=~"$slurm_job"}, job_id)'
    assert job["query"]["query"] == picked
    assert job["multi"] and job["includeAll"] and job["allValue"] == ".*"
    required = {r["id"] for r in d["__requires"] if r["type"] == "panel"}
    assert {p["type"] for p in d["panels"] if p["type"] != "row"} <= required
