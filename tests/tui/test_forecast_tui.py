"""The dashboard's forecast: a line on a GPU panel's chart at the highest forecast peak of
the training-step phases still to come, and a status-line warning (``!`` first: it shows
without colour) while a phase still to come will not fit, gone once that phase has run."""

from __future__ import annotations

import time
from typing import Any

from gpuwatch import predict as pr
from gpuwatch.analysis.forecast import foresight
from gpuwatch.analysis.oom_answer import RESERVE
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key
from gpuwatch.tui.forecast_parts import ForecastParts
from gpuwatch.tui.panel import DevicePanel

PID = 4242
MS = 10**6
UUID = "GPU-5f1c0de0-0000-4000-8000-0000000000f1"
FACTS = facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32, precision="fp32")
PREDICTION = pr.predict(FACTS)
FIRST_STEP = pr.total(PREDICTION.phases["optimizer.step", True].peak)


def _session() -> tuple[Session, Any]:
    """A GPU whose allocator can have 1 MiB less than the first optimizer step needs."""
    total = RESERVE + FIRST_STEP - (1 << 20)
    s = Session()
    s.live = False
    key = gpu_key(UUID)
    s.add_device(Device(key, "gpu", index=0, name="H100", uuid=UUID, total=total))
    seq = iter(range(10_000))

    def msg(kind: str, t: int, **body: Any) -> None:
        s.ingest(Message(kind=kind, pid=PID, seq=next(seq), t=s.t_origin + t, body=body))

    msg("hello", 0, argv=["train.py"],
        devices=[{"index": 0, "uuid": UUID[4:], "name": "H100", "total": total}])  # fmt: skip
    msg("facts", 1 * MS, facts=FACTS)
    return s, msg


def _steps(msg: Any, steps: int) -> None:
    t, sid = 10 * MS, 0
    for step in range(steps):
        for name in ("forward", "backward", "optimizer.step", "zero_grad", "eval"):
            sid += 1
            msg("phase", t, event="begin", name=name, id=sid, step=step, dev=0)
            t += 5 * MS
            msg("phase", t, event="end", name=name, id=sid, step=step, dev=0)
            t += MS


def test_the_status_line_warns_until_the_phase_has_run() -> None:
    s, msg = _session()
    fs = foresight(s)
    assert ForecastParts(s)((0, 1)) == []  # nothing forecast yet
    fs.update()
    (part,) = ForecastParts(s)((0, 1))
    assert isinstance(part.text, str)
    assert part.text.startswith("[$warning]! forecast: optimizer.step (")
    assert part.text.endswith(" short[/]") and part.keep is None  # never gives way
    _steps(msg, 2)  # every phase of a first and a later step has run, eval too
    fs.update()
    assert ForecastParts(s)((0, 1)) == []


def test_the_chart_draws_the_highest_peak_still_to_come() -> None:
    s, msg = _session()
    fs = foresight(s)
    fs.update()
    panel = DevicePanel(s, gpu_key(UUID))
    frame = panel._fetch_chart(s.t_origin, s.t_origin + 100 * MS, 40)
    (line,) = [x for x in frame.series if x.role == "forecast"]
    ahead = {
        p.phase: p.peak
        for p in fs.forecasts[PID].ahead()
        if p.phase in ("forward", "backward", "optimizer.step")
    }
    assert (line.lo == line.hi).all() and line.hi[0] == max(ahead.values()) >= FIRST_STEP
    _steps(msg, 2)
    fs.update()
    frame = panel._fetch_chart(s.t_origin, s.t_origin + 100 * MS, 40)
    assert [x for x in frame.series if x.role == "forecast"] == []  # nothing left to come


async def test_the_dashboard_says_it_in_the_status_line_until_the_phase_has_run() -> None:
    from conftest import until

    from gpuwatch.tui.app import GpuwatchApp

    s, msg = _session()
    fs = foresight(s)
    fs.update()
    start = time.monotonic_ns()  # a live clock: the status line is asked at each frame
    app = GpuwatchApp(s, clock=lambda: s.t_origin + 200 * MS + time.monotonic_ns() - start)
    async with app.run_test(size=(160, 40)) as pilot:
        bar = app.dashboard.status_bar
        assert await until(pilot, lambda: "! forecast: optimizer.step (" in bar.text), bar.text
        assert " short" in bar.text
        _steps(msg, 2)
        fs.update()
        assert await until(pilot, lambda: "forecast" not in bar.text), bar.text
