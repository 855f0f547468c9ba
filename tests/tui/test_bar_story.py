"""Issue 51, item 6: one story between boundaries, in the real replay app under Pilot.

Wherever the cursor is inside a later step's phase of the AdamW spike sample, the bar's
model state (weights, gradients, AdamW state) is what `info` and the Peaks tab say of the
phase; what moves between the boundaries is named as what it is: the phase's temporaries
and activations above the cursor (▲), and the cache they come from (the bar's cache less
▲ is the cache `info` gives at the peak). On main the bar said ``optim 14.9G`` in step 3's
backward, with ``▲phase peak +7.1G: optim 6.5G``, where `info` says AdamW state 21.42 GiB.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import ROOT

from gpuwatch.analysis.explain import explain_process
from gpuwatch.fmt import fmt_short
from gpuwatch.store.player import open_replay
from gpuwatch.tui.replay import replay_app

SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"
PHASES = ("forward", "backward", "optimizer.step", "zero_grad")
STATE = ("weights", "gradients", "optimizer_state")


@pytest.fixture
def app():
    player = open_replay(SPIKE)
    player.loader.load_all()
    try:
        yield replay_app(player, theme_name="gpuwatch-dark", subtitle="replay")
    finally:
        player.close()


def _spans(app, step: int) -> list[tuple[str, int, int]]:
    s = app.session
    (proc,) = s.processes.values()
    cols = proc.phases.snapshot()
    out = []
    for i, n in enumerate(cols["name"]):
        name = s.names[int(n)]
        if name in PHASES and int(cols["step"][i]) == step:
            out.append((name, int(cols["t0"][i]), int(cols["t1"][i])))
    return out


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_the_state_is_the_peaks_figure_wherever_the_cursor_is(app, size) -> None:
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        s = app.session
        (proc,) = s.processes.values()
        info = explain_process(s, proc)  # what `info` prints and the Peaks tab shows
        assert info is not None
        panel = next(p for p in app.query("DevicePanel") if p.bar is not None)
        checked = 0
        for name, t0, t1 in _spans(app, 3):
            told = info.phases[(name, False)]
            cache_at_peak = next(p.bytes for p in told.parts if p.key == "cache")
            for share in (0.1, 0.3, 0.5, 0.7, 0.9):
                app.view = replace(app.view, cursor=t0 + int((t1 - t0) * share))
                await pilot.pause()
                data = panel.bar.data
                assert data is not None and data.removed is not None, (name, share)
                parts = dict(data.parts())
                for k in STATE:  # the model's state: the phase's own figure, whole
                    said = (name, share, k)
                    assert fmt_short(parts.get(k, 0)) == fmt_short(told.categories.get(k, 0)), said
                    assert k not in data.removed, said
                # What moves: the cache the phase's peak takes its temporaries from.
                cache = parts.get("cache", 0) + parts.get("fragmented", 0)
                assert fmt_short(cache - data.headroom) == fmt_short(cache_at_peak), (name, share)
                legend = str(panel.bar.render()).split("\n")[1]
                if name == "backward":
                    assert "optim 21.4G" in legend and "optim 14.9G" not in legend, legend
                checked += 1
        assert checked == 5 * len(PHASES)
