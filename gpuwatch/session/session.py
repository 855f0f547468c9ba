"""The in-memory truth of one session: devices, samples, processes, phases, marks.

Sources call the ``add_*`` methods and :meth:`Session.ingest` from their own threads; the
dashboard reads with the query methods. Every change bumps :attr:`Session.version` and is
passed to subscribers (the recorder), so the session is the single place facts flow through.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from ..protocol import Message
from .filed import FiledTable
from .model import (
    GPU_COLUMNS,
    GPU_PROC_COLUMNS,
    HOST,
    HOST_COLUMNS,
    Device,
    GpuProcRow,
    Mark,
    Oom,
    OpenSpan,
    PhaseRow,
    gpu_key,
    norm_uuid,
)
from .process import PROCESS_TABLES, Process, compact, count_sequence, thaw
from .table import MISSING_INT, Table

Listener = Callable[[str, tuple[Any, ...]], None]
TableHook = Callable[[str, str, Table], None]

KEEP_ROWS = 16_384
"""Rows of each table a live session keeps in memory (see :meth:`Session.bound`)."""

SILENT_END = 500 * 10**6
"""How long a replayed process that never said goodbye is taken to run after its last
message: a script sends its allocator figures every 50 ms, so a recording stopped while it
ran keeps it to its end, and one killed is gone half a second later."""

KEEP_ENDED = 64
"""Ended processes whose rows an unrecorded bounded session keeps (the newest)."""

KEEP_MARKS = 1024
"""Marks a bounded session keeps in memory (twice that between trims): the newest."""


class MarkSource(Protocol):
    """Where the marks a session let go of are read back from (its recording)."""

    def between(self, t0: int, t1: int, limit: int = ...) -> list[Mark]:
        """Marks timed within ``[t0, t1]``, the first ``limit`` in time."""

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        """Every mark's time and pid."""

    def every(self) -> Iterator[Mark]:
        """Every mark, in the order written."""


MAX_TORCH_DEVICES = 64
"""Most GPUs a session shows that only instrumented processes name (NVML lists none of
them): enough for every MIG instance of an 8-GPU host, and a bound on what hellos create."""


def _opt(v: int | None) -> int:
    return MISSING_INT if v is None else v


class Session:
    """Everything known about one live or replayed session.

    Args:
        t_origin: ``time.monotonic_ns()`` at the start (time zero on the axis).
        wall_offset: ``time.time_ns() - time.monotonic_ns()`` on the recording host.
    """

    def __init__(self, t_origin: int | None = None, wall_offset: int | None = None) -> None:
        self.t_origin = time.monotonic_ns() if t_origin is None else t_origin
        self.wall_offset = (
            time.time_ns() - time.monotonic_ns() if wall_offset is None else wall_offset
        )
        self.devices: dict[str, Device] = {}
        self.gpu: dict[str, Table] = {}
        self.gpu_procs: dict[str, Table] = {}
        self.keep_rows: int | None = None  # rows each table keeps in memory (see bound)
        self._event_index: dict[str, tuple[Any, ...]] = {}  # see events_between
        self._table_hooks: list[TableHook] = []
        # Host memory by host device key: one host live, several in a merged replay.
        self.hosts: dict[str, Table] = {HOST: Table(HOST_COLUMNS, kind="host")}
        self.processes: dict[int, Process] = {}
        # Those not known to have ended, in a superset pruned as they are looked at (see
        # running): per-tick work follows what runs, not every process ever seen.
        self._running: dict[int, Process] = {}
        self._ranked: dict[int, Process] = {}  # live: those whose hello names a rank
        self.proc_info: dict[int, dict[str, Any]] = {}  # pid -> name/user/cmdline/visible
        self._infos: dict[str, dict[str, Any]] = {}  # equal descriptions, shared
        self._hello_parts: dict[Any, Any] = {}  # equal parts of hellos, shared
        self._ended_pids: dict[int, None] = {}  # unrecorded: the newest ended, in order
        self._let_ended_go = False
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        # The newest marks; a bounded session lets older ones go (see _let_marks_go).
        self.marks: list[Mark] = []
        self.marks_gone = 0  # marks let go of, the oldest: the recording holds them
        # Marks before this (absolute) index are in the recording, or were let go before
        # it began; memory lets go only of those while marks_wait (a recording is written).
        self.marks_written = 0
        self.marks_wait = False
        self.mark_source: MarkSource | None = None  # reads the marks let go of back
        # Reads a settled process's series back: (kind, pid as text, rows, span) -> its
        # archive, or None (see settle); set by the recorder.
        self.reopen: Callable[[str, str, int, tuple[int, int] | None], Any] | None = None
        self._reopen_filed = self._reopen  # one bound method for every FiledTable
        self._gone_t_max: int | None = None  # the latest time of a mark let go of
        self.ooms: list[Oom] = []
        self.rejects: Counter[str] = Counter()
        self.notes: list[str] = []  # one-line notices (no driver, permission, ...)
        self.sampler_rate: dict[str, float] = {}  # achieved samples/s by source
        self.version = 0
        self._range: tuple[int, tuple[int, int]] | None = None  # (version, time_range())
        self._versions = itertools.count(1)  # next() is atomic: sources call from threads
        self.live = True
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []

    @property
    def host(self) -> Table:
        """This host's memory samples (the only host of a live session)."""
        return self.host_table(HOST)

    @host.setter
    def host(self, table: Table) -> None:
        self.hosts[HOST] = table

    def host_table(self, key: str = HOST) -> Table:
        """Memory samples of the host device ``key`` (empty if it has none)."""
        table = self.hosts.get(key)
        if table is None:
            table = self.hosts.setdefault(key, Table(HOST_COLUMNS, kind="host"))
            self._made("host", key, table)
        return table

    # ------------------------------------------------------------------ tables and memory

    def tables(self, skip: Container[int] = ()) -> list[tuple[str, str, Table]]:
        """Every table as ``(kind, key, table)``: kinds of the recording's series, keys
        the device key or the pid (as text); none of the processes in ``skip``."""
        out: list[tuple[str, str, Table]] = [("host", k, t) for k, t in list(self.hosts.items())]
        out += [("gpu", k, t) for k, t in list(self.gpu.items())]
        out += [("gpu_procs", k, t) for k, t in list(self.gpu_procs.items())]
        for pid, proc in list(self.processes.items()):
            if pid in skip:
                continue
            for kind in PROCESS_TABLES:
                table = getattr(proc, kind)
                if not isinstance(table, FiledTable):  # it holds nothing: the file has all
                    out.append((kind, str(pid), table))
        return out

    def process_gone(self, pid: int, t: int) -> None:
        """The process no longer exists (the host sampler's finding): once its rows are in
        the recording it keeps a summary only, as one that said bye does."""
        with self._lock:
            proc = self.processes.get(pid)
            if proc is None or proc.gone is not None:
                return
            proc.gone = t
            proc.rev += 1
            self._ended(proc)
        self._emit("gone", (pid, t))

    def settle(self, pid: int) -> None:
        """A process that ended, all of whose rows its recording holds: it keeps a summary
        only (its :class:`Tally`, state and open spans); its tables let go of their rows,
        read back from the file when a view reaches them. Where :attr:`reopen` can read
        them back, the tables themselves go too (a :class:`FiledTable` each, its size and
        time span)."""
        proc = self.processes.get(pid)
        if proc is None:
            return
        with self._lock:
            compact(proc)
            for kind in PROCESS_TABLES:
                table = getattr(proc, kind)
                if isinstance(table, FiledTable):
                    continue
                table.retain(0)
                if self.reopen is not None and table.in_memory == 0:
                    filed = FiledTable(proc, kind, len(table), table.span(), self._reopen_filed)
                    setattr(proc, kind, filed)

    def _reopen(self, proc: Process, kind: str) -> Table:
        """The real table of a settled process's :class:`FiledTable` (made once)."""
        with self._lock:
            current = getattr(proc, kind)
            if not isinstance(current, FiledTable):
                return current
            table = Table(PROCESS_TABLES[kind], 0, kind=kind)
            reopen = self.reopen
            archive = reopen(kind, str(proc.pid), len(current), current.span()) if reopen else None
            if archive is not None:
                table.resume(archive)
            table.retain(self.keep_rows)
            setattr(proc, kind, table)
            return table

    def _ended(self, proc: Process) -> None:
        """A process said bye or is gone. Recorded, it is settled once the file holds its
        rows (:meth:`settle`). Unrecorded and bounded, the newest :data:`KEEP_ENDED` that
        ended keep their rows; older ones keep their summary only (state and
        :class:`Tally`): their rows are nowhere to read back from."""
        if self.keep_rows is None or self.reopen is not None or self.mark_source is not None:
            return
        self._ended_pids[proc.pid] = None
        while len(self._ended_pids) > KEEP_ENDED:
            pid = next(iter(self._ended_pids))
            del self._ended_pids[pid]
            old = self.processes.get(pid)
            if old is None:
                continue
            compact(old)
            for kind in PROCESS_TABLES:
                table = getattr(old, kind)
                if not isinstance(table, FiledTable):
                    setattr(old, kind, FiledTable(old, kind, 0, None, self._reopen_filed))
            if not self._let_ended_go:
                self._let_ended_go = True
                self.note(
                    f"not recording: the rows of processes that ended before the newest "
                    f"{KEEP_ENDED} are let go (their counts remain); record to keep them"
                )

    def bound(self, rows: int | None = KEEP_ROWS) -> None:
        """Keep at most about ``rows`` rows of each table in memory (None: everything).

        A recorded session lets go of what its recording holds (reading it back when a
        view asks); an unrecorded one keeps summaries of what it let go (see
        :meth:`Table.retain`). Counters the exporter reports stay exact (:class:`Tally`).
        """
        self.keep_rows = rows
        for _, _, table in self.tables():
            table.retain(rows)

    def on_table(self, hook: TableHook) -> None:
        """Call ``hook(kind, key, table)`` for every table, now and as tables are made
        (the recorder attaches its archive before any row can leave memory)."""
        self._table_hooks.append(hook)
        for kind, key, table in self.tables():
            hook(kind, key, table)

    def _made(self, kind: str, key: str, table: Table) -> Table:
        for hook in self._table_hooks:
            hook(kind, key, table)
        table.retain(self.keep_rows)
        return table

    def _new_process(self, pid: int, **fields: Any) -> Process:
        proc = self.processes[pid] = self._running[pid] = Process(pid, **fields)
        for kind in PROCESS_TABLES:
            self._made(kind, str(pid), getattr(proc, kind))
        return proc

    def running(self) -> list[Process]:
        """Instrumented processes not known to have ended (no bye, not found gone): what
        the samplers look at each tick, whatever number ended before (issue 23). A replay
        (whose processes came from files) is looked at whole."""
        if not self.live:
            return [p for p in list(self.processes.values()) if p.ended is None and p.gone is None]
        out = []
        running = self._running
        for pid, proc in list(running.items()):
            if proc.ended is None and proc.gone is None:
                out.append(proc)
            else:  # pop is atomic: threads that look at once need no lock
                running.pop(pid, None)
        return out

    def ranked(self) -> list[Process]:
        """Processes whose hello names a rank (the ranks of jobs are among them): live,
        from an index the hellos keep (a look each second costs the ranks, not every
        process ever seen); in a replay, whose processes came from files, by a look at
        each."""
        if self.live:
            return list(self._ranked.values())
        return [p for p in list(self.processes.values()) if p.hello.get("rank") is not None]

    def processes_of_host(self, key: str = HOST) -> list[Process]:
        """Instrumented processes that ran on the host device ``key``."""
        return [p for p in list(self.processes.values()) if p.host == key]

    # ------------------------------------------------------------------ plumbing

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(kind, args)`` for every fact added (the recorder uses this)."""
        self._listeners.append(listener)

    def touch(self) -> None:
        """Mark the session changed without a new fact (a loader filled in tables)."""
        self.version = next(self._versions)

    def alive(self, t: int) -> list[Process]:
        """Instrumented processes running at time ``t`` (seen by then, not yet gone)."""
        return [p for p in list(self.processes.values()) if self.runs_at(p, t)]

    def runs_at(self, proc: Process, t: int) -> bool:
        """Did ``proc`` run at ``t``: seen by then, not yet gone. A process that never
        said goodbye runs on until the host sampler finds it gone, or while the session is
        live; in a replay, until its last message and :data:`SILENT_END` after (its
        figures after that are no one's)."""
        if t < proc.first_t:
            return False
        if proc.ended is not None:
            return t < proc.ended
        if proc.gone is not None:  # killed, or its bye lost: the host sampler saw it go
            return t < proc.gone
        return self.live or t <= proc.last_t + SILENT_END

    def active(self, t0: int, t1: int) -> list[Process]:
        """Instrumented processes whose life overlaps ``[t0, t1]``: those a window shows.

        A process that never said goodbye lives on while the session is live; in a replay it
        ends with its last message.
        """
        out = []
        for p in list(self.processes.values()):
            end = p.ended if p.ended is not None else (None if self.live else p.last_t)
            if p.first_t <= t1 and (end is None or end >= t0):
                out.append(p)
        return out

    def _emit(self, kind: str, args: tuple[Any, ...]) -> None:
        self.version = next(self._versions)
        for listener in self._listeners:
            try:
                listener(kind, args)
            except Exception:  # a failing subscriber must not stop the data path
                pass

    def name_id(self, name: str) -> int:
        """Intern a phase name."""
        nid = self._name_ids.get(name)
        if nid is None:
            with self._lock:
                nid = self._name_ids.get(name)
                if nid is None:
                    nid = len(self.names)
                    self.names.append(name)
                    self._name_ids[name] = nid
        return nid

    def find_name(self, name: str) -> int | None:
        """The id of an interned phase name, or None; unlike :meth:`name_id` it adds none."""
        return self._name_ids.get(name)

    def now(self) -> int:
        """The newest time seen (live: the clock; replay: the last sample)."""
        if self.live:
            return time.monotonic_ns()
        return self.time_range()[1]

    def time_range(self) -> tuple[int, int]:
        """(first, last) time of anything recorded; (t_origin, t_origin) when empty."""
        cached = self._range
        if cached is not None and cached[0] == self.version:
            return cached[1]
        result = self._time_range()
        self._range = (self.version, result)
        return result

    def _time_range(self) -> tuple[int, int]:
        lo, hi = None, None
        tables: list[Table] = [*self.hosts.values(), *self.gpu.values()]
        for p in self.processes.values():
            tables += [p.torch, p.phases, p.rss]
        for table in tables:
            s = table.span()
            if s is None:
                continue
            lo = s[0] if lo is None else min(lo, s[0])
            hi = s[1] if hi is None else max(hi, s[1])
        for p in self.processes.values():
            for span in list(p.open.values()):
                hi = span.t0 if hi is None else max(hi, span.t0)
        if lo is None or hi is None:
            return self.t_origin, self.t_origin
        return lo, hi

    # ------------------------------------------------------------------ devices and samples

    def add_device(self, device: Device) -> Device:
        """Register a device (or update one with the same key)."""
        with self._lock:
            old = self.devices.get(device.key)
            if old is not None and old.source == "torch" and device.source == "nvml":
                old.source = "nvml"
            self.devices[device.key] = device
            if device.kind == "gpu" and device.key not in self.gpu:
                key = device.key
                self.gpu[key] = self._made("gpu", key, Table(GPU_COLUMNS, kind="gpu"))
                procs = Table(GPU_PROC_COLUMNS, kind="gpu_procs")
                self.gpu_procs[key] = self._made("gpu_procs", key, procs)
        self._emit("device", (device,))
        return device

    def ensure_host(self, name: str = "host", total: int | None = None) -> Device:
        """The host device, registered on first use."""
        dev = self.devices.get(HOST)
        if dev is None:
            dev = self.add_device(Device(HOST, "host", name=name, total=total, source="host"))
        return dev

    def set_device_state(self, key: str, state: str, note: str = "") -> None:
        """Mark a device lost / in error / ok again."""
        dev = self.devices.get(key)
        if dev is None or (dev.state == state and dev.note == note):
            return
        dev.state, dev.note = state, note
        self._emit("device", (dev,))

    def set_sampler_rate(self, key: str, rate: float) -> None:
        """The achieved samples per second on one GPU (0 while it is lost)."""
        self.sampler_rate[key] = rate

    def add_gpu_sample(self, key: str, row: dict[str, float | int | None]) -> None:
        """One NVML sample (keys of :data:`GPU_COLUMNS`; None for n/a)."""
        self.gpu[key].append(row)
        self._emit("gpu", (key, row))

    def add_gpu_processes(self, key: str, t: int, rows: Iterable[GpuProcRow]) -> None:
        """A snapshot of NVML's process list on a GPU: (pid, used bytes, type), optionally
        followed by (SM %, memory %, host CPU %, host RSS); None for unknown."""
        rows = list(rows)
        table = self.gpu_procs[key]
        if rows:
            cols: dict[str, list[Any]] = {
                "t": [t] * len(rows),
                "pid": [r[0] for r in rows],
                "used": [_opt(r[1]) for r in rows],
                "type": [r[2] for r in rows],
            }
            full = [r if len(r) > 3 else (*r, None, None, None, None) for r in rows]
            nan = float("nan")
            for i, name in ((3, "sm"), (4, "mem_util"), (5, "cpu")):
                cols[name] = [nan if r[i] is None else r[i] for r in full]
            cols["rss"] = [_opt(r[6]) for r in full]
            table.extend(cols)
        else:  # an empty snapshot still says "no processes from now on"
            table.append({"t": t, "pid": 0, "used": 0, "type": -1})
        self._emit("gpu_procs", (key, t, rows))

    def add_host_sample(self, row: dict[str, int]) -> None:
        """One host memory sample (t, total, used, available)."""
        self.host.append(row)
        self._emit("host", (row,))

    def add_rss(self, pid: int, t: int, rss: int, cpu: float | None = None) -> None:
        """The RSS (and CPU %, None: unknown) of an instrumented process, sampled by the
        gpuwatch process."""
        proc = self.processes.get(pid)
        if proc is None:
            return
        proc.rss.append((t, rss, cpu))
        proc.rev += 1
        self._emit("rss", (pid, t, rss))

    def set_proc_info(self, pid: int, info: dict[str, Any]) -> None:
        """Name / user / command line of a pid, as psutil sees it (``visible`` False if not).

        Equal descriptions share one dict (treat them as read-only): a sweep of thousands
        of processes started by one command line keeps that line once.
        """
        if self.proc_info.get(pid) != info:
            self.proc_info[pid] = self._shared_info(info)
            self._emit("proc_info", (pid, info))

    def _shared_info(self, info: dict[str, Any]) -> dict[str, Any]:
        try:
            key = repr(sorted(info.items()))
        except TypeError:  # keys of mixed types: kept as given
            return info
        shared = self._infos.get(key)
        if shared is None:
            if len(self._infos) >= 1024:  # a bound, not a history: start again
                self._infos.clear()
            shared = self._infos[key] = info
        return shared

    def count_reject(self, reason: str, pid: int | None = None, seq: int | None = None) -> None:
        """A datagram the receiver refused (malformed, oversized, wrong version...).

        Args:
            reason: Why (a :class:`~gpuwatch.protocol.ProtocolError` reason).
            pid: Its sender, as the kernel names it, when known.
            seq: The sequence number it carried, when it had a valid one: that number is
                then accounted for (rejected), not counted again as lost.
        """
        with self._lock:
            self.rejects[reason] += 1
            proc = self.processes.get(pid) if pid is not None else None
            if proc is not None:
                proc.rejected += 1
                proc.rev += 1  # a settled process is written again
                if seq is not None:
                    count_sequence(proc, seq)
        self._emit("reject", (reason,))

    def count_lost(self, pid: int, count: int) -> None:
        """Events ``pid`` sent that reached gpuwatch but could not be recorded (it was
        stopping, and its time to take them ran out): counted with the process's gaps."""
        with self._lock:
            proc = self.processes.get(pid)
            if proc is None:
                proc = self._new_process(pid, first_t=time.monotonic_ns())
            proc.gaps += count
            proc.rev += 1  # a settled process is written again
        self.touch()

    def note(self, text: str) -> None:
        """A one-line notice for the dashboard (and the recording)."""
        if text not in self.notes:
            self.notes.append(text)
            self._emit("note", (text,))

    # ------------------------------------------------------------------ messages

    def ingest(self, msg: Message) -> None:
        """Apply one validated message from an instrumented process."""
        with self._lock:
            proc = self.processes.get(msg.pid)
            if proc is None:
                proc = self._new_process(msg.pid, first_t=msg.t)
            elif proc.book is None:  # compacted (ended, settled): a late message
                thaw(proc)
            if msg.container_pid is not None:
                proc.container_pid = msg.container_pid
            count_sequence(proc, msg.seq)
            proc.dropped = max(proc.dropped, msg.dropped)
            proc.last_t = max(proc.last_t, msg.t)
            proc.rev += 1
            _HANDLERS[msg.kind](self, proc, msg)
        self._emit("message", (msg,))

    def _on_hello(self, proc: Process, msg: Message) -> None:
        proc.hello = self._shared_hello({**proc.hello, **msg.body})
        if proc.hello.get("rank") is not None:
            self._ranked[proc.pid] = proc
        else:
            self._ranked.pop(proc.pid, None)
        facts = msg.body.get("facts")
        if facts:
            proc.facts = facts
        for d in msg.body.get("devices") or ():
            key = self._device_for(d)
            if key is not None:
                proc.devices[d["index"]] = key

    def _shared_hello(self, hello: dict[str, Any]) -> dict[str, Any]:
        """``hello`` with its keys and its equal values shared with earlier hellos' (treat
        them as read-only): a sweep of thousands of scripts keeps one copy of their argv,
        host and versions, not one each (keys alone were half a kilobyte a process)."""
        parts = self._hello_parts
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

    def _device_for(self, d: dict[str, Any]) -> str | None:
        """Map a torch device (from a hello) to a session device, by UUID.

        Returns None for a device NVML does not list once :data:`MAX_TORCH_DEVICES` such
        devices exist: hellos are a process's word, and one process must not be able to
        fill the dashboard with made-up GPUs.
        """
        uuid = norm_uuid(d.get("uuid"))
        key = gpu_key(uuid) if uuid else f"gpu:torch{d['index']}"
        if key not in self.devices:
            torch_only = sum(1 for dev in self.devices.values() if dev.source == "torch")
            if torch_only >= MAX_TORCH_DEVICES:
                self.note(
                    f"ignoring GPUs beyond {MAX_TORCH_DEVICES} that NVML does not list "
                    "(named only by instrumented processes)"
                )
                return None
        if uuid:
            if key not in self.devices:
                # NVML has not (or cannot) see it: show it from torch's figures alone.
                self.add_device(
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
        if key not in self.devices:
            self.add_device(
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

    def _on_facts(self, proc: Process, msg: Message) -> None:
        proc.facts = msg.body["facts"]

    def _figures(self, proc: Process, msg: Message) -> None:
        b = msg.body
        if b.get("allocated") is None or b.get("reserved") is None:
            return
        dev = _opt(b.get("dev"))
        proc.torch_devs.add(dev)
        figures = (
            b["allocated"],
            b["reserved"],
            _opt(b.get("inactive_split")),
            _opt(b.get("alloc_retries")),
            _opt(b.get("alloc_ooms")),
        )
        proc.torch.append((msg.t, dev, *figures))
        last = proc.tally.torch
        last.pop(dev, None)  # re-inserted: the newest device last
        last[dev] = figures

    def _on_memory(self, proc: Process, msg: Message) -> None:
        self._figures(proc, msg)

    def _on_phase(self, proc: Process, msg: Message) -> None:
        b = msg.body
        self._figures(proc, msg)
        # The peaks a boundary reports cover the time since the previous boundary, which
        # lay inside every span open until now (the ending one included).
        pa, pr = b.get("peak_allocated"), b.get("peak_reserved")
        if pa is not None or pr is not None:
            start = proc.last_boundary if proc.last_boundary is not None else msg.t
            proc.peaks.append((msg.t, start, _opt(b.get("dev")), _opt(pa), _opt(pr)))
            proc.max_segment = max(proc.max_segment, msg.t - start)
            proc.book.peaks(pa, pr, len(proc.open))  # O(log open), not a loop over them
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
            proc.abandoned += proc.book.begin(proc.open, span)
            return
        ended = proc.book.end(proc.open, b["id"])
        if ended is None:  # its begin was lost, predates this dashboard, or was abandoned
            return
        span = ended
        proc.max_span = max(proc.max_span, msg.t - span.t0)
        row = PhaseRow(
            t1=msg.t,
            t0=span.t0,
            name=self.name_id(span.name),
            step=_opt(span.step),
            depth=span.depth,
            id=span.id,
            parent=_opt(span.parent),
            dev=_opt(b.get("dev", span.dev)),
            alloc0=_opt(span.alloc0),
            reserved0=_opt(span.reserved0),
            alloc1=_opt(b.get("allocated")),
            reserved1=_opt(b.get("reserved")),
            peak_alloc=_opt(span.peak_alloc),
            peak_reserved=_opt(span.peak_reserved),
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

    def _on_mark(self, proc: Process, msg: Message) -> None:
        b = msg.body
        self.marks.append(Mark(msg.t, proc.pid, b["text"], b.get("level", "info"), b.get("step")))
        self._let_marks_go()

    def add_mark(self, mark: Mark) -> None:
        """A mark from gpuwatch itself (a fault it found): kept and recorded as a script's."""
        with self._lock:
            self.marks.append(mark)
            self._let_marks_go()
        self._emit("mark", (mark,))

    def _let_marks_go(self) -> None:
        """Keep about :data:`KEEP_MARKS` marks in memory, once the session is bounded or
        its marks can be read back: only those the recording holds go, unless there is
        none (they are counted in :attr:`marks_gone`, as rows go into summaries)."""
        marks = self.marks
        if len(marks) <= 2 * KEEP_MARKS or (self.keep_rows is None and self.mark_source is None):
            return
        with self._lock:
            cut = len(marks) - KEEP_MARKS
            if self.marks_wait:
                cut = min(cut, self.marks_written - self.marks_gone)
            if cut <= 0:
                return
            latest = max(m.t for m in marks[:cut])
            if self._gone_t_max is None or latest > self._gone_t_max:
                self._gone_t_max = latest
            # A new list: a reader may still hold the old one.
            self.marks = marks[cut:]
            self.marks_gone += cut

    def mark_count(self) -> int:
        """Every mark the session had, let go of or not."""
        return self.marks_gone + len(self.marks)

    def every_mark(self) -> Iterator[Mark]:
        """Every mark: from the recording where some were let go of, then from memory."""
        with self._lock:
            gone, marks, source = self.marks_gone, self.marks, self.mark_source
            written = self.marks_written
        if not gone or source is None:
            yield from marks
            return
        yield from source.every()
        yield from marks[max(0, written - gone) :]

    def mark_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Every mark's time and pid, let go of or not (no text read into memory)."""
        with self._lock:
            gone, marks, source = self.marks_gone, self.marks, self.mark_source
            written = self.marks_written
        if gone and source is not None:
            t, pid = source.times()
            marks = marks[max(0, written - gone) :]
        else:
            t, pid = np.zeros(0, np.int64), np.zeros(0, np.int64)
        mt = np.array([m.t for m in marks], np.int64)
        mp = np.array([m.pid for m in marks], np.int64)
        return np.concatenate([t, mt]), np.concatenate([pid, mp])

    def _on_oom(self, proc: Process, msg: Message) -> None:
        self.ooms.append(Oom(msg.t, proc.pid, dict(msg.body)))
        self._figures(proc, msg)

    def _on_stats(self, proc: Process, msg: Message) -> None:
        """The sender's counts: only the common ``dropped``, already taken in ``ingest``."""

    def _on_bye(self, proc: Process, msg: Message) -> None:
        proc.ended = msg.t
        self._ended(proc)
        code = msg.body.get("exit_code")
        if code is not None or proc.exit_code is None:  # the launcher's word may be here
            proc.exit_code = code

    def child_exited(self, pid: int, status: int | None) -> None:
        """The launcher's word on the command it started: its exit status (a shell's view,
        128 + N for signal N). A bye cannot tell it: a script's atexit never sees its own
        status, so a script that returned normally said ``null``."""
        if status is None:
            return
        with self._lock:
            proc = self.processes.get(pid)
            if proc is not None and proc.exit_code is None:
                proc.exit_code = status
                proc.rev += 1  # a settled process is written again
        self.touch()

    # ------------------------------------------------------------------ queries

    def gpu_window(
        self, key: str, column: str, t0: int, t1: int, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Min/max-decimated NVML column of a GPU over ``[t0, t1]`` in ``width`` columns."""
        return self.gpu[key].minmax(column, t0, t1, width)

    def host_window(
        self, column: str, t0: int, t1: int, width: int, key: str = HOST
    ) -> tuple[np.ndarray, np.ndarray]:
        """Min/max-decimated host column (``used``, ``available``, ``total``)."""
        return self.host_table(key).minmax(column, t0, t1, width)

    def processes_on(self, key: str) -> list[Process]:
        """Instrumented processes that report figures for device ``key``."""
        return [p for p in self.processes.values() if key in p.devices.values()]

    def events_between(self, t0: int, t1: int) -> tuple[list[Mark], list[Oom]]:
        """The marks and OOMs timed within ``[t0, t1]`` (a run that marks every step has
        many: found by their times, not by looking at each)."""
        return self._marks_between(t0, t1), _between(self, "ooms", t0, t1)

    def _marks_between(self, t0: int, t1: int) -> list[Mark]:
        """Marks within ``[t0, t1]``: from memory, and from the recording where the window
        reaches a time of marks let go of (at most :data:`KEEP_MARKS` of those)."""
        with self._lock:
            gone, source, written = self.marks_gone, self.mark_source, self.marks_written
            reach = self._gone_t_max
        in_memory = _between(self, "marks", t0, t1)
        if not gone or source is None or reach is None or t0 > reach:
            return in_memory
        # The file has every mark written: add only those it has not yet.
        unwritten = [m for m in self.marks[max(0, written - gone) :] if t0 <= m.t <= t1]
        return source.between(t0, t1, KEEP_MARKS) + unwritten

    def span_at(self, proc: Process, t: int) -> dict[str, Any] | None:
        """The innermost phase of ``proc`` running at time ``t``, or None.

        Returns:
            ``name``, ``t0``, ``t1`` (None while running), ``step``, ``depth``,
            ``peak_alloc`` and ``peak_reserved`` (None when not reported).
        """
        cols = proc.spans(t, t)
        best: dict[str, Any] | None = None
        for i in range(len(cols["t0"])):
            depth = int(cols["depth"][i])
            if cols["t0"][i] <= t <= cols["t1"][i] and (best is None or depth > best["depth"]):
                best = {
                    "name": self.names[int(cols["name"][i])],
                    "t0": int(cols["t0"][i]),
                    "t1": int(cols["t1"][i]),
                    "step": _none(int(cols["step"][i])),
                    "depth": depth,
                    "peak_alloc": _none(int(cols["peak_alloc"][i])),
                    "peak_reserved": _none(int(cols["peak_reserved"][i])),
                }
        for span in list(proc.open.values()):
            if span.t0 <= t and (best is None or span.depth > best["depth"]):
                with self._lock:  # the receiver's thread updates the book
                    peak_alloc, peak_reserved = proc.book.peak_of(span)
                best = {
                    "name": span.name,
                    "t0": span.t0,
                    "t1": None,
                    "step": span.step,
                    "depth": span.depth,
                    "peak_alloc": peak_alloc,
                    "peak_reserved": peak_reserved,
                }
        return best

    def phase_at(self, proc: Process, t: int) -> str | None:
        """The name of the innermost phase of ``proc`` running at time ``t``."""
        span = self.span_at(proc, t)
        return span["name"] if span else None


def _between(session: Session, name: str, t0: int, t1: int) -> list[Any]:
    """Events of ``session.<name>`` within ``[t0, t1]``, from a sorted index of their
    times kept until the list changes."""
    events = getattr(session, name)
    cache = session._event_index.get(name)
    if cache is None or cache[0] is not events or cache[1] != len(events):
        times = np.array([e.t for e in events], dtype=np.int64)
        order = np.argsort(times, kind="stable")
        cache = (events, len(events), times[order], order)
        session._event_index[name] = cache
    _, _, times, order = cache
    i0, i1 = np.searchsorted(times, t0, "left"), np.searchsorted(times, t1, "right")
    return [events[i] for i in sorted(order[i0:i1].tolist())]


_HANDLERS: dict[str, Callable[[Session, Process, Message], None]] = {
    "hello": Session._on_hello,
    "facts": Session._on_facts,
    "memory": Session._on_memory,
    "phase": Session._on_phase,
    "mark": Session._on_mark,
    "oom": Session._on_oom,
    "stats": Session._on_stats,
    "bye": Session._on_bye,
}
"""What :meth:`Session.ingest` does with each kind of message (every kind of
:data:`~gpuwatch.protocol.KINDS`: a test checks both lists name the same kinds)."""


def _short_strings(v: list[Any]) -> bool:
    """A short list of short strings (an argv): worth sharing, cheap to keep."""
    return len(v) <= 64 and all(type(a) is str for a in v) and sum(map(len, v)) <= 1024


def _none(v: int) -> int | None:
    return None if v == MISSING_INT else v
