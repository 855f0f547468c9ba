"""A session of a 4-rank job on 4 GPUs, built from real protocol messages at fixed times.

Each rank runs ``STEPS`` steps of forward, backward, optimizer.step and eval on its own GPU
(its torch device ``rank``; torchrun shows every rank all four GPUs). Rank 0 holds
``EXTRA_EVAL`` more in eval (it evaluates alone); NVML's process list of GPU 0 lists rank
2's pid too (a context made before ``torch.cuda.set_device``).
"""

from __future__ import annotations

from store_data import GIB, MS, T0, Script, add_gpu, gpu_row

from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.session import Session

UUIDS = [f"GPU-{i:08x}-fa4e-4b1d-9c0a-{0xA100 + i:012x}" for i in range(4)]
PIDS = [5100, 5101, 5102, 5103]
STEPS = 3
EXTRA_EVAL = GIB
STRAY = 300 << 20  # what NVML says rank 2 holds on GPU 0
PHASES = (("forward", 6), ("backward", 7), ("optimizer.step", 8), ("eval", 4))
STEP_MS = 1000


def facts() -> dict:
    """A small GPT's facts: every rank predicts the same, so a rank's excess is unexplained."""
    return facts_from_shape(
        ModelShape(layers=4, hidden=512, heads=8, vocab=8000),
        batch=2,
        seq=256,
        precision="fp32",
        optimizer="adamw",
        impl="foreach",
        attention="sdpa",
    )


def build(
    *,
    steps: dict[int, int] | None = None,
    stray: bool = True,
    extra_eval: int = EXTRA_EVAL,
    session: Session | None = None,
    ranks: tuple[int, ...] = (0, 1, 2, 3),
    pids: list[int] | None = None,
    hostname: str = "node1",
    start: int = 0,
    cpu: bool = False,
) -> Session:
    """The job's session (``steps``: rank -> steps it ran, default :data:`STEPS` each;
    ``start``: ns after T0 at which it starts; ``cpu``: the ranks train on the CPU, whose
    phases carry no allocator figures)."""
    s = session or Session(t_origin=T0, wall_offset=1_700_000_000 * 10**9)
    s.live = False
    pids = pids or PIDS
    keys = [] if cpu else [add_gpu(s, uuid, i) for i, uuid in enumerate(UUIDS)]
    s.ensure_host(hostname, 64 * GIB)
    devices = [
        {"index": i, "uuid": u.removeprefix("GPU-"), "name": "H100", "total": 80 * GIB}
        for i, u in enumerate(UUIDS)
        if not cpu
    ]
    total_ms = STEPS * STEP_MS
    for rank in ranks:
        pid = pids[rank]
        script = Script(s, pid)
        script.send(
            "hello",
            T0 + start,
            argv=["train.py"],
            hostname=hostname,
            rank=rank,
            local_rank=rank,
            world_size=4,
            devices=devices,
        )
        # A read before torch.cuda.set_device names device 0: not what the rank works on.
        if not cpu:
            script.send("memory", T0 + start + MS // 2, dev=0, allocated=0, reserved=0)
        script.send("facts", T0 + start + MS, facts=facts())
        sid = 0
        for step in range((steps or {}).get(rank, STEPS)):
            for j, (name, gib) in enumerate(PHASES):
                peak = gib * GIB + (extra_eval if rank == 0 and name == "eval" else 0)
                t0 = T0 + start + (step * STEP_MS + 10 + j * 200) * MS
                sid += 1
                common = {"name": name, "id": sid, "depth": 0, "step": step}
                if cpu:
                    script.send("phase", t0, event="begin", **common)
                    script.send("phase", t0 + 150 * MS, event="end", **common)
                    continue
                common["dev"] = rank
                script.send("phase", t0, event="begin", allocated=GIB, reserved=2 * GIB, **common)
                script.send(
                    "phase",
                    t0 + 150 * MS,
                    event="end",
                    allocated=GIB,
                    reserved=peak + GIB,
                    peak_allocated=peak,
                    peak_reserved=peak + GIB,
                    **common,
                )
    for ms in range(0, total_ms + 1, 100):
        t = T0 + start + ms * MS
        for i, key in enumerate(keys):
            s.add_gpu_sample(key, gpu_row(t, (10 + i) * GIB))
            listed = [(pids[i], (10 + i) * GIB, 0)] if i in ranks else []
            if i == 0 and stray and 2 in ranks:
                listed.append((pids[2], STRAY, 0))
            s.add_gpu_processes(key, t, listed)
    return s
