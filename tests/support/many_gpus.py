"""A deterministic session of several GPUs for the overview's tests (issue 38).

Eight 80 GiB GPUs sampled at 10 Hz for four seconds, each with its own figures; an
instrumented ranked process on each even GPU (forward and backward phases, torch's
reserved and allocated from the boundaries), an uninstrumented process on each odd one
(NVML's list only), the host with CPU, load and swap; optionally GPU 1 in MIG mode with
three instances, each with its own memory. Built through the live entry points
(``add_device``, ``add_gpu_sample``, ``add_gpu_processes``, ``ingest``).
"""

from __future__ import annotations

from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key

GIB = 1024**3
MS = 10**6
END_MS = 4000


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-0000000000{i:02x}"


def mig_uuid(slot: int) -> str:
    return f"MIG-00000001-{slot:04x}-4000-8000-0000000000{slot:02x}"


def used_at(i: int, ms: int) -> int:
    """GPU ``i``'s NVML used bytes at ``ms``: its own level, rising by 1 GiB a second."""
    return int((8 + 7 * i) * GIB + ms * GIB // 1000)


def build(gpus: int = 8, *, mig: bool = False) -> Session:
    """The session; :data:`END_MS` is its newest time (ms)."""
    s = Session(t_origin=0, wall_offset=1_700_000_000 * 10**9)
    s.live = False
    keys = []
    for i in range(gpus):
        key = gpu_key(uuid(i))
        keys.append(key)
        s.add_device(
            Device(key, "gpu", index=i, name="NVIDIA H100 80GB HBM3", uuid=uuid(i), total=80 * GIB)
        )
    mig_keys = []
    if mig:
        for slot in range(3):
            key = gpu_key(mig_uuid(slot))
            mig_keys.append(key)
            s.add_device(
                Device(
                    key,
                    "gpu",
                    index=1,
                    name="NVIDIA H100 80GB HBM3 MIG 2g.20gb",
                    uuid=mig_uuid(slot),
                    total=20 * GIB,
                    extra={"mig_parent": keys[1], "mig_slot": slot},
                )
            )
    s.ensure_host("trainhost", 512 * GIB)
    for ms in range(0, END_MS + 1, 100):
        t = ms * MS
        for i, key in enumerate(keys):
            used = used_at(i, ms)
            s.add_gpu_sample(
                key,
                {
                    "t": t,
                    "used": used,
                    "free": 80 * GIB - used,
                    "total": 80 * GIB,
                    "util_gpu": 90.0 - 5 * i,
                    "util_mem": 40.0,
                    "temp": 50.0 + 3 * i,
                    "power": 300.0 + 40 * i,
                    "power_limit": 700.0,
                },
            )
        for slot, key in enumerate(mig_keys):
            used = (2 + 3 * slot) * GIB
            s.add_gpu_sample(
                key, {"t": t, "used": used, "free": 20 * GIB - used, "total": 20 * GIB}
            )
        s.add_host_sample(
            {
                "t": t,
                "total": 512 * GIB,
                "used": 100 * GIB + ms * MS,
                "available": 412 * GIB - ms * MS,
                "cpu": 20.0 + ms / 100,
                "load1": 6.5,
                "swap_used": 1 * GIB,
                "swap_total": 8 * GIB,
            }
        )
    for i, key in enumerate(keys):
        pid = 7000 + i
        s.add_gpu_processes(key, 50 * MS, [(pid, used_at(i, 0) - GIB, 0)])
        s.set_proc_info(
            pid,
            {"name": "python" if i % 2 == 0 else "jupyter", "user": "ana", "visible": True},
        )
        if i % 2 == 0:
            _train(s, pid, i, gpus)
    for slot, key in enumerate(mig_keys):
        s.add_gpu_processes(key, 50 * MS, [(7100 + slot, (2 + 3 * slot) * GIB - GIB // 2, 0)])
        s.set_proc_info(7100 + slot, {"name": "serve", "user": "bo", "visible": True})
    return s


def _train(s: Session, pid: int, i: int, world: int) -> None:
    """Rank ``i // 2``: 1 s steps of forward (0-600 ms) and backward (600-950 ms)."""
    seq = iter(range(1_000_000))

    def msg(kind: str, ms: int, **body: object) -> None:
        s.ingest(Message(kind=kind, pid=pid, seq=next(seq), t=ms * MS, body=body))

    msg(
        "hello",
        0,
        argv=["train.py"],
        rank=i // 2,
        world_size=(world + 1) // 2,
        torch="2.13.0",
        devices=[{"index": 0, "uuid": uuid(i)[4:], "name": "H100", "total": 80 * GIB}],
    )
    sid = iter(range(1, 1_000_000))
    for step in range(END_MS // 1000):
        for name, a, b in (("forward", 0, 600), ("backward", 600, 950)):
            n = next(sid)
            for event, ms in (("begin", step * 1000 + a), ("end", step * 1000 + b)):
                alloc = (4 + (2 if name == "backward" else 0)) * GIB  # every rank alike
                msg(
                    "phase",
                    ms,
                    event=event,
                    name=name,
                    id=n,
                    depth=0,
                    step=step,
                    dev=0,
                    allocated=alloc,
                    reserved=alloc + 2 * GIB,
                    peak_allocated=alloc,
                    peak_reserved=alloc + 2 * GIB,
                )
