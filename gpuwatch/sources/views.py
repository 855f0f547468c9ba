"""Several views of one live session: the owner's view socket, and a view's feed.

The first gpuwatch on an annotation socket owns it (see :mod:`.lock_file`): it binds it,
samples NVML and the host, and records. It also listens on a second socket beside it,
``<socket>.views`` (a stream socket, 0600, this user's peers only), where each later
gpuwatch of the same user attaches as a *view*: the owner's :class:`ViewHub` sends it a
hello (the owner's pid, clock origin and recording), what the session knows now (devices,
process descriptions, notes, the hello and facts of each running process), then every fact
its session is given, as one JSON list a line (:func:`encode`). The view's
:class:`ViewFeed` applies each to a session of its own (:class:`Applier`), so both show
the same figures; the view draws with its own cursor and keys.

The owner is never slowed by a view: its session's listener only appends the fact to each
view's bounded queue (dropped and counted when full: the view is told how many); a thread
per view encodes and writes, and a view that reads nothing for :data:`SEND_LIMIT` seconds
is let go. What comes from the view socket is hostile to the view: every line is bounded,
parsed without constants beyond JSON's, checked field by field, and a message from an
instrumented process goes through :func:`gpuwatch.protocol.decode` again. A client asks
with one line: ``view`` (the stream) or ``once`` (one JSON document, ``gpuwatch --once``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import socket
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import protocol
from ..fmt import printable
from ..protocol import Message
from ..session import Device, Session, ports
from ..session.model import GPU_COLUMNS, HOST_COLUMNS, Mark
from ..session.ports import SessionEvent
from ..session.table import MISSING_INT

VERSION = 1
SUFFIX = ".views"
"""The view socket is the annotation socket's path with this added."""
QUEUE_MAX = 20_000
"""Facts a view may be behind (seconds of a busy session); beyond, they are dropped."""
LINE_MAX = 8 << 20
"""Longest line a view reads (a batch of facts; a GPU's list of thousands of processes)."""
VIEWS_MAX = 16
"""Views attached at once; more are refused."""
SEND_LIMIT = 10.0
"""Seconds a view may read nothing before the owner lets it go."""
ASK_LIMIT = 2.0
"""Seconds a client has to say what it wants, and the owner to answer a hello."""
BATCH = 256
"""Facts written to a view in one line (one send) at most."""
FLUSH_EVERY = 0.1
"""Seconds an outlet gathers facts before it writes them (a view lags by this much)."""

_CRED = struct.Struct("3i")


class ViewError(RuntimeError):
    """No owner can be viewed on this socket; ``str()`` is one line."""


def view_path(socket_path: str) -> str:
    """The view socket of the annotation socket ``socket_path``."""
    return socket_path + SUFFIX


def _peer_uid(sock: socket.socket) -> int | None:
    try:
        _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (OSError, struct.error):
        return None
    return int(uid)


# --------------------------------------------------------------------------- encoding


def encode(event: SessionEvent) -> list[Any] | None:
    """The wire form of one session fact (None: a kind views do not need)."""
    if isinstance(event, Message):
        # The object protocol.encode would write (the view decodes it as a datagram).
        obj = {"v": protocol.VERSION, "kind": event.kind, "seq": event.seq, "pid": event.pid}
        obj["t"] = event.t
        if event.dropped:
            obj["dropped"] = event.dropped
        obj.update(event.body)
        return ["msg", obj, event.container_pid]
    if isinstance(event, ports.GpuSampled):
        return ["gpu", event.key, event.row]
    if isinstance(event, ports.GpuProcessesSampled):
        return ["procs", event.key, event.t, [list(r) for r in event.rows]]
    if isinstance(event, ports.HostSampled):
        return ["host", event.row]
    if isinstance(event, ports.RssSampled):
        return ["rss", event.pid, event.t, event.rss, event.cpu]
    if isinstance(event, ports.DeviceChanged):
        return ["device", dataclasses.asdict(event.device)]
    if isinstance(event, ports.ProcessDescribed):
        return ["info", event.pid, event.info]
    if isinstance(event, ports.ProcessGone):
        return ["gone", event.pid, event.t]
    if isinstance(event, ports.MarkAdded):
        m = event.mark
        return ["mark", m.t, m.pid, m.text, m.level, m.step]
    if isinstance(event, ports.Rejected):
        return ["reject", event.reason]
    if isinstance(event, ports.Noted):
        return ["note", event.text]
    return None


# One encoder for every line: json.dumps with options builds one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def _line(item: list[Any]) -> bytes:
    """One line: an item, or a batch of items (one encoding for a tenth of a second)."""
    return _ENCODER.encode(item).encode("utf-8") + b"\n"


def snapshot(session: Session) -> list[list[Any]]:
    """What a view attaching now needs to draw what the owner knows: devices, process
    descriptions, notes, and the hello and facts of each running process (with its
    sequence number, so that the view counts no gap)."""
    out: list[list[Any]] = []
    for dev in list(session.devices.values()):
        out.append(["device", dataclasses.asdict(dev)])
    for pid, info in list(session.proc_info.items()):
        out.append(["info", pid, info])
    for text in list(session.notes):
        out.append(["note", text])
    for key in list(session.gpu):
        out += _newest(session, key)
    for proc in session.running():
        seq = max(proc.last_seq, 0)
        msgs = [Message("hello", proc.pid, seq, proc.first_t, proc.dropped, dict(proc.hello))]
        for epoch in proc.facts_epochs():
            if epoch.facts:
                msgs.append(Message("facts", proc.pid, seq, epoch.start, 0, {"facts": epoch.facts}))
        for msg in msgs:
            item = encode(msg)
            if item is not None:
                out.append(item)
    return out


def _newest(session: Session, key: str) -> list[list[Any]]:
    """A GPU's newest sample and process list: a list is sent again only when it changes."""
    out: list[list[Any]] = []
    sample = session.gpu[key].last()
    if sample:
        out.append(["gpu", key, {k: _plain(v) for k, v in sample.items()}])
    procs = session.gpu_procs.get(key)
    span = procs.span() if procs is not None else None
    snap = procs.group_at(span[1]) if procs is not None and span is not None else None
    if snap is not None:
        cols = [snap[c].tolist() for c in ("pid", "used", "type", "sm", "mem_util", "cpu", "rss")]
        rows = [[_plain(v) for v in r] for r in zip(*cols, strict=True) if r[0] > 0]
        out.append(["procs", key, int(snap["t"][-1]), rows])
    return out


def _plain(v: Any) -> Any:
    """A table's value as JSON has it: NaN and the missing integer are None."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if type(v) is int and v == MISSING_INT:
        return None
    return v.item() if hasattr(v, "item") else v


# --------------------------------------------------------------------------- the owner


class _Outlet:
    """One attached view: its bounded queue and the thread that writes it."""

    def __init__(self, hub: ViewHub, conn: socket.socket) -> None:
        self.hub = hub
        self.conn = conn
        self.queue: deque[SessionEvent | list[Any]] = deque()
        self.ready = threading.Event()
        self.dropped = 0
        self.closed = False
        self.rates: dict[str, float] = {}

    def put(self, event: SessionEvent | list[Any]) -> None:
        """Queue one fact (the producer's thread: an append, or a count when full)."""
        if len(self.queue) >= QUEUE_MAX:
            self.dropped += 1
            return
        self.queue.append(event)
        if not self.ready.is_set():  # a read: setting it takes a lock, at every fact
            self.ready.set()

    def run(self, hello: dict[str, Any]) -> None:
        try:
            self.conn.sendall(_line(["hello", hello]))
            items = snapshot(self.hub.session)
            for i in range(0, len(items), BATCH):
                self._send(items[i : i + BATCH])
            while True:
                self.ready.wait(1.0)
                if not self.closed:
                    # What comes meanwhile goes in the same send: one wake-up (here and in
                    # the view) for a tenth of a second of facts, not one a fact.
                    time.sleep(FLUSH_EVERY)
                self.ready.clear()
                self._flush()
                if self.closed and not self.queue:
                    break  # the owner's bye written
        except OSError:
            pass  # the view went (or stopped reading for SEND_LIMIT): it is let go
        finally:
            self.hub.forget(self)

    def _flush(self) -> None:
        while self.queue:
            items = []
            for _ in range(min(len(self.queue), BATCH)):
                event = self.queue.popleft()
                item = event if isinstance(event, list) else encode(event)
                if item is not None:
                    items.append(item)
            self._send(items)
        if self.dropped:
            lost, self.dropped = self.dropped, 0
            self._send([["dropped", lost]])
        # The achieved sampling rates are no fact of their own (the panels show them).
        rates = dict(self.hub.session.sampler_rate)
        if rates != self.rates:
            self.rates = rates
            self._send([["rates", rates]])

    def _send(self, items: list[list[Any]]) -> None:
        if items:
            self.conn.sendall(_line(items))

    def close(self) -> None:
        self.closed = True
        self.ready.set()


class ViewHub:
    """The owner's view socket: attached views get the session's facts as they come.

    Args:
        session: The owner's session.
        socket_path: The annotation socket (the view socket is beside it).
        recording: Says the owner's recording now (a path, or None).
        once: The document ``gpuwatch --once`` prints, from the owner's session.
    """

    def __init__(
        self,
        session: Session,
        socket_path: str,
        recording: Callable[[], str | None],
        once: Callable[[], dict[str, Any]],
    ) -> None:
        self.session = session
        self.path = view_path(socket_path)
        self._recording = recording
        self._once = once
        self._outlets: tuple[_Outlet, ...] = ()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._identity: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self.attached_ever = 0

    @property
    def views(self) -> int:
        """Views attached now."""
        return len(self._outlets)

    def start(self) -> None:
        """Listen (the caller holds the socket's lock, so a socket left here is stale).

        Raises:
            OSError: The view socket cannot be bound.
        """
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        st = os.lstat(self.path)
        self._identity = (st.st_dev, st.st_ino)
        sock.listen(VIEWS_MAX)
        sock.settimeout(0.2)
        self._sock = sock
        self.session.subscribe(self)
        self._thread = threading.Thread(target=self._accept, name="gpuwatch-views", daemon=True)
        self._thread.start()

    def __call__(self, event: SessionEvent) -> None:
        """The session's listener: on the producer's thread, so only appends."""
        for outlet in self._outlets:
            outlet.put(event)

    def _accept(self) -> None:
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn,), name="gpuwatch-view", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        """Hear what the client wants; stream to a view, or answer ``once``."""
        try:
            if _peer_uid(conn) != os.getuid() or len(self._outlets) >= VIEWS_MAX:
                conn.close()
                return
            conn.settimeout(ASK_LIMIT)
            ask = conn.recv(16).strip()
            conn.settimeout(SEND_LIMIT)
            if ask == b"once":
                conn.sendall(_line(["once", self._once()]))
                conn.close()
            elif ask == b"view":
                self._attach(conn)
            else:
                conn.close()
        except Exception:  # a client that went, or a document that failed: not the owner's
            with contextlib.suppress(OSError):
                conn.close()

    def _attach(self, conn: socket.socket) -> None:
        outlet = _Outlet(self, conn)
        with self._lock:
            self._outlets = (*self._outlets, outlet)
            self.attached_ever += 1
        hello = {
            "v": VERSION,
            "pid": os.getpid(),
            "t_origin": self.session.t_origin,
            "wall_offset": self.session.wall_offset,
            "recording": self._recording(),
        }
        outlet.run(hello)

    def forget(self, outlet: _Outlet) -> None:
        with self._lock:
            self._outlets = tuple(o for o in self._outlets if o is not outlet)
        with contextlib.suppress(OSError):
            outlet.conn.close()

    def stop(self) -> None:
        """Tell each view the owner is going (with its recording), then close."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._identity is not None:
            with contextlib.suppress(OSError):
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == self._identity:
                    os.unlink(self.path)
        sock.close()
        for outlet in self._outlets:
            outlet.put(["bye", self._recording()])
            outlet.close()
        deadline = time.monotonic() + 1.0
        while self._outlets and time.monotonic() < deadline:
            time.sleep(0.01)  # each writes its queue and bye, then goes


# --------------------------------------------------------------------------- a view


def _int(v: Any, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError("not an integer in range")
    return v


def _opt_int(v: Any, lo: int = 0, hi: int = 2**63 - 1) -> int | None:
    return None if v is None else _int(v, lo, hi)


def _num(v: Any) -> float | int | None:
    if v is None or type(v) is int or (type(v) is float and not math.isinf(v)):
        return v
    raise ValueError("not a number")


def _text(v: Any, limit: int) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise ValueError("not a short string")
    return printable(v)


def _opt_text(v: Any, limit: int) -> str | None:
    return None if v is None else _text(v, limit)


def _row(v: Any, columns: tuple[tuple[str, str], ...]) -> dict[str, float | int | None]:
    names = {c for c, _ in columns}
    if not isinstance(v, dict) or not set(v) <= names or "t" not in v:
        raise ValueError("not a sample")
    row = {k: _num(x) for k, x in v.items()}
    _int(row["t"])
    return row


_MAX_PID = protocol.MAX_PID
_INFO_KEYS = 32


def _info(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict) or len(v) > _INFO_KEYS:
        raise ValueError("not a description")
    out: dict[str, Any] = {}
    for k, x in v.items():
        key = _text(k, 32)
        if isinstance(x, list):
            if len(x) > 1024:
                raise ValueError("a long list")
            out[key] = [_text(a, 4096) if isinstance(a, str) else _num(a) for a in x]
        elif isinstance(x, str):
            out[key] = _text(x, 8192)
        elif isinstance(x, bool):
            out[key] = x
        else:
            out[key] = _num(x)
    return out


def _device(v: Any) -> Device:
    if not isinstance(v, dict):
        raise ValueError("not a device")
    extra = v.get("extra") or {}
    if not isinstance(extra, dict):
        raise ValueError("not a device")
    kept: dict[str, Any] = {}
    for k in ("driver", "mig_parent"):
        if isinstance(extra.get(k), str):
            kept[k] = _text(extra[k], 256)
    if type(extra.get("mig_slot")) is int:
        kept["mig_slot"] = _int(extra["mig_slot"], 0, 63)
    kind = v.get("kind")
    state = v.get("state", "ok")
    source = v.get("source", "nvml")
    if kind not in ("gpu", "host") or state not in ("ok", "lost", "error"):
        raise ValueError("not a device")
    if source not in ("nvml", "torch", "host"):
        raise ValueError("not a device")
    return Device(
        key=_text(v.get("key"), 256),
        kind=kind,
        index=_opt_int(v.get("index"), 0, protocol.MAX_DEVICE_INDEX),
        name=_text(v.get("name", ""), 256),
        uuid=_opt_text(v.get("uuid"), 256),
        bus_id=_opt_text(v.get("bus_id"), 64),
        total=_opt_int(v.get("total"), 0, protocol.MAX_BYTES),
        state=state,
        note=_text(v.get("note", ""), protocol.MAX_TEXT),
        source=source,
        extra=kept,
    )


def _proc_row(v: Any) -> tuple[Any, ...]:
    if not isinstance(v, list) or len(v) not in (3, 7):
        raise ValueError("not a process row")
    pid = _int(v[0], 0, _MAX_PID)
    used = _opt_int(v[1], 0, protocol.MAX_BYTES)
    kind = _int(v[2], -1, 2)
    if len(v) == 3:
        return (pid, used, kind)
    return (pid, used, kind, _num(v[3]), _num(v[4]), _num(v[5]), _opt_int(v[6], 0, 2**62))


class Applier:
    """Applies the owner's lines to a view's session, each checked first.

    A line that does not check out is counted (:attr:`refused`), the first said in a note.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.refused = 0
        self.dropped = 0  # facts the owner dropped for this view (it read too slowly)
        self.bye: tuple[bool, str | None] = (False, None)  # the owner said it goes
        s = session
        self._handlers: dict[str, Callable[..., object]] = {
            "msg": self._msg,
            "gpu": lambda key, row: s.add_gpu_sample(self._gpu(key), _row(row, GPU_COLUMNS)),
            "procs": lambda key, t, rows: s.add_gpu_processes(
                self._gpu(key), _int(t), [_proc_row(r) for r in _list(rows, 65536)]
            ),
            "host": lambda row: s.add_host_sample(_row(row, HOST_COLUMNS)),  # type: ignore[arg-type]
            "rss": lambda pid, t, rss, cpu: s.add_rss(
                _int(pid, 0, _MAX_PID), _int(t), _int(rss), _num(cpu)
            ),
            "device": lambda d: s.add_device(_device(d)),
            "info": lambda pid, info: s.set_proc_info(_int(pid, 0, _MAX_PID), _info(info)),
            "gone": lambda pid, t: s.process_gone(_int(pid, 0, _MAX_PID), _int(t)),
            "mark": self._mark,
            "reject": lambda reason: s.count_reject(_text(reason, 64)),
            "note": lambda text: s.note(_text(text, 2 * protocol.MAX_TEXT)),
            "dropped": self._dropped,
            "rates": self._rates,
            "bye": self._bye,
        }

    def _gpu(self, key: Any) -> str:
        if not isinstance(key, str) or key not in self.session.gpu:
            raise ValueError("not a known GPU")
        return key

    def _msg(self, obj: Any, container_pid: Any) -> None:
        if not isinstance(obj, dict):
            raise ValueError("not a message")
        msg = protocol.decode(json.dumps(obj, separators=(",", ":")).encode("utf-8"))
        msg.container_pid = _opt_int(container_pid, 0, _MAX_PID)
        self.session.ingest(msg)

    def _mark(self, t: Any, pid: Any, text: Any, level: Any, step: Any) -> None:
        if level not in protocol.LEVELS:
            raise ValueError("not a level")
        mark = Mark(_int(t), _int(pid, 0, _MAX_PID), _text(text, protocol.MAX_TEXT), level)
        mark.step = _opt_int(step)
        self.session.add_mark(mark)

    def _rates(self, rates: Any) -> None:
        if not isinstance(rates, dict) or len(rates) > 1024:
            raise ValueError("not rates")
        for key, rate in rates.items():
            value = _num(rate)
            if value is not None:
                self.session.set_sampler_rate(self._gpu(key), float(value))

    def _dropped(self, n: Any) -> None:
        self.dropped += _int(n)
        self.session.note(
            f"this view read too slowly: the owner dropped {self.dropped} facts for it"
        )

    def _bye(self, recording: Any) -> None:
        self.bye = (True, _opt_text(recording, 4096))

    def line(self, data: bytes) -> None:
        """Apply one line from the owner: a batch of items."""
        try:
            batch = json.loads(data)
            if not isinstance(batch, list):
                raise ValueError("not a batch")
        except Exception as exc:  # RecursionError too: hostile
            self._refuse(exc)
            return
        for item in batch:
            self.item(item)

    def item(self, item: Any) -> None:
        """Apply one item (``[kind, *fields]``); one that does not check out is counted."""
        try:
            if not isinstance(item, list) or not item or not isinstance(item[0], str):
                raise ValueError("not an item")
            handler = self._handlers.get(item[0])
            if handler is None:
                return  # a newer owner's kind: nothing to show of it
            handler(*item[1:])
        except Exception as exc:  # hostile or damaged: counted, the stream goes on
            self._refuse(exc)

    def _refuse(self, exc: Exception) -> None:
        self.refused += 1
        if self.refused == 1:
            self.session.note(
                f"the gpuwatch viewed sent a line this view refused "
                f"({type(exc).__name__}); more are counted"
            )


def _list(v: Any, limit: int) -> list[Any]:
    if not isinstance(v, list) or len(v) > limit:
        raise ValueError("not a list")
    return v


def _connect(socket_path: str, ask: bytes, timeout: float) -> socket.socket:
    """A connection to the owner's view socket, asked ``ask``.

    Raises:
        ViewError: No owner listens there, or it is not this user's.
    """
    path = view_path(socket_path)
    try:
        st = os.lstat(path)
    except OSError:
        raise ViewError(f"no gpuwatch serves views on {path}")
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise ViewError(f"{path} is not a gpuwatch view socket of this user")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        if _peer_uid(sock) != os.getuid():
            raise ViewError(f"{path} is served by another user")
        sock.sendall(ask + b"\n")
    except OSError as exc:
        sock.close()
        raise ViewError(f"cannot attach to the gpuwatch on {path}: {exc.strerror or exc}")
    except ViewError:
        sock.close()
        raise
    return sock


def ask_once(socket_path: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """The owner's ``--once`` document, or None where no owner answers."""
    try:
        sock = _connect(socket_path, b"once", timeout)
    except ViewError:
        return None
    try:
        data = sock.makefile("rb").readline(64 * LINE_MAX)
        item = json.loads(data)
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    if isinstance(item, list) and len(item) == 2 and item[0] == "once":
        doc = item[1]
        return doc if isinstance(doc, dict) else None
    return None


class ViewFeed:
    """A view's end of the view socket: the owner's facts into ``session``.

    Args:
        session: The view's session (its clock origin becomes the owner's).
        socket_path: The annotation socket the owner holds.
    """

    def __init__(self, session: Session, socket_path: str) -> None:
        self.session = session
        self.socket_path = socket_path
        self.applier = Applier(session)
        self.owner_pid: int | None = None
        self.recording: str | None = None  # the owner's
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.ended: str | None = None  # why the stream ended

    def connect(self, timeout: float = ASK_LIMIT) -> None:
        """Attach, read the owner's hello and take its clock.

        Raises:
            ViewError: No owner, or its hello is not one.
        """
        sock = _connect(self.socket_path, b"view", timeout)
        f = sock.makefile("rb")
        try:
            hello = json.loads(f.readline(LINE_MAX))
            if not isinstance(hello, list) or hello[:1] != ["hello"] or len(hello) != 2:
                raise ValueError("no hello")
            body = hello[1]
            if not isinstance(body, dict) or body.get("v") != VERSION:
                raise ValueError("another version")
            self.owner_pid = _int(body.get("pid"), 1, _MAX_PID)
            t_origin = _int(body.get("t_origin"))
            wall = _int(body.get("wall_offset"), -(2**62), 2**62)
            self.recording = _opt_text(body.get("recording"), 4096)
        except (OSError, ValueError, IndexError) as exc:
            f.close()
            sock.close()
            raise ViewError(f"the gpuwatch on {self.socket_path} did not greet a view ({exc})")
        sock.settimeout(None)
        self.session.t_origin, self.session.wall_offset = t_origin, wall
        self._sock, self._file = sock, f

    def start(self, on_end: Callable[[ViewFeed], None]) -> None:
        """Apply the owner's facts on a thread; ``on_end(self)`` when the stream ends."""
        self._thread = threading.Thread(
            target=self._read, args=(on_end,), name="gpuwatch-view-feed", daemon=True
        )
        self._thread.start()

    def _read(self, on_end: Callable[[ViewFeed], None]) -> None:
        f = self._file
        why = "the owner closed the view socket"
        try:
            while True:
                data = f.readline(LINE_MAX + 1)
                if not data:
                    break
                if len(data) > LINE_MAX:
                    why = "the owner sent a line longer than any it writes"
                    break
                self.applier.line(data)
                if self.applier.bye[0]:
                    why = "the owner quit"
                    rec = self.applier.bye[1]
                    if rec:
                        self.recording = rec
                    break
        except (OSError, ValueError):
            why = "the view socket failed"
        finally:
            with contextlib.suppress(OSError):
                f.close()
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
            self.ended = why
        if not self._stopping:
            on_end(self)

    def stop(self) -> None:
        """Detach (the owner lets the view go)."""
        self._stopping = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
