"""The in-memory truth of one session: devices, samples, processes, phases, marks.

Sources call the ``add_*`` methods and :meth:`Session.ingest` from their own threads; the
dashboard reads with the query methods (:mod:`.queries`). Every change bumps
:attr:`Session.version` and is passed to listeners as a typed event (:mod:`.ports`), so
the session is the single place facts flow through. What memory keeps and what it lets go
of to the recording is :attr:`Session.retention`'s (:mod:`.retention`); what each kind
of message does is :mod:`.messages`'.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

from ..protocol import Message
from .frame import FrameState, WindowOf
from .messages import HANDLERS, opt
from .model import (
    GPU_COLUMNS,
    GPU_PROC_COLUMNS,
    HOST,
    HOST_COLUMNS,
    Device,
    GpuProcRow,
    Mark,
    Oom,
)
from .openspans import stored_open
from .ports import (
    DeviceChanged,
    GpuProcessesSampled,
    GpuSampled,
    HostSampled,
    Listener,
    MarkAdded,
    Noted,
    ProcessDescribed,
    ProcessGone,
    Rejected,
    RssSampled,
    SessionEvent,
)
from .process import PROCESS_TABLES, Process, count_sequence, thaw
from .queries import SessionQueries
from .retention import KEEP_ROWS, Retention
from .settled_table import SettledTable
from .table import Table

T = TypeVar("T")

TableHook = Callable[[str, str, Table], None]


class Session(SessionQueries):
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
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        # The newest marks; a bounded session lets older ones go (see Retention).
        self.marks: list[Mark] = []
        self.ooms: list[Oom] = []
        self.rejects: Counter[str] = Counter()
        self.notes: list[str] = []  # one-line notices (no driver, permission, ...)
        self.sampler_rate: dict[str, float] = {}  # achieved samples/s by source
        self.version = 0
        self._range: tuple[int, tuple[int, int]] | None = None  # (version, time_range())
        self._versions = itertools.count(1)  # next() is atomic: sources call from threads
        self.live = True
        self._lock = threading.RLock()
        self.retention = Retention(self, self._lock)
        self._listeners: list[Listener] = []
        self.listener_failures = 0  # exceptions listeners raised (the first of each noted)
        self._failed_listeners: set[int] = set()  # ids of listeners that raised

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

    def host_window(
        self, column: str, t0: int, t1: int, width: int, key: str = HOST
    ) -> tuple[np.ndarray, np.ndarray]:
        """Min/max-decimated host column (``used``, ``available``, ``total``)."""
        return self.host_table(key).minmax(column, t0, t1, width)

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
                if not isinstance(table, SettledTable):  # it holds nothing: the file has all
                    out.append((kind, str(pid), table))
        return out

    @property
    def keep_rows(self) -> int | None:
        """Rows each table keeps in memory (None: all; see :meth:`bound`)."""
        return self.retention.keep_rows

    @property
    def marks_gone(self) -> int:
        """Marks let go of, the oldest (the recording holds them)."""
        return self.retention.marks_gone

    def bound(self, rows: int | None = KEEP_ROWS) -> None:
        """Keep at most about ``rows`` rows of each table in memory (None: everything);
        see :meth:`Retention.bound`."""
        self.retention.bound(rows)

    def mark_count(self) -> int:
        """Every mark the session had, let go of or not."""
        return self.retention.mark_count()

    def every_mark(self) -> Iterator[Mark]:
        """Every mark: from the recording where some were let go of, then from memory."""
        return self.retention.every_mark()

    def mark_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Every mark's time and pid, let go of or not (no text read into memory)."""
        return self.retention.mark_times()

    def on_table(self, hook: TableHook) -> None:
        """Call ``hook(kind, key, table)`` for every table, now and as tables are made
        (the recorder attaches its archive before any row can leave memory)."""
        self._table_hooks.append(hook)
        for kind, key, table in self.tables():
            hook(kind, key, table)

    def _made(self, kind: str, key: str, table: Table) -> Table:
        for hook in self._table_hooks:
            hook(kind, key, table)
        table.retain(self.retention.keep_rows)
        return table

    def _new_process(self, pid: int, **fields: Any) -> Process:
        proc = self.processes[pid] = self._running[pid] = Process(pid, **fields)
        for kind in PROCESS_TABLES:
            self._made(kind, str(pid), getattr(proc, kind))
        return proc

    def process_gone(self, pid: int, t: int) -> None:
        """The process no longer exists (the host sampler's finding): once its rows are in
        the recording it keeps a summary only, as one that said bye does."""
        with self._lock:
            proc = self.processes.get(pid)
            if proc is None or proc.gone is not None:
                return
            proc.gone = t
            proc.rev += 1
            self.retention.ended(proc)
        self._emit(ProcessGone(pid, t))

    def running(self) -> list[Process]:
        """Instrumented processes not known to have ended (no bye, not found gone): what
        the samplers look at each tick, whatever number ended before. A replay (whose
        processes came from files) is looked at whole."""
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

    def open_changes(
        self, proc: Process, everything: bool
    ) -> tuple[bool, list[tuple[int, dict[str, Any] | None]]]:
        """The open spans of ``proc`` that began or ended since last asked, each as
        stored (None: it ended), read together with the receiver's changes to them.

        Returns:
            Whether these are all of them (``everything``, or too many changed to say
            which), and the spans.
        """
        with self._lock:  # the receiver begins and ends spans under it
            book = proc.book
            if book is None:  # compacted: nothing open
                return everything, []
            reset, changed = book.take_changes()
            reset = reset or everything
            ids = list(proc.open) if reset else sorted(changed)
            spans = [(sid, proc.open.get(sid)) for sid in ids]
            return reset, [(sid, None if o is None else stored_open(book, o)) for sid, o in spans]

    def frame_state(self, window_of: WindowOf) -> FrameState:
        """What the dashboard's frame draws, read under the lock in one go (up to 20 a
        second): writers that hold it (messages, devices, marks, rejects, processes
        gone) come wholly before or wholly after; a sample, a note or a device state
        that comes without it is in, or not yet. See :class:`FrameState`.

        Args:
            window_of: The frame's window, given the data's first time.
        """
        with self._lock:
            time_range = self.time_range()
            window = window_of(time_range[0])
            t0, t1 = window
            procs = self.processes.values()
            marks, ooms = self.events_between(t0, t1)
            return FrameState(
                version=self.version,
                t_origin=self.t_origin,
                live=self.live,
                time_range=time_range,
                window=window,
                devices=tuple(self.devices),
                gpus=sum(d.kind == "gpu" for d in self.devices.values()),
                instrumented=len(self.active(t0, t1)),
                rejects=sum(self.rejects.values()),
                dropped=sum(p.dropped for p in procs),
                notes=tuple(self.notes),
                events=(*ooms, *marks),
            )

    def read(self, fn: Callable[[], T]) -> T:
        """``fn()`` under the session's lock: what it reads is one moment of the session
        (writers that hold the lock come wholly before or after it, as for
        :meth:`frame_state`). ``fn`` returns figures and frozen rows, never one of the
        session's containers: that is what a widget keeps and draws from."""
        with self._lock:
            return fn()

    # ------------------------------------------------------------------ events

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(event)`` for every fact added (the recorder uses this). One
        that raises is counted in :attr:`listener_failures` and noted once; the fact is
        kept and the other listeners are called all the same."""
        self._listeners.append(listener)

    def touch(self) -> None:
        """Mark the session changed without a new fact (a loader filled in tables)."""
        self.version = next(self._versions)

    def _emit(self, event: SessionEvent) -> None:
        self.version = next(self._versions)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception as exc:  # never into the producer's thread (a script's relay)
                self._listener_failed(listener, exc)

    def _listener_failed(self, listener: Listener, exc: Exception) -> None:
        with self._lock:
            self.listener_failures += 1
            first = id(listener) not in self._failed_listeners
            self._failed_listeners.add(id(listener))
        if first:  # noted after it is known: a listener that fails on the note is counted
            name = getattr(listener, "__qualname__", type(listener).__qualname__)
            self.note(
                f"a session listener failed ({name}: {type(exc).__name__}); "
                "its further failures are counted, not shown"
            )

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
        self._emit(DeviceChanged(device))
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
        self._emit(DeviceChanged(dev))

    def set_sampler_rate(self, key: str, rate: float) -> None:
        """The achieved samples per second on one GPU (0 while it is lost)."""
        self.sampler_rate[key] = rate

    def add_gpu_sample(self, key: str, row: dict[str, float | int | None]) -> None:
        """One NVML sample (keys of :data:`GPU_COLUMNS`; None for n/a)."""
        self.gpu[key].append(row)
        self._emit(GpuSampled(key, row))

    def add_gpu_processes(self, key: str, t: int, rows: Iterable[GpuProcRow]) -> None:
        """A snapshot of NVML's process list on a GPU: (pid, used bytes, type), optionally
        followed by (SM %, memory %, host CPU %, host RSS); None for unknown."""
        rows = list(rows)
        table = self.gpu_procs[key]
        if rows:
            cols: dict[str, list[Any]] = {
                "t": [t] * len(rows),
                "pid": [r[0] for r in rows],
                "used": [opt(r[1]) for r in rows],
                "type": [r[2] for r in rows],
            }
            full = [r if len(r) > 3 else (*r, None, None, None, None) for r in rows]
            nan = float("nan")
            for i, name in ((3, "sm"), (4, "mem_util"), (5, "cpu")):
                cols[name] = [nan if r[i] is None else r[i] for r in full]
            cols["rss"] = [opt(r[6]) for r in full]
            table.extend(cols)
        else:  # an empty snapshot still says "no processes from now on"
            table.append({"t": t, "pid": 0, "used": 0, "type": -1})
        self._emit(GpuProcessesSampled(key, t, rows))

    def add_host_sample(self, row: dict[str, int]) -> None:
        """One host memory sample (t, total, used, available)."""
        self.host.append(row)
        self._emit(HostSampled(row))

    def add_rss(self, pid: int, t: int, rss: int, cpu: float | None = None) -> None:
        """The RSS (and CPU %, None: unknown) of an instrumented process, sampled by the
        gpuwatch process."""
        proc = self.processes.get(pid)
        if proc is None:
            return
        proc.rss.append((t, rss, cpu))
        proc.rev += 1
        self._emit(RssSampled(pid, t, rss, cpu))

    def set_proc_info(self, pid: int, info: dict[str, Any]) -> None:
        """Name / user / command line of a pid, as psutil sees it (``visible`` False if not).

        Equal descriptions share one dict (treat them as read-only): a sweep of thousands
        of processes started by one command line keeps that line once.
        """
        if self.proc_info.get(pid) != info:
            self.proc_info[pid] = self._shared_info(info)
            self._emit(ProcessDescribed(pid, info))

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
        self._emit(Rejected(reason))

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
            self._emit(Noted(text))

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
            HANDLERS[msg.kind](self, proc, msg)
        self._emit(msg)  # the message is its own event

    def add_mark(self, mark: Mark) -> None:
        """A mark from gpuwatch itself (a fault it found): kept and recorded as a script's."""
        with self._lock:
            self.marks.append(mark)
            self.retention.let_marks_go()
        self._emit(MarkAdded(mark))

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
