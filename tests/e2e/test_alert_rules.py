"""samples/prometheus-alerts.yml: valid rules, each one tested by promtool on series
written for it (tests/e2e/prometheus-alerts-test.yml), on gpuwatch's real metric names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT
from test_grafana_dashboard import exported_names

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="needs promtool on PATH (Debian: apt-get install prometheus)",
)
RULES = ROOT / "samples" / "prometheus-alerts.yml"
TESTS = ROOT / "tests" / "e2e" / "prometheus-alerts-test.yml"
ALERTS = {
    "GpuMemoryNearlyFull",
    "GpuOutOfMemory",
    "GpuAllocatorRetriesRising",
    "GpuRankMemoryImbalance",
    "GpuwatchDown",
    "GpuForecastOutOfMemory",
}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def rules_text() -> str:
    """The rules file without its comments (no YAML parser is a dependency; promtool
    parses it for real above)."""
    return re.sub(r"(?m)^\s*#.*$", "", RULES.read_text())


def test_promtool_accepts_the_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout


def test_every_rule_fires_and_holds_back_as_written() -> None:
    out = promtool("test", "rules", str(TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    tested = set(re.findall(r"alertname: (\w+)", TESTS.read_text()))
    assert tested == ALERTS == set(re.findall(r"- alert: (\w+)", rules_text()))


def test_the_rules_name_only_metrics_gpuwatch_exports() -> None:
    exported = exported_names()
    used = set(re.findall(r"\bgpuwatch_[a-z0-9_]+", rules_text()))
    assert used and used - exported == set()
    text = rules_text()
    assert len(re.findall(r"severity: (?:warning|critical)\n", text)) == len(ALERTS)
    assert len(re.findall(r"summary: \"[^\"]+\"", text)) == len(ALERTS)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("> 0.95", "> 0.97"),  # a threshold moved
        ("for: 30s", "for: 45s"),
        ("1.2 * (", "1.25 * ("),
        ('world_size!~"|0|1"', 'world_size!~"|0"'),  # lone processes compared
        (") > 2\n", ") > 1\n"),  # a 2-rank job against the mean of its two
        ("min by (job_id)", "min by (slurm_job)"),  # 2-rank jobs folded into one
        ("unless gpuwatch_process_ooms_total offset 5m", "unless gpuwatch_process_ooms_total"),
        ('up{job="gpuwatch"} == 0', 'up{job="gpuwatch"} < 0'),
        ("for: 5m", "for: 1m"),
        # a forecast compared with another GPU's, or any process's on the host
        ("> on (host, pid, gpu) group_left", "> on (host) group_left"),
        ("peak_bytes)\n          >", "peak_bytes)\n          >="),  # a forecast at the limit
    ],
)
def test_a_changed_rule_fails_its_test(tmp_path: Path, old: str, new: str) -> None:
    # The unit tests are not vacuous: each of these edits makes promtool report a failure.
    (tmp_path / "samples").mkdir()
    (tmp_path / "tests").mkdir()
    text = RULES.read_text()
    assert old in text
    (tmp_path / "samples" / RULES.name).write_text(text.replace(old, new))
    shutil.copy(TESTS, tmp_path / "tests" / TESTS.name)
    out = promtool("test", "rules", str(tmp_path / "tests" / TESTS.name), cwd=tmp_path)
    assert out.returncode != 0, out.stdout
    assert "FAILED" in out.stdout + out.stderr
