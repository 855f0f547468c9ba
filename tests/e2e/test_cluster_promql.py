"""The cluster view's refresh queries, evaluated by Prometheus' own engine (``promtool test
rules``) on series written for them: each family's series come back, and those of the
families asked as ``!= 1`` come back when they are not 1, whatever else shares their labels."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwatch.cluster.client import quote
from gpuwatch.cluster.model import FAMILIES, NOT_ONE, family_queries

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="needs promtool on PATH (Debian: apt-get install prometheus)",
)
TARGET = {"instance": "node-a:9400", "job": "gpuwatch"}


def _gpu(gpu: str, **figures: float) -> list[tuple[str, dict[str, str], float]]:
    labels = {**TARGET, "host": "node-a", "gpu": gpu, "uuid": f"GPU-{gpu}"}
    return [(f"gpuwatch_gpu_{k}", labels, v) for k, v in figures.items()]


# A GPU NVML lost (gpuwatch_gpu_up 0, its memory total still exported with the same
# labels), one that is up, a target that is up and one that is down.
SERIES = [
    *_gpu("0", up=0, memory_total_bytes=80e9),
    *_gpu("1", up=1, memory_total_bytes=80e9, memory_used_bytes=10e9),
    ("up", TARGET, 1),
    ("up", {"instance": "node-b:9400", "job": "gpuwatch"}, 0),
]


def _text(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _expected(families: tuple[str, ...]) -> list[dict]:
    return [
        {"labels": _text(name, labels), "value": value}
        for name, labels, value in SERIES
        if name in families and (name not in NOT_ONE or value != 1)
    ]


@pytest.mark.parametrize("matchers", [(), (("job", "=", quote("gpuwatch")),)], ids=["all", "job"])
def test_the_refresh_queries_answer_every_series_they_ask(tmp_path: Path, matchers) -> None:
    queries = family_queries(matchers, FAMILIES)
    assert {n for _, names in queries for n in names} >= {"gpuwatch_gpu_up", "up"}
    (tmp_path / "rules.yml").write_text("groups: []\n")
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _text(name, labels), "values": f"{value} {value}"}
                    for name, labels, value in SERIES
                ],
                "promql_expr_test": [
                    {"expr": promql, "eval_time": "1m", "exp_samples": _expected(names)}
                    for promql, names in queries
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(json.dumps(test, indent=1))  # JSON is YAML
    out = subprocess.run(
        [str(PROMTOOL), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
