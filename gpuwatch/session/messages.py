"""What each kind of message from an instrumented process does to a session.

:meth:`~gpuwatch.session.Session.ingest` validates nothing and looks up nothing but the
process: it calls the handler of :data:`HANDLERS` for the message's kind, under the
session's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .model import Device, Mark, Oom, OpenSpan, PhaseRow, gpu_key, norm_uuid
from .process import Process, add_facts
from .table import MISSING_INT

if TYPE_CHECKING:
    from ..protocol import Message
    from .retention import Retention

MAX_TORCH_DEVICES = 64
"""Most GPUs a session shows that only instrumented processes name (NVML lists none of
them): enough for every MIG instance of an 8-GPU host, and a bound on what hellos create."""


class Model(Protocol):
    """What the handlers change of a session (:class:`~gpuwatch.session.Session`)."""

    devices: dict[str, Device]
    marks: list[Mark]
    ooms: list[Oom]
    retention: Retention
    _ranked: dict[int, Process]
    _hello_parts: dict[Any, Any]

    def name_id(self, name: str) -> int:
        """Intern a phase name."""

    def add_device(self, device: Device) -> Device:
        """Register a device."""

    def note(self, text: str) -> None:
        """A one-line notice."""


def opt(v: int | None) -> int:
    """``v``, or :data:`MISSING_INT` for None (the tables' integer columns hold no None)."""
    return MISSING_INT if v is None else v


def _on_hello(session: Model, proc: Process, msg: Message) -> None:
    proc.hello = _shared_hello(session, {**proc.hello, **msg.body})
    if proc.hello.get("rank") is not None:
        session._ranked[proc.pid] = proc
    else:
        session._ranked.pop(proc.pid, None)
    facts = msg.body.get("facts")
    if facts:
        add_facts(proc, facts, msg.t)
    for d in msg.body.get("devices") or ():
        key = _device_for(session, d)
        if key is not None:
            proc.devices[d["index"]] = key


def _shared_hello(session: Model, hello: dict[str, Any]) -> dict[str, Any]:
    """``hello`` with its keys and its equal values shared with earlier hellos' (treat
    them as read-only): a sweep of thousands of scripts keeps one copy of their argv,
    host and versions, not one each."""
    parts = session._hello_parts
    if len(parts) >= 1024:  # a bound, not a history (of short parts): start again
        parts.clear()
    out = {}
    for k, v in hello.items():
        if type(k) is str and len(k) <= 64:
            k = parts.setdefault(k, k)
        if type(v) is str and len(v) <= 256:
            v = parts.setdefault(v, v)
        elif type(v) is list and _short_strings(v):
            v = parts.setdefault(("list", *v), v)
        out[k] = v
    return out


def _short_strings(v: list[Any]) -> bool:
    """A short list of short strings (an argv): worth sharing, cheap to keep."""
    return len(v) <= 64 and all(type(a) is str for a in v) and sum(map(len, v)) <= 1024


def _device_for(session: Model, d: dict[str, Any]) -> str | None:
    """Map a torch device (from a hello) to a session device, by UUID.

    Returns None for a device NVML does not list once :data:`MAX_TORCH_DEVICES` such
    devices exist: hellos are a process's word, and one process must not be able to
    fill the dashboard with made-up GPUs.
    """
    uuid = norm_uuid(d.get("uuid"))
    key = gpu_key(uuid) if uuid else f"gpu:torch{d['index']}"
    if key not in session.devices:
        torch_only = sum(1 for dev in session.devices.values() if dev.source == "torch")
        if torch_only >= MAX_TORCH_DEVICES:
            session.note(
                f"ignoring GPUs beyond {MAX_TORCH_DEVICES} that NVML does not list "
                "(named only by instrumented processes)"
            )
            return None
    if uuid:
        if key not in session.devices:
            # NVML has not (or cannot) see it: show it from torch's figures alone.
            session.add_device(
                Device(
                    key,
                    "gpu",
                    index=None,
                    name=d.get("name", ""),
                    uuid=uuid,
                    total=d.get("total"),
                    source="torch",
                )
            )
        return key
    if key not in session.devices:
        session.add_device(
            Device(
                key,
                "gpu",
                name=d.get("name", ""),
                total=d.get("total"),
                source="torch",
                note="no UUID from torch",
            )
        )
    return key


def _on_facts(session: Model, proc: Process, msg: Message) -> None:
    add_facts(proc, msg.body["facts"], msg.t)


def _figures(proc: Process, msg: Message) -> None:
    b = msg.body
    if b.get("allocated") is None or b.get("reserved") is None:
        return
    dev = opt(b.get("dev"))
    proc.torch_devs.add(dev)
    figures = (
        b["allocated"],
        b["reserved"],
        opt(b.get("inactive_split")),
        opt(b.get("alloc_retries")),
        opt(b.get("alloc_ooms")),
    )
    proc.torch.append((msg.t, dev, *figures))
    last = proc.tally.torch
    last.pop(dev, None)  # re-inserted: the newest device last
    last[dev] = figures


def _on_memory(session: Model, proc: Process, msg: Message) -> None:
    _figures(proc, msg)


def _on_phase(session: Model, proc: Process, msg: Message) -> None:
    b = msg.body
    book = proc.book
    assert book is not None  # ingest thawed a compacted process first
    _figures(proc, msg)
    # The peaks a boundary reports cover the time since the previous boundary, which
    # lay inside every span open until now (the ending one included).
    pa, pr = b.get("peak_allocated"), b.get("peak_reserved")
    if pa is not None or pr is not None:
        start = proc.last_boundary if proc.last_boundary is not None else msg.t
        proc.peaks.append((msg.t, start, opt(b.get("dev")), opt(pa), opt(pr)))
        proc.max_segment = max(proc.max_segment, msg.t - start)
        book.peaks(pa, pr, len(proc.open))  # O(log open), not a loop over them
        # Only a boundary that read and reset the peak counters starts a new interval:
        # one that shared the previous read (the same instant) reports no peaks.
        proc.last_boundary = msg.t
    if b["event"] == "begin":
        span = OpenSpan(
            id=b["id"],
            name=b["name"],
            t0=msg.t,
            step=b.get("step"),
            depth=b.get("depth", 0),
            parent=b.get("parent"),
            dev=b.get("dev"),
            alloc0=b.get("allocated"),
            reserved0=b.get("reserved"),
        )
        proc.abandoned += book.begin(proc.open, span)
        return
    ended = book.end(proc.open, b["id"])
    if ended is None:  # its begin was lost, predates this dashboard, or was abandoned
        return
    span = ended
    proc.max_span = max(proc.max_span, msg.t - span.t0)
    row = PhaseRow(
        t1=msg.t,
        t0=span.t0,
        name=session.name_id(span.name),
        step=opt(span.step),
        depth=span.depth,
        id=span.id,
        parent=opt(span.parent),
        dev=opt(b.get("dev", span.dev)),
        alloc0=opt(span.alloc0),
        reserved0=opt(span.reserved0),
        alloc1=opt(b.get("allocated")),
        reserved1=opt(b.get("reserved")),
        peak_alloc=opt(span.peak_alloc),
        peak_reserved=opt(span.peak_reserved),
        error=1 if b.get("error") else 0,
    )
    proc.phases.append(row)
    tally = proc.tally
    tally.count[row.name] += 1
    tally.ns[row.name] += row.t1 - row.t0
    if row.step != MISSING_INT:
        tally.step = row.step
    if row.dev != MISSING_INT:
        tally.dev = row.dev
    if row.peak_alloc != MISSING_INT:
        tally.peaks[row.name] = (row.t1, row.peak_alloc, row.peak_reserved, row.dev)


def _on_mark(session: Model, proc: Process, msg: Message) -> None:
    b = msg.body
    session.marks.append(Mark(msg.t, proc.pid, b["text"], b.get("level", "info"), b.get("step")))
    session.retention.let_marks_go()


def _on_oom(session: Model, proc: Process, msg: Message) -> None:
    session.ooms.append(Oom(msg.t, proc.pid, dict(msg.body)))
    _figures(proc, msg)


def _on_stats(session: Model, proc: Process, msg: Message) -> None:
    """The sender's counts: only the common ``dropped``, already taken in ``ingest``."""


def _on_bye(session: Model, proc: Process, msg: Message) -> None:
    proc.ended = msg.t
    session.retention.ended(proc)
    code = msg.body.get("exit_code")
    if code is not None or proc.exit_code is None:  # the launcher's word may be here
        proc.exit_code = code


HANDLERS: dict[str, Callable[[Model, Process, Message], None]] = {
    "hello": _on_hello,
    "facts": _on_facts,
    "memory": _on_memory,
    "phase": _on_phase,
    "mark": _on_mark,
    "oom": _on_oom,
    "stats": _on_stats,
    "bye": _on_bye,
}
"""What :meth:`Session.ingest` does with each kind of message (every kind of
:data:`~gpuwatch.protocol.KINDS`: a test checks both lists name the same kinds)."""
