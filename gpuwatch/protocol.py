"""The gpuwatch wire protocol, version 1: one JSON object per Unix datagram.

This module is the only one that the training side (``gpuwatch.instrument``) and the
dashboard side share. It imports nothing beyond the standard library, so importing it in a
training process costs next to nothing. ``docs/protocol.md`` is the human-readable contract;
this module implements it once: encoding on the sending side, validation on the receiving
side, and the socket path both agree on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
"""Major protocol version. A receiver accepts exactly this value of ``v``."""

MAX_DATAGRAM = 64 * 1024
"""Largest datagram in bytes. Larger ones are rejected by the receiver (and never sent)."""

MAX_NAME = 128
"""Longest phase name (characters)."""

MAX_TEXT = 1024
"""Longest mark, OOM message or argv element (characters)."""

KINDS = ("hello", "facts", "phase", "mark", "memory", "oom", "bye")
LEVELS = ("info", "warning", "error")
PHASE_EVENTS = ("begin", "end")

SOCKET_ENV = "GPUWATCH_SOCKET"
SOCKET_NAME = "gpuwatch.sock"


class ProtocolError(ValueError):
    """A datagram that does not follow the protocol.

    Attributes:
        reason: A short, stable reason code (``"json"``, ``"version"``, ``"kind"``,
            ``"field"``, ``"size"``), used by the receiver to count rejects by cause.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class Message:
    """One validated message.

    Attributes:
        kind: One of :data:`KINDS`.
        pid: Sender's process id.
        seq: Sender's sequence number; gaps mean dropped events.
        t: ``time.monotonic_ns()`` on the sender when the event happened.
        dropped: Events the sender has dropped so far (cumulative).
        body: The kind-specific fields, validated; unknown fields are removed.
    """

    kind: str
    pid: int
    seq: int
    t: int
    dropped: int = 0
    body: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- socket path


def socket_path(env: dict[str, str] | None = None) -> str:
    """The socket path: ``$GPUWATCH_SOCKET`` if set, else the per-user default."""
    env = os.environ if env is None else env
    explicit = env.get(SOCKET_ENV)
    if explicit:
        return os.path.abspath(explicit)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "gpuwatch", SOCKET_NAME)
    return os.path.join("/tmp", f"gpuwatch-{os.getuid()}", SOCKET_NAME)


# --------------------------------------------------------------------------- encoding


def encode(kind: str, pid: int, seq: int, t: int, dropped: int, body: dict[str, Any]) -> bytes:
    """Encode one message. Raises :class:`ProtocolError` if it would be oversized."""
    obj = {"v": VERSION, "kind": kind, "seq": seq, "pid": pid, "t": t}
    if dropped:
        obj["dropped"] = dropped
    obj.update(body)
    data = json.dumps(obj, separators=(",", ":"), default=str).encode()
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError("size", f"{len(data)} bytes > {MAX_DATAGRAM}")
    return data


_quoted: dict[str, str] = {}


def _quote(text: str) -> str:
    """JSON string literal of ``text``, cached: phase names repeat every step."""
    q = _quoted.get(text)
    if q is None:
        q = json.dumps(text)
        if len(_quoted) < 4096:
            _quoted[text] = q
    return q


def _num(v: int | None) -> str:
    return "null" if v is None else str(int(v))


def encode_phase(
    pid: int,
    seq: int,
    t: int,
    dropped: int,
    event: str,
    name: str,
    sid: int,
    parent: int | None,
    depth: int,
    step: int | None,
    figures: tuple[Any, ...] | None = None,
    error: str | None = None,
) -> bytes:
    """Encode a ``phase`` message: the same JSON :func:`encode` makes, a few times faster.

    Phase boundaries are most of what a training process sends, and the sender thread's
    time is taken from the training process, so this kind gets a formatter of its own.

    Args:
        figures: ``(dev, allocated, reserved, peak_allocated, peak_reserved)``, optionally
            followed by ``(inactive_split, alloc_retries, alloc_ooms)``; the peaks may be
            None (not reported).
    """
    parts = [
        f'{{"v":{VERSION},"kind":"phase","seq":{seq},"pid":{pid},"t":{t}',
        f',"dropped":{dropped}' if dropped else "",
        f',"event":{_quote(event)},"name":{_quote(name)},"id":{sid}',
        f',"parent":{_num(parent)},"depth":{depth},"step":{_num(step)}',
    ]
    if error is not None:
        parts.append(f',"error":{json.dumps(error)}')
    if figures is not None:
        dev, allocated, reserved, peak_a, peak_r = figures[:5]
        parts.append(
            f',"dev":{_num(dev)},"allocated":{_num(allocated)},"reserved":{_num(reserved)}'
        )
        if peak_a is not None:
            parts.append(f',"peak_allocated":{_num(peak_a)},"peak_reserved":{_num(peak_r)}')
        if len(figures) > 5:
            split, retries, ooms = figures[5:8]
            parts.append(
                f',"inactive_split":{_num(split)},"alloc_retries":{_num(retries)}'
                f',"alloc_ooms":{_num(ooms)}'
            )
    parts.append("}")
    data = "".join(parts).encode()
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError("size", f"{len(data)} bytes > {MAX_DATAGRAM}")
    return data


# --------------------------------------------------------------------------- validation

# A field spec is (type-check, required). Type checks are small functions so that bool is
# never mistaken for int (json gives True for `true`, and isinstance(True, int) holds).


def _int(v: Any) -> bool:
    return type(v) is int and v >= 0


def _opt_int(v: Any) -> bool:
    return v is None or _int(v)


def _opt_int_any(v: Any) -> bool:
    return v is None or type(v) is int


def _str(limit: int):
    def check(v: Any) -> bool:
        return isinstance(v, str) and len(v) <= limit

    return check


def _opt_str(limit: int):
    inner = _str(limit)

    def check(v: Any) -> bool:
        return v is None or inner(v)

    return check


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _obj(v: Any) -> bool:
    return isinstance(v, dict)


def _opt_obj(v: Any) -> bool:
    return v is None or isinstance(v, dict)


def _argv(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(a, str) and len(a) <= MAX_TEXT for a in v)


def _one_of(options: tuple[str, ...]):
    def check(v: Any) -> bool:
        return v in options

    return check


def _device(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _int(v.get("index"))
        and isinstance(v.get("uuid", ""), str)
        and isinstance(v.get("name", ""), str)
        and _opt_int(v.get("total"))
    )


def _devices(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= 64 and all(_device(d) for d in v)


_MEMORY_FIELDS = {
    "dev": (_opt_int, False),
    "allocated": (_opt_int, False),
    "reserved": (_opt_int, False),
    "peak_allocated": (_opt_int, False),
    "peak_reserved": (_opt_int, False),
    "inactive_split": (_opt_int, False),
    "alloc_retries": (_opt_int, False),
    "alloc_ooms": (_opt_int, False),
}

SCHEMA: dict[str, dict[str, tuple[Any, bool]]] = {
    "hello": {
        "argv": (_argv, False),
        "hostname": (_str(256), False),
        "wall_ns": (_int, False),
        "rank": (_opt_int, False),
        "local_rank": (_opt_int, False),
        "world_size": (_opt_int, False),
        "python": (_opt_str(64), False),
        "torch": (_opt_str(64), False),
        "client": (_opt_str(64), False),
        "devices": (_devices, False),
        "peaks": (_bool, False),
        "sync": (_bool, False),
        "facts": (_opt_obj, False),
    },
    "facts": {"facts": (_obj, True)},
    "phase": {
        "event": (_one_of(PHASE_EVENTS), True),
        "name": (_str(MAX_NAME), True),
        "id": (_int, True),
        "parent": (_opt_int, False),
        "depth": (_int, False),
        "step": (_opt_int_any, False),
        "error": (_opt_str(MAX_TEXT), False),
        **_MEMORY_FIELDS,
    },
    "mark": {
        "text": (_str(MAX_TEXT), True),
        "level": (_one_of(LEVELS), False),
        "step": (_opt_int_any, False),
    },
    "memory": {**_MEMORY_FIELDS},
    "oom": {
        "requested": (_opt_int, False),
        "free": (_opt_int, False),
        "total": (_opt_int, False),
        "phase": (_opt_str(MAX_NAME), False),
        "step": (_opt_int_any, False),
        "message": (_opt_str(MAX_TEXT * 4), False),
        "snapshot": (_opt_str(4096), False),
        **_MEMORY_FIELDS,
    },
    "bye": {
        "exit_code": (_opt_int_any, False),
        "reason": (_opt_str(MAX_TEXT), False),
    },
}

_DEFAULTS = {"mark": {"level": "info"}, "phase": {"depth": 0}}


def decode(data: bytes) -> Message:
    """Validate one datagram and return its :class:`Message`.

    Unknown fields are dropped (a newer v1 sender may add fields); a wrong type, a missing
    required field, an unknown kind or version, or an oversized datagram raises
    :class:`ProtocolError`.
    """
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError("size", f"{len(data)} bytes")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("json", str(exc)[:80])
    if not isinstance(obj, dict):
        raise ProtocolError("json", "not an object")
    if obj.get("v") != VERSION or type(obj.get("v")) is not int:
        raise ProtocolError("version", repr(obj.get("v"))[:20])
    kind = obj.get("kind")
    spec = SCHEMA.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ProtocolError("kind", repr(kind)[:40])
    for name, check in (("seq", _int), ("pid", _int), ("t", _int)):
        if not check(obj.get(name)):
            raise ProtocolError("field", f"{kind}.{name}")
    if obj["pid"] == 0:
        raise ProtocolError("field", f"{kind}.pid")
    dropped = obj.get("dropped", 0)
    if not _int(dropped):
        raise ProtocolError("field", f"{kind}.dropped")
    body: dict[str, Any] = dict(_DEFAULTS.get(kind, {}))
    for name, (check, required) in spec.items():
        if name in obj:
            value = obj[name]
            if not check(value):
                raise ProtocolError("field", f"{kind}.{name}")
            body[name] = value
        elif required:
            raise ProtocolError("field", f"{kind}.{name} missing")
    return Message(
        kind=kind, pid=obj["pid"], seq=obj["seq"], t=obj["t"], dropped=dropped, body=body
    )
