"""The gpuwatch wire protocol, version 1: one JSON object per Unix datagram.

This module is the only one that the training side (``gpuwatch.instrument``) and the
dashboard side share. It imports nothing beyond the standard library, so importing it in a
training process costs next to nothing. ``docs/protocol.md`` is the human-readable contract;
this module implements it once: encoding on the sending side, validation on the receiving
side, and the socket path both agree on.
"""

from __future__ import annotations

import json
import math
import os
import string
from collections.abc import Callable, Mapping
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

KINDS = ("hello", "facts", "phase", "mark", "memory", "oom", "stats", "bye")
LEVELS = ("info", "warning", "error")
PHASE_EVENTS = ("begin", "end")

SOCKET_ENV = "GPUWATCH_SOCKET"
SOCKET_NAME = "gpuwatch.sock"


class ProtocolError(ValueError):
    """A datagram that does not follow the protocol.

    Attributes:
        reason: A short, stable reason code (``"json"``, ``"version"``, ``"kind"``,
            ``"field"``, ``"range"``, ``"time"``, ``"size"``, ``"identity"``), used by the
            receiver to count rejects by cause.
        seq: The datagram's sequence number when it is a JSON object with a valid one
            (its sender used that number up: the receiver counts it as rejected, not lost).
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.seq: int | None = None


@dataclass(slots=True)
class Message:
    """One validated message.

    Attributes:
        kind: One of :data:`KINDS`.
        pid: Sender's process id.
        seq: Sender's sequence number: datagrams it sent before this one (a gap means
            datagrams lost on the way; drops at send use up no number).
        t: ``time.monotonic_ns()`` on the sender when the event happened.
        dropped: Events the sender has dropped so far (cumulative).
        body: The kind-specific fields, validated; unknown fields are removed.
        container_pid: The pid the datagram claimed, when the kernel's differs (a process
            in a container names its pid in its own PID namespace); None otherwise.
    """

    kind: str
    pid: int
    seq: int
    t: int
    dropped: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    container_pid: int | None = None


# --------------------------------------------------------------------------- socket path


def socket_path(env: Mapping[str, str] | None = None) -> str:
    """The socket path: ``$GPUWATCH_SOCKET`` if set, else the per-user default."""
    if env is None:
        env = os.environ
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

# Every number a datagram carries has a range: a value no real process could send is
# rejected (reason ``range``, or ``time`` for a timestamp off the receiver's clock) before
# it can reach a table, a file or an axis. The ranges also keep every integer inside
# SQLite's and numpy's int64.

MAX_PID = 4_194_304
"""Largest pid Linux can issue (``PID_MAX_LIMIT`` on 64-bit kernels)."""

MAX_BYTES = 2**50
"""Largest byte count accepted (1 PiB): more memory than any device or host has."""

MAX_COUNT = 2**53
"""Largest sequence number, span id, step or drop count (exact in a double, far from 2^63)."""

MAX_DEVICE_INDEX = 1023
MAX_DEVICES = 16
"""Most CUDA devices one ``hello`` may list (the largest single hosts have 16 GPUs)."""

MAX_DEPTH = 256
"""Deepest phase nesting accepted."""

MAX_RANK = 2**20
"""Largest rank / world size accepted."""

MAX_FACTS_DEPTH = 16
"""Deepest nesting of objects and lists inside ``facts``."""

PAST_NS = 15 * 60 * 10**9
"""How far before the receiver's clock a timestamp may lie: a message waits in the
sender's queue for milliseconds, and a ``begin`` sent late (the automatic ``data`` phase)
carries the time its phase began, at most a data-loading wait ago."""

FUTURE_NS = 10 * 10**9
"""How far after the receiver's clock a timestamp may lie (CLOCK_MONOTONIC is shared by
every process of the host, so only scheduling separates the two readings)."""

T_MAX = 2**63 - 1

# A field spec is (check, required). Checks are small functions returning a reject reason
# ("field" for a wrong type, "range" for a number out of range) or None when the value is
# good; bool is never mistaken for int (json gives True for `true`, and
# isinstance(True, int) holds).

Check = Callable[[Any], "str | None"]


def _int(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        if type(v) is not int:
            return "field"
        return None if lo <= v <= hi else "range"

    return check


def _opt(inner: Check) -> Check:
    def check(v: Any) -> str | None:
        return None if v is None else inner(v)

    return check


def _str(limit: int) -> Check:
    def check(v: Any) -> str | None:
        return None if isinstance(v, str) and len(v) <= limit else "field"

    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "field"


def _facts(v: Any) -> str | None:
    """A facts object: JSON of bounded depth whose numbers are finite and in range."""
    if not isinstance(v, dict):
        return "field"
    stack: list[tuple[Any, int]] = [(v, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        elif type(value) is int:
            if not -MAX_COUNT <= value <= MAX_COUNT:
                return "range"
            continue
        elif type(value) is float:
            if not math.isfinite(value):
                return "range"
            continue
        else:
            continue
        if depth >= MAX_FACTS_DEPTH:
            return "field"
        stack.extend((c, depth + 1) for c in children)
    return None


def _opt_facts(v: Any) -> str | None:
    return None if v is None else _facts(v)


def _argv(v: Any) -> str | None:
    ok = isinstance(v, list) and len(v) <= 64
    return None if ok and all(isinstance(a, str) and len(a) <= MAX_TEXT for a in v) else "field"


def _one_of(options: tuple[str, ...]) -> Check:
    def check(v: Any) -> str | None:
        return None if isinstance(v, str) and v in options else "field"

    return check


_count = _int(0, MAX_COUNT)
_bytes = _int(0, MAX_BYTES)
_opt_bytes = _opt(_bytes)
_dev_index = _int(0, MAX_DEVICE_INDEX)
_step = _opt(_int(-MAX_COUNT, MAX_COUNT))
_rank = _opt(_int(0, MAX_RANK))


SCHEDULER_KEYS = (
    "slurm_job",
    "slurm_step",
    "slurm_procid",
    "slurm_nodelist",
    "k8s_namespace",
    "k8s_pod",
    "k8s_job",
    "job_name",
    "torch_run",
    "torch_master",
)
"""The scheduler identity a ``hello`` may carry (``docs/protocol.md``, ``scheduler``); the
exporter turns them into labels (``docs/prometheus.md``)."""

MAX_LABEL = 128
"""Longest scheduler value (characters)."""

_LABEL_CHARS = frozenset(string.ascii_letters + string.digits + "._-:/@+,=[]")
_KEY_CHARS = frozenset(string.ascii_lowercase + string.digits + "_")


def label_text(value: object) -> str:
    """``value`` as a bounded label value: at most :data:`MAX_LABEL` characters, each
    outside ``[A-Za-z0-9._-:/@+,=[]]`` (quotes, spaces, newlines, non-ASCII) replaced by
    ``_``. Anything but a string is ``""``. Never raises."""
    if not isinstance(value, str):
        return ""
    value = value[:MAX_LABEL]
    if all(c in _LABEL_CHARS for c in value):
        return value
    return "".join(c if c in _LABEL_CHARS else "_" for c in value)


def job_id(scheduler: Mapping[str, object], host: str) -> str:
    """The job a process is part of, as one label value (``docs/prometheus.md``, ``job_id``).

    The first the scheduler identity names: ``slurm:JOB.STEP`` (``slurm:JOB`` without a
    step), ``k8s:NAMESPACE/JOB``, ``name:GPUWATCH_JOB_NAME``, ``torchrun:RUN_ID`` (torchrun's
    default run id ``none`` names no run), ``torchrun:MASTER_ADDR:MASTER_PORT`` (the
    rendezvous of a plain torchrun or ``init_process_group``); else ``host:HOST``, so the
    ranks of unlabelled runs are compared only with those of the same host. Each part is
    cleaned by :func:`label_text` first. Never raises.
    """
    part = {k: label_text(scheduler.get(k)) for k in SCHEDULER_KEYS}
    if part["slurm_job"]:
        step = f".{part['slurm_step']}" if part["slurm_step"] else ""
        found = f"slurm:{part['slurm_job']}{step}"
    elif part["k8s_job"]:
        space = f"{part['k8s_namespace']}/" if part["k8s_namespace"] else ""
        found = f"k8s:{space}{part['k8s_job']}"
    elif part["job_name"]:
        found = f"name:{part['job_name']}"
    elif part["torch_run"] and part["torch_run"] != "none":
        found = f"torchrun:{part['torch_run']}"
    elif part["torch_master"]:
        found = f"torchrun:{part['torch_master']}"
    else:
        found = f"host:{label_text(host)}"
    return label_text(found)


def _scheduler(v: Any) -> str | None:
    """A ``scheduler`` object: at most 16 short lower-case keys, each value already a
    :func:`label_text` (a real client sanitizes before it sends)."""
    if not isinstance(v, dict) or len(v) > 16:
        return "field"
    for key, value in v.items():
        if not (0 < len(key) <= 32 and all(c in _KEY_CHARS for c in key)):
            return "field"
        if not isinstance(value, str) or label_text(value) != value:
            return "field"
    return None


def _devices(v: Any) -> str | None:
    if not isinstance(v, list):
        return "field"
    if len(v) > MAX_DEVICES:
        return "range"
    for d in v:
        if not isinstance(d, dict):
            return "field"
        for reason in (
            _dev_index(d.get("index")),
            _str(128)(d.get("uuid", "")),
            _str(256)(d.get("name", "")),
            _opt_bytes(d.get("total")),
        ):
            if reason:
                return reason
    return None


_MEMORY_FIELDS: dict[str, tuple[Check, bool]] = {
    "dev": (_opt(_dev_index), False),
    "allocated": (_opt_bytes, False),
    "reserved": (_opt_bytes, False),
    "peak_allocated": (_opt_bytes, False),
    "peak_reserved": (_opt_bytes, False),
    # The allocator's fragmentation figures from the same read: cached bytes in split
    # blocks (unusable for a larger request), cudaMalloc retries and OOMs so far.
    "inactive_split": (_opt_bytes, False),
    "alloc_retries": (_opt(_count), False),
    "alloc_ooms": (_opt(_count), False),
}

SCHEMA: dict[str, dict[str, tuple[Check, bool]]] = {
    "hello": {
        "argv": (_argv, False),
        "hostname": (_str(256), False),
        "wall_ns": (_int(0, T_MAX), False),
        "rank": (_rank, False),
        "local_rank": (_rank, False),
        "world_size": (_rank, False),
        "python": (_opt(_str(64)), False),
        "torch": (_opt(_str(64)), False),
        "client": (_opt(_str(64)), False),
        "devices": (_devices, False),
        "peaks": (_bool, False),
        "sync": (_bool, False),
        "facts": (_opt_facts, False),
        "scheduler": (_scheduler, False),
        "notebook": (_opt(_str(MAX_TEXT)), False),
    },
    "facts": {"facts": (_facts, True)},
    "phase": {
        "event": (_one_of(PHASE_EVENTS), True),
        "name": (_str(MAX_NAME), True),
        "id": (_count, True),
        "parent": (_opt(_count), False),
        "depth": (_int(0, MAX_DEPTH), False),
        "step": (_step, False),
        "error": (_opt(_str(MAX_TEXT)), False),
        **_MEMORY_FIELDS,
    },
    "mark": {
        "text": (_str(MAX_TEXT), True),
        "level": (_one_of(LEVELS), False),
        "step": (_step, False),
    },
    "memory": {**_MEMORY_FIELDS},
    "oom": {
        "requested": (_opt_bytes, False),
        "free": (_opt_bytes, False),
        "total": (_opt_bytes, False),
        "phase": (_opt(_str(MAX_NAME)), False),
        "step": (_step, False),
        "message": (_opt(_str(MAX_TEXT * 4)), False),
        "snapshot": (_opt(_str(4096)), False),
        **_MEMORY_FIELDS,
    },
    "stats": {},
    "bye": {
        "exit_code": (_opt(_int(-(2**31), 2**31 - 1)), False),
        "reason": (_opt(_str(MAX_TEXT)), False),
    },
}

_DEFAULTS: dict[str, dict[str, object]] = {"mark": {"level": "info"}, "phase": {"depth": 0}}
_COMMON: tuple[tuple[str, Check], ...] = (
    ("seq", _count),
    ("pid", _int(1, MAX_PID)),
    ("t", _int(0, T_MAX)),
    ("dropped", _count),
)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder for every datagram: json.loads(..., parse_constant=...) would build a new
# one per call, a large share of what decoding a phase boundary costs.
_JSON = json.JSONDecoder(parse_constant=_no_constant)


def decode(data: bytes, now: int | None = None) -> Message:
    """Validate one datagram and return its :class:`Message`.

    Unknown fields are dropped (a newer v1 sender may add fields); a wrong type, a value
    out of its range, a missing required field, an unknown kind or version, or an
    oversized datagram raises :class:`ProtocolError`.

    Args:
        data: The datagram.
        now: The receiver's ``time.monotonic_ns()``; when given, ``t`` must lie within
            :data:`PAST_NS` before it and :data:`FUTURE_NS` after it (reason ``time``).
    """
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError("size", f"{len(data)} bytes")
    try:
        obj = _JSON.decode(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError("json", str(exc)[:80])
    if not isinstance(obj, dict):
        raise ProtocolError("json", "not an object")
    try:
        return _validate(obj, now)
    except ProtocolError as exc:
        seq = obj.get("seq")
        exc.seq = seq if _count(seq) is None else None
        raise


def _validate(obj: dict[str, Any], now: int | None) -> Message:
    """The :class:`Message` of a decoded JSON object; :class:`ProtocolError` if invalid."""
    if obj.get("v") != VERSION or type(obj.get("v")) is not int:
        raise ProtocolError("version", repr(obj.get("v"))[:20])
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in SCHEMA:
        raise ProtocolError("kind", repr(kind)[:40])
    spec = SCHEMA[kind]
    obj.setdefault("dropped", 0)
    for name, check in _COMMON:
        reason = check(obj.get(name))
        if reason:
            raise ProtocolError(reason, f"{kind}.{name}")
    t = obj["t"]
    if now is not None and not now - PAST_NS <= t <= now + FUTURE_NS:
        raise ProtocolError("time", f"{kind}.t is {(t - now) / 1e9:+.0f} s off the clock")
    body: dict[str, Any] = dict(_DEFAULTS.get(kind, {}))
    for name, (check, required) in spec.items():
        if name in obj:
            value = obj[name]
            reason = check(value)
            if reason:
                raise ProtocolError(reason, f"{kind}.{name}")
            body[name] = value
        elif required:
            raise ProtocolError("field", f"{kind}.{name} missing")
    return Message(
        kind=kind, pid=obj["pid"], seq=obj["seq"], t=t, dropped=obj["dropped"], body=body
    )


def clean(kind: str, body: Any) -> dict[str, Any]:
    """The fields of a ``kind`` body that pass their checks; the rest are dropped.

    For bodies read back from recordings: an older gpuwatch, another writer or a hand may
    have stored what no receiver validated. Types and ranges are checked as :func:`decode`
    checks them; a missing required field is simply absent (the caller decides).
    """
    spec = SCHEMA.get(kind)
    if spec is None or not isinstance(body, dict):
        return {}
    return {
        name: body[name]
        for name, (check, _) in spec.items()
        if name in body and check(body[name]) is None
    }
