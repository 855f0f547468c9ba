"""The property of issue 37: over every sample and every cursor column, the bar's
categories are the explanation of the phase at the cursor (the object the Peaks tab and
`info` read), within display rounding, and never add up past nvidia-smi's used memory."""

from __future__ import annotations

import pytest
from conftest import ROOT

from gpuwatch.analysis.breakdown import CATEGORIES
from gpuwatch.analysis.explain import explain_process
from gpuwatch.analysis.moment import moment
from gpuwatch.analysis.predicted import predictions
from gpuwatch.fmt import fmt_short
from gpuwatch.store.player import open_replay

SAMPLES = sorted((ROOT / "samples").glob("*.gpuwatch"))
COLUMNS = 240  # a wide terminal's chart


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_the_bar_is_the_phase_explanation_at_every_column(path) -> None:
    player = open_replay(path)
    try:
        player.loader.load_all()
        s = player.session
        lines = predictions(s)
        lines.update()
        t0, t1 = s.time_range()
        info = {
            p.pid: explain_process(s, p) for p in s.processes.values() if p.facts
        }  # what `gpuwatch info` prints
        checked = at_peak = 0
        for key in [k for k in s.gpu if s.processes_on(k)]:
            # Every column of a wide chart, and every allocator figure (each column
            # of a chart zoomed in as far as it goes).
            times = [t0 + (t1 - t0) * c // (COLUMNS - 1) for c in range(COLUMNS)]
            for proc in s.processes_on(key):
                times += [int(v) for v in proc.torch.between(t0, t1)["t"]]
            for col, t in enumerate(sorted(times)):
                now = moment(s, key, t, lines, with_breakdown=True)
                b = now.breakdown
                parts = dict(b.parts())
                if b.used is not None:
                    assert sum(parts.values()) <= b.used + 1, (path.name, col)
                if len(now.explained) != 1 or b.allocated is None or b.oom is not None:
                    continue
                ((pid, e),) = now.explained.items()
                # The bar's categories, with what went since the peak (▲), are the
                # explanation's; its residual is the explanation's unexplained.
                shown = {k: parts.get(k, 0.0) + (b.removed or {}).get(k, 0.0) for k in CATEGORIES}
                residual = e.measured - e.predicted_at_peak
                if b.allocated <= b.used and residual >= 0:
                    for k in CATEGORIES:
                        assert fmt_short(shown[k]) == fmt_short(e.categories.get(k, 0)), (
                            path.name,
                            col,
                            k,
                        )
                    assert fmt_short(parts.get("unexplained", 0.0)) == fmt_short(residual)
                    checked += 1
                elif residual < 0:  # over-predicted: named as the explanation names it
                    assert fmt_short(b.over_predicted) == fmt_short(-residual), (path.name, col)
                # At the phase's peak: the same figures as `info` gives its phase, when
                # `info` explains this very span.
                ex = info.get(pid)
                group = ex.phases.get((e.phase, e.first_step)) if ex else None
                if group is not None and group.step == e.step and b.allocated == e.measured:
                    assert [
                        (p.key, p.bytes) for p in group.parts if p.key not in ("cache", "context")
                    ] == [(p.key, p.bytes) for p in e.parts if p.key not in ("cache", "context")]
                    at_peak += 1
        if path.name.startswith("gpt-2.7b"):
            assert checked > 50 and at_peak >= 2, (checked, at_peak)
    finally:
        player.close()
