"""Foresight: a phase not yet run forecast above what the GPU can give is warned about
before it runs, in the recording, with the shortfall and a change that fits; a run that fits
is not; a forecast further than 10% from the measured peak is marked when the phase runs.

The first two run a real torch training loop (on the CPU) against the real socket, the
real GPU sampler on the fake NVML (which lists the script as a compute process of a small
GPU) and the real recorder, and read the recording back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_for
from fake_nvml import FakeNvml, MiB, default_gpu

from gpuwatch import predict as pr
from gpuwatch.analysis.forecast import (
    HELD_PREFIX,
    OFF_PREFIX,
    WARN_PREFIX,
    Capacity,
    Foresight,
    foresight,
    make_forecast,
)
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key
from gpuwatch.sources.annotations import AnnotationReceiver
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.store import Recorder, open_recording, open_session

SCRIPT = str(ROOT / "tests" / "scripts" / "forecast_train.py")
GPU_TOTAL = 1024 * MiB
CONTEXT = 16 * MiB
"""What NVML says the script itself uses (its own memory that torch does not hold)."""


def _ready(fs: Foresight, pid: int) -> bool:
    """The process's first optimizer.step is forecast, on a known GPU, from known facts."""
    fc = fs.forecasts.get(pid)
    step = fc.get("optimizer.step", True) if fc is not None else None
    return bool(fc and fc.capacity and step is not None and not step.unknowns)


def run_watched(tmp_path: Path, sock_path: str, usable: int) -> tuple[Session, int, str]:
    """Run the training script under a live session whose GPU can give it ``usable``
    bytes; returns the recording read back, the script's pid and its output."""
    others = GPU_TOTAL - CONTEXT - usable
    fake = FakeNvml([default_gpu(0, total=GPU_TOTAL, used=others + CONTEXT, reserved=0)])
    fake.set_process(0, os.getpid(), others)  # another process on the GPU: this one
    session = Session()
    receiver = AnnotationReceiver(session, sock_path)
    receiver.bind()
    out = tmp_path / "run.gpuwatch"
    recorder = Recorder(session, out, interval=0.2)
    recorder.start()
    receiver.start()
    sampler = GpuSampler(session, interval=0.05, nvml=Nvml(fake), process_interval=0.05)
    assert sampler.start()
    fs = foresight(session, marks=True)
    fs.start()
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUWATCH_SOCKET": sock_path}
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--go", str(go)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        fake.set_process(0, proc.pid, CONTEXT)
        # The script waits before its first step until the forecast is made: a GPU's
        # backward is longer than the forecast takes, a tiny model's on the CPU is not.
        wait_for(lambda: _ready(fs, proc.pid), timeout=60)
        go.write_text("")
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        fs.stop()
        sampler.stop()
        receiver.stop()
        recorder.close()
    assert proc.returncode == 0, output
    rec = open_recording(out)
    try:
        loaded, loader = open_session(rec)
        loader.load_all()
    finally:
        rec.close()
    return loaded, proc.pid, output


def _first_step_t0(session: Session, pid: int) -> int:
    proc = session.processes[pid]
    cols = proc.phases.rows(proc.phases.first, len(proc.phases), ("t0", "name"))
    opt = session.find_name("optimizer.step")
    starts = [int(t) for t, n in zip(cols["t0"], cols["name"], strict=True) if n == opt]
    assert starts, "the script ran no optimizer.step"
    return min(starts)


@pytest.mark.torch
def test_a_first_step_that_will_not_fit_is_warned_about_before_it_begins(
    tmp_path: Path, sock_path: str
) -> None:
    # The model's AdamW first step (weights 8 + gradients 8 + state 16 + temporary 8 MiB)
    # needs 40 MiB; forward and backward before it need less than 30.
    session, pid, output = run_watched(tmp_path, sock_path, usable=30 * MiB)
    marks = [m for m in session.every_mark() if m.pid == pid and m.text.startswith(WARN_PREFIX)]
    step = [m for m in marks if m.text.startswith(f"{WARN_PREFIX}optimizer.step (first step)")]
    assert step, (marks, output)
    mark = step[0]
    assert mark.level == "warning"
    assert mark.t < _first_step_t0(session, pid)
    assert "more than GPU 0 can give (30.0 MiB)" in mark.text
    assert "AdamW state" in mark.text  # its largest category, as explanations name it
    assert "fits with --" in mark.text  # the planner's change that fits
    first = [m for m in marks if "(first step)" in m.text and m.text != mark.text]
    assert not [m for m in first if m.text.startswith(f"{WARN_PREFIX}forward")], first
    # gpuwatch info lists it, and what became of it (a CPU run: nothing measured the step).
    info = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "info", str(tmp_path / "run.gpuwatch")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    at = lines.index("forecasts (said before the phase ran)")
    said = [ln for ln in lines[at:] if "optimizer.step (first step) will need" in ln]
    assert said and said[0].startswith(f"  pid {pid} at "), lines[at:]
    after = lines[lines.index(said[0]) + 1]
    assert after == "    -> its phase ran without an error; no allocator measured its peak"


@pytest.mark.torch
def test_a_run_that_fits_is_not_warned_about(tmp_path: Path, sock_path: str) -> None:
    session, pid, output = run_watched(tmp_path, sock_path, usable=200 * MiB)
    warned = [m.text for m in session.every_mark() if m.text.startswith(WARN_PREFIX)]
    assert warned == [], output
    assert len(session.processes[pid].phases) > 0


# ---------------------------------------------------------------------- settled forecasts

PID = 4242
MS = 10**6
UUID = "GPU-5f1c0de0-0000-4000-8000-0000000000f0"
FACTS = facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32, precision="fp32")


def _session(total: int) -> tuple[Session, Any]:
    s = Session()
    s.live = False
    s.add_device(Device(gpu_key(UUID), "gpu", index=0, name="H100", uuid=UUID, total=total))
    seq = iter(range(10_000))

    def msg(kind: str, t: int, **body: Any) -> None:  # t: after the session's origin
        s.ingest(Message(kind=kind, pid=PID, seq=next(seq), t=s.t_origin + t, body=body))

    msg("hello", 0, argv=["train.py"],
        devices=[{"index": 0, "uuid": UUID[4:], "name": "H100", "total": total}])  # fmt: skip
    msg("facts", 1 * MS, facts=FACTS)
    return s, msg


def _run(msg: Any, measured: dict[str, int]) -> None:
    """One step, each phase's exact peak as given."""
    t = 10 * MS
    for sid, name in enumerate(("forward", "backward", "optimizer.step", "zero_grad"), 1):
        msg("phase", t, event="begin", name=name, id=sid, step=0, dev=0)
        t += 5 * MS
        msg("phase", t, event="end", name=name, id=sid, step=0, dev=0,
            peak_allocated=measured[name], peak_reserved=measured[name])  # fmt: skip
        t += MS


def _predicted() -> dict[str, int]:
    p = pr.predict(FACTS)
    return {name: pr.total(p.phases[name, True].peak) for name in pr.PHASES}


def test_a_forecast_off_by_more_than_a_tenth_is_marked_when_the_phase_runs() -> None:
    s, msg = _session(80 << 30)
    fs = Foresight(s)
    fs.update()
    assert fs.forecasts[PID].shortfalls == []
    measured = _predicted()
    measured["forward"] = int(measured["forward"] * 1.05)  # within a tenth: no mark
    measured["optimizer.step"] = measured["optimizer.step"] * 2  # forecast half of it
    _run(msg, measured)
    fs.update()
    texts = [m.text for m in s.every_mark()]
    off = [t for t in texts if t.startswith(OFF_PREFIX)]
    assert off == [t for t in off if "optimizer.step (first step) off by -50%" in t] != [], texts
    assert not [t for t in texts if "forward" in t]


def test_a_warned_phase_that_ran_as_forecast_is_said_to_have_held() -> None:
    predicted = _predicted()
    # A GPU whose allocator can have less than the first step needs (1 GiB is the
    # context assumed while NVML has not listed the process).
    s, msg = _session((1 << 30) + predicted["optimizer.step"] - (1 << 20))
    fs = Foresight(s)
    fs.update()
    short = [sf.forecast.key for sf in fs.forecasts[PID].shortfalls]
    assert ("optimizer.step", True) in short
    assert fs.warning() is not None and "optimizer.step (first step)" in (fs.warning() or "")
    _run(msg, predicted)
    fs.update()
    texts = [m.text for m in s.every_mark()]
    assert [t for t in texts if t.startswith(f"{HELD_PREFIX}optimizer.step (first step)")], texts
    assert ("optimizer.step", True) not in [sf.forecast.key for sf in fs.forecasts[PID].shortfalls]


def test_a_phase_resting_on_unknowns_is_said_not_warned_about() -> None:
    facts = {**FACTS, "optimizer": {"class": "Lion", "module": "lion_pytorch"}}
    prediction = pr.predict(facts)  # type: ignore[arg-type]
    # Every phase is above 1 byte: those the facts predict are warned about; the step of an
    # optimizer the rules do not know is said to rest on it instead.
    fc = make_forecast(1, 0, prediction, Capacity(1, 1 << 30, 0, 0, "GPU 0"))
    warned = {s.forecast.phase for s in fc.shortfalls}
    unsure = {p.phase: p.unknowns for p in fc.unsure}
    assert "forward" in warned and "optimizer.step" not in warned
    assert "optimizer" in " ".join(unsure["optimizer.step"])


def test_the_exporter_gives_each_phase_still_to_come_and_what_the_gpu_can_give() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwatch.analysis.oom_answer import RESERVE
    from gpuwatch.prometheus.exporter import SessionCollector

    predicted = _predicted()
    total = RESERVE + predicted["optimizer.step"] - (1 << 20)
    s, msg = _session(total)
    registry = CollectorRegistry()
    registry.register(SessionCollector(s, host="n1"))
    fs = foresight(s)  # what the live sources start: a scrape reads its forecasts

    def scrape() -> dict[tuple[str, str], float]:
        fs.update()
        out = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                if sample.name == "gpuwatch_forecast_peak_bytes":
                    out[sample.labels["phase"], sample.labels["first_step"]] = sample.value
                elif sample.name == "gpuwatch_forecast_usable_bytes":
                    assert sample.labels["pid"] == str(PID) and sample.labels["gpu"] == "0"
                    out["usable", ""] = sample.value
        return out

    before = scrape()
    assert before["optimizer.step", "true"] == predicted["optimizer.step"]
    assert before["usable", ""] == total - RESERVE < before["optimizer.step", "true"]
    assert ("forward", "false") in before
    _run(msg, predicted)
    after = scrape()
    assert ("optimizer.step", "true") not in after  # it has run: no longer to come
    assert ("forward", "false") in after


def test_outcomes_say_which_forecasts_came_true() -> None:
    from gpuwatch.analysis.forecast import outcomes
    from gpuwatch.analysis.oom_answer import RESERVE

    predicted = _predicted()
    s, msg = _session(RESERVE + predicted["optimizer.step"] - (1 << 20))
    fs = Foresight(s)
    fs.update()
    warned = {sf.forecast.key for sf in fs.forecasts[PID].shortfalls}
    assert {("optimizer.step", True), ("optimizer.step", False)} <= warned
    measured = dict(predicted)
    measured["backward"] = predicted["backward"] * 2  # off, and never warned about
    _run(msg, measured)
    msg("oom", 100 * MS, phase="optimizer.step", step=1, requested=1 << 20)
    fs.update()
    said = {o.text.split(" will need")[0].split(": ", 1)[-1]: o for o in outcomes(s)}
    first = said["optimizer.step (first step)"]
    assert first.came_true is True and first.outcome.startswith("came true: optimizer.step")
    later = said["optimizer.step (later steps)"]
    assert later.came_true is True and later.outcome.startswith("came true: out of memory in")
    off = [o for o in outcomes(s) if o.text.startswith(OFF_PREFIX)]
    assert [(o.came_true, o.outcome) for o in off] == [(False, "marked when its phase ran")]
    assert "backward (first step) off by +100%" not in off[0].text  # forecast half: -50%
    assert "backward (first step) off by -50%" in off[0].text
