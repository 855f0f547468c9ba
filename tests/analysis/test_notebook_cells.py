"""A notebook's cells as phases: each cell a depth-0 phase named ``[N] <first line>``, the
automatic phases nested inside it. The prediction follows the phases inside the cells,
each cell keeps its exact peak (Peaks, ``info``), and nothing about an unknown outer
phase trips the predictor, the explanations or a cursor inside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import run_cli

from gpuwatch import predict as pr
from gpuwatch.analysis.explain import explain_process, explain_span
from gpuwatch.analysis.moment import moment
from gpuwatch.analysis.predicted import predictions
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key
from gpuwatch.session.peaks import phase_peaks
from gpuwatch.store.writer import save_session

PID = 4343
MS = 10**6
MIB = 1 << 20
GIB = 1 << 30
UUID = "GPU-5f1c0de0-0000-4000-8000-00000000000c"
FACTS = facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32, precision="fp32")

# Each cell: its name, then (automatic phase or None for the cell's own work, ms, peak MiB).
CELLS: list[tuple[str, list[tuple[str | None, int, int]]]] = [
    ("[2] out = model(x)", [("forward", 10, 30)]),
    ("[3] big = torch.empty(256 << 20)", [(None, 5, 300)]),  # allocates outside any phase
    ("[4] loss = out.sum(); loss.backward()", [(None, 2, 31), ("backward", 10, 40)]),
    ("[5] opt.step(); opt.zero_grad()", [("optimizer.step", 5, 60), ("zero_grad", 1, 20)]),
    ("[6] print('done')", []),
]


def build() -> Session:
    s = Session()
    s.live = False
    key = gpu_key(UUID)
    s.add_device(Device(key, "gpu", index=0, name="H100", uuid=UUID, total=80 * GIB))
    seq = iter(range(10_000))
    ids = iter(range(1, 10_000))

    def msg(kind: str, t: int, **body: Any) -> None:
        s.ingest(Message(kind=kind, pid=PID, seq=next(seq), t=t, body=body))

    def boundary(t: int, event: str, name: str, sid: int, depth: int, peak: int, **kw: Any) -> None:
        figures = {"allocated": MIB, "reserved": GIB, "peak_reserved": GIB}
        msg("phase", t, event=event, name=name, id=sid, depth=depth, step=0, dev=0,
            peak_allocated=peak * MIB, **figures, **kw)  # fmt: skip

    msg("hello", 0, argv=["ipykernel_launcher.py"], notebook="/w/train.ipynb",
        devices=[{"index": 0, "uuid": UUID[4:], "name": "H100", "total": 80 * GIB}])  # fmt: skip
    msg("facts", MS, facts=FACTS)
    t = 10 * MS
    for cell, inner in CELLS:
        cid = next(ids)
        boundary(t, "begin", cell, cid, 0, 1)
        carry = 1  # the cell's own work: its peak shows at its next boundary
        for name, ms, peak in inner:
            t += ms * MS
            if name is None:
                carry = peak
                continue
            sid = next(ids)
            boundary(t - ms * MS, "begin", name, sid, 1, carry, parent=cid)
            boundary(t, "end", name, sid, 1, peak)
            carry = 1
        t += MS
        boundary(t, "end", cell, cid, 0, carry)
        t += 1000 * MS  # the user reads between cells
    return s


def test_the_prediction_follows_the_phases_inside_the_cells() -> None:
    s = build()
    proc = s.processes[PID]
    line = predictions(s).line(proc)
    assert line is not None and line.prediction is not None
    peaks = line.span_peaks(0, 2**62)
    spans = pr.spans_from_columns(proc.phases.snapshot(), s.names)
    want = pr.span_peaks(pr.predict(FACTS), spans)  # the cells are not known phases
    known = {k: v for k, v in peaks.items() if not k[0].startswith("[")}
    assert list(known.values()) == want
    # Each cell that ran a modelled phase is predicted as the highest of them (Peaks' row,
    # the bar at a cursor in it): the curve's highest point inside the cell.
    for sp in spans:
        if not sp.name.startswith("["):
            continue
        inner = [p for p in want if sp.t0 <= p.span.t0 and p.span.t1 <= sp.t1]
        got = peaks.get((sp.name, sp.t0, sp.t1))
        if not inner:
            assert got is None, sp.name
        else:
            assert got == max(inner, key=lambda p: pr.total(p.peak)), sp.name
    # So Peaks' row of the step cell explains its 60 MiB as the optimizer step's.
    step_cell = next(k for k in peaks if k[0].startswith("[5]"))
    e = explain_span(line.prediction, peaks[step_cell], 60 * MIB)
    assert e.phase == "optimizer.step" and e.measured == 60 * MIB
    assert "optimizer_state" in {part.key for part in e.parts}
    t, v = line.points(0, 2**62)
    assert len(t) and (v > 0).all()
    lo, hi = line.window(0, 6000 * MS, 120)
    drawn = hi == hi  # NaN where no phase ran
    assert drawn.any() and (lo[drawn] > 0).all() and (hi[drawn] >= lo[drawn]).all()


def test_each_cell_keeps_its_exact_peak() -> None:
    s = build()
    proc = s.processes[PID]
    cells = {p.name: p for p in phase_peaks(s, proc, gpu_key(UUID))}
    assert set(cells) == {name for name, _ in CELLS}  # Peaks lists the cells (depth 0)
    for name, inner in CELLS:
        want = max([peak for _, _, peak in inner] + [1]) * MIB
        assert cells[name].peak_alloc == want, name
    # The phases inside still have theirs.
    inside = {p.name: p.peak_alloc for p in phase_peaks(s, proc, gpu_key(UUID), depth=1)}
    assert inside["backward"] == 40 * MIB and inside["optimizer.step"] == 60 * MIB


def test_the_phases_inside_are_explained_and_a_cursor_anywhere_reads() -> None:
    s = build()
    proc = s.processes[PID]
    ex = explain_process(s, proc)
    assert ex is not None
    assert {name for name, _ in ex.phases} == {"forward", "backward", "optimizer.step", "zero_grad"}
    assert ex.phases["optimizer.step", True].measured == 60 * MIB
    registry = predictions(s)
    registry.update()
    key = gpu_key(UUID)
    for row in proc.phases.snapshot()["t0"].tolist():
        for at in (row, row + MS // 2):
            m = moment(s, key, at, registry, with_breakdown=True)
            assert m.breakdown is not None
    backward = next(p for p in phase_peaks(s, proc, key, depth=1) if p.name == "backward")
    m = moment(s, key, (backward.t0 + backward.t1) // 2, registry)
    assert m.explained[PID].phase == "backward" and m.explained[PID].measured == 40 * MIB


def test_info_lists_the_cells_with_their_peaks(tmp_path: Path) -> None:
    path = save_session(build(), tmp_path / "nb.gpuwatch")
    result = run_cli("info", "--json", str(path))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    (proc,) = info["processes"]
    assert proc["label"] == "train.ipynb"
    for name, inner in CELLS:
        assert proc["phases"][name] == 1
        want = max([peak for _, _, peak in inner] + [1]) * MIB
        assert info["phases"][name]["peak_allocated"] == want, name
    assert set(proc["predicted"]) == {"forward", "backward", "optimizer.step", "zero_grad"}
    text = run_cli("info", str(path))
    assert text.returncode == 0
    for name, _ in CELLS:  # each cell named whole in the phases table
        assert f"  {name} " in text.stdout, name
