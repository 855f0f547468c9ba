"""A deterministic session for dashboard tests: one GPU, the host, one training process.

Built through the same entry points the live sources use (``add_device``,
``add_gpu_sample``, ``ingest`` of protocol messages), at fixed times, so snapshots and
assertions do not depend on the clock. Each step has an optimizer.step spike that lasts
10 ms, between two NVML polls 100 ms apart, which only the reported peaks reveal.
"""

from __future__ import annotations

from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key

GIB = 1024**3
MS = 10**6
UUID = "GPU-5f1c0de0-0000-4000-8000-000000000001"
PID = 4242
WALL_OFFSET = 1_700_000_000 * 10**9

# Per step (ms offsets within a 1 s step) and memory figures in GiB.
PHASES = (
    ("data", 0, 60),
    ("forward", 60, 360),
    ("backward", 360, 700),
    ("optimizer.step", 700, 800),
    ("zero_grad", 800, 820),
)
WEIGHTS = 10.0
GRADS = 10.0
ACTS = 14.0
OPT_STATE = 20.0
TEMP = 10.0  # foreach temporaries inside optimizer.step: the spike
CONTEXT = 2.5  # CUDA context, NCCL buffers and other memory outside torch


def allocated_at(step: int, ms: float) -> float:
    """The true allocated GiB at ``ms`` into ``step`` (what the synthetic script 'does')."""
    state = OPT_STATE if step > 0 or ms >= 700 else 0.0
    base = WEIGHTS + state
    if ms < 60:
        return base
    if ms < 360:
        return base + ACTS * (ms - 60) / 300
    if ms < 700:
        frac = (ms - 360) / 340
        return base + ACTS * (1 - frac) + GRADS * frac
    if ms < 800:
        # The spike: temporaries for 10 ms in the middle of optimizer.step.
        return base + GRADS + (TEMP if 740 <= ms < 750 else 0.0)
    if ms < 820:
        return base + GRADS
    return base


def build(
    steps: int = 6,
    *,
    with_process: bool = True,
    with_facts: bool = True,
    t_origin: int = 0,
    wall_offset: int = WALL_OFFSET,
) -> Session:
    """A session of ``steps`` one-second training steps on one 80 GiB GPU.

    ``t_origin`` moves the whole session on its monotonic clock (another host's clock);
    ``wall_offset`` is that clock's distance to wall time.
    """
    s = Session(t_origin=t_origin, wall_offset=wall_offset)
    s.live = False
    key = gpu_key(UUID)
    s.add_device(
        Device(
            key,
            "gpu",
            index=0,
            name="NVIDIA H100 80GB HBM3",
            uuid=UUID,
            bus_id="00000000:1B:00.0",
            total=80 * GIB,
        )
    )
    s.ensure_host("testhost", 64 * GIB)
    seq = iter(range(1_000_000))

    def msg(kind: str, t: int, **body: object) -> None:
        s.ingest(Message(kind=kind, pid=PID, seq=next(seq), t=t_origin + t, body=body))

    # The true timeline at 1 ms: allocated, and reserved = the caching allocator's
    # high-water mark plus 1 GiB of fragmentation (it keeps what it once reserved).
    end_ms = steps * 1000
    alloc_ms = [
        allocated_at(min(ms // 1000, steps - 1), ms % 1000 if ms < end_ms else 999)
        for ms in range(end_ms + 1)
    ]
    reserved_ms = []
    high = 0.0
    for a in alloc_ms:
        high = max(high, a + 1.0)
        reserved_ms.append(high)
    for ms in range(0, end_ms + 1, 100):  # NVML at 10 Hz sees reserved + the context
        used = reserved_ms[ms] + CONTEXT
        s.add_gpu_sample(
            key,
            {
                "t": t_origin + ms * MS,
                "used": int(used * GIB),
                "free": int((80 - used) * GIB),
                "total": 80 * GIB,
                "reserved": 0,
                "util_gpu": 97.0,
                "util_mem": 60.0,
                "temp": 65.0,
                "power": 512.0,
                "power_limit": 700.0,
                "clock_sm": 1980.0,
                "clock_mem": 2619.0,
            },
        )
        s.add_host_sample(
            {
                "t": t_origin + ms * MS,
                "total": 64 * GIB,
                "used": int(12 * GIB + ms * 1000),
                "available": int(50 * GIB),
            }
        )
    s.sampler_rate[key] = 10.0
    if not with_process:
        return s
    msg(
        "hello",
        0,
        argv=["train.py", "--steps", str(steps)],
        rank=0,
        world_size=1,
        torch="2.13.0",
        devices=[{"index": 0, "uuid": UUID[4:], "name": "H100", "total": 80 * GIB}],
    )
    if with_facts:
        # A 2.7B-parameter GPT in fp32 with foreach AdamW, batch 3 x 1024: about the sizes
        # above, so the breakdown bar has every category and a small unexplained part.
        shape = ModelShape(layers=32, hidden=2560, heads=32, vocab=50257)
        msg(
            "facts",
            1 * MS,
            facts=facts_from_shape(
                shape,
                batch=3,
                seq=1024,
                precision="fp32",
                optimizer="adamw",
                impl="foreach",
                attention="sdpa",
            ),
        )
    span = iter(range(1, 1_000_000))
    for step in range(steps):
        for name, a, b in PHASES:
            sid = next(span)
            t0, t1 = step * 1000 + a, step * 1000 + b
            peak = max(alloc_ms[t0:t1])
            for event, t, figures in (
                ("begin", t0, (alloc_ms[t0], reserved_ms[t0], alloc_ms[t0])),
                ("end", t1, (alloc_ms[t1], reserved_ms[t1], peak)),
            ):
                alloc, reserved, peak_here = figures
                msg(
                    "phase",
                    t * MS,
                    event=event,
                    name=name,
                    id=sid,
                    depth=0,
                    step=step,
                    dev=0,
                    allocated=int(alloc * GIB),
                    reserved=int(reserved * GIB),
                    peak_allocated=int(peak_here * GIB),
                    peak_reserved=int(reserved * GIB),
                )
        if step == 2:
            msg("mark", (step * 1000 + 900) * MS, text="checkpoint saved", level="info")
    msg(
        "oom",
        (steps * 1000 - 50) * MS,
        requested=12 * GIB,
        free=1 * GIB,
        total=80 * GIB,
        phase="forward",
        step=steps - 1,
        message="CUDA out of memory. Tried to allocate 12 GiB",
    )
    s.add_rss(PID, t_origin + 100 * MS, 3 * GIB)
    return s


def end_time(steps: int = 6) -> int:
    """The newest time in :func:`build`'s session."""
    return steps * 1000 * MS
