"""A recording's JSON bodies, made safe to use: right types, sane values, or left out.

A recording is a file people share: it may have been written by an older gpuwatch (whose
receiver checked no ranges), by another program, or edited by hand. What the format admits
(nulls, empty lists, missing keys) must open; what would break the dashboard (a string where
a number goes, a hello that is not an object) is dropped field by field, never the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from .. import protocol
from ..session import Device, OpenSpan
from ..session.process import MAX_EPOCH, MAX_EPOCHS, FactsEpoch

_INT64 = (-(2**63), 2**63 - 1)


def _int(value: Any, default: int | None = None) -> int | None:
    if type(value) is int and _INT64[0] <= value <= _INT64[1]:
        return value
    return default


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


_PROCESS_INTS = (
    "dropped",
    "gaps",
    "rejected",
    "last_seq",
    "first_t",
    "last_t",
    "max_segment",
    "max_span",
    "abandoned",
)
_PROCESS_OPT_INTS = ("last_boundary", "ended", "exit_code", "os_pid", "container_pid", "gone")


def process_state(body: Any) -> dict[str, Any]:
    """A process body's scalar state and hello/facts, each of the type ``Process`` holds."""
    body = body if isinstance(body, dict) else {}
    out: dict[str, Any] = {}
    for name in _PROCESS_INTS:
        value = _int(body.get(name))
        if value is not None:
            out[name] = value
    for name in _PROCESS_OPT_INTS:
        if name in body:
            out[name] = _int(body[name])
    for name in ("host", "origin"):
        if isinstance(body.get(name), str):
            out[name] = body[name]
    out["hello"] = protocol.clean("hello", body.get("hello"))
    facts = body.get("facts")
    out["facts"] = facts if isinstance(facts, dict) else None
    out["facts_log"] = facts_log(body.get("facts_log"), out["facts"])
    devices = body.get("devices")
    out["devices"] = {
        int(k): v
        for k, v in (devices.items() if isinstance(devices, dict) else ())
        if isinstance(k, str) and k.lstrip("-").isdigit() and isinstance(v, str)
    }
    out["torch_devs"] = _int_set(body.get("torch_devs"))
    return out


def facts_log(value: Any, facts: dict[str, Any] | None) -> tuple[FactsEpoch, ...]:
    """The models a process described, from a body's ``facts_log``: ``[start, epoch,
    facts]`` each, the last one ``[start, epoch]`` (its facts are the body's ``facts``).

    Empty (one model: the process's facts) where the body has none (older writers) or the
    log does not end in the body's facts. An entry that is not one is left out, as is one
    whose start goes back in time; only the first and the newest reach
    :data:`~gpuwatch.session.process.MAX_EPOCHS`.
    """
    if facts is None or not isinstance(value, list) or not value:
        return ()
    *earlier, last = value
    if not (isinstance(last, list) and len(last) == 2):
        return ()
    out: list[FactsEpoch] = []
    for entry in [*earlier, [*last, facts]]:
        if not (isinstance(entry, list) and len(entry) == 3):
            continue
        start, epoch, kept = _int(entry[0]), entry[1], entry[2]
        if start is None or (out and start < out[-1].start):
            continue
        if not (epoch is None or (type(epoch) is int and 0 <= epoch <= MAX_EPOCH)):
            epoch = None
        out.append(FactsEpoch(start, epoch, kept if isinstance(kept, dict) else None))
    if not out or out[-1].facts is not facts:
        return ()  # the latest was left out: the body's facts stand alone
    if len(out) > MAX_EPOCHS:
        out = [out[0], FactsEpoch(out[1].start, None, None), *out[2 - MAX_EPOCHS :]]
    return tuple(out)


def _int_set(value: Any) -> set[int]:
    """Device indices: a JSON list, or the ``"{0, 1}"`` text older writers made of a set."""
    if isinstance(value, list):
        return {v for v in value if type(v) is int}
    if isinstance(value, str):
        return {int(v) for v in re.findall(r"-?\d+", value)}
    return set()


_DEVICE_FIELDS = {f.name: f for f in dataclasses.fields(Device)}


def device(key: str, body: Any) -> Device:
    """A device from its body; ``key`` (the table's key) wins over the body's."""
    body = body if isinstance(body, dict) else {}
    kind = body.get("kind") if body.get("kind") in ("gpu", "host") else None
    if kind is None:
        kind = "host" if key == "host" or key.endswith("/host") else "gpu"
    dev = Device(key, kind)
    for name in ("name", "state", "note", "source", "origin", "uuid", "bus_id"):
        if isinstance(body.get(name), str):
            setattr(dev, name, body[name])
    dev.index = _int(body.get("index"))
    total = _int(body.get("total"))
    dev.total = total if total is not None and total >= 0 else None
    if isinstance(body.get("extra"), dict):
        dev.extra = body["extra"]
    return dev


_SPAN_OPT_INTS = ("step", "parent", "dev", "alloc0", "reserved0", "peak_alloc", "peak_reserved")
"""An open span's fields that are an integer or None (a bad value reads as None)."""


def open_span(body: Any) -> OpenSpan | None:
    """A phase still open when the file was last written, or None without id, name, start."""
    body = body if isinstance(body, dict) else {}
    sid, t0 = _int(body.get("id")), _int(body.get("t0"))
    name = body.get("name")
    if sid is None or t0 is None or not isinstance(name, str):
        return None
    depth = max(0, _int(body.get("depth"), 0) or 0)
    opt = {k: _int(body.get(k)) for k in _SPAN_OPT_INTS}
    return OpenSpan(id=sid, name=name, t0=t0, depth=depth, **opt)


def proc_info(body: Any) -> dict[str, Any]:
    """What psutil said of a pid: ``name``, ``user``, ``cmdline`` (text), ``visible``, and
    where known ``uid``, ``ppid``, ``started`` (wall seconds), ``container_pid`` and
    ``children`` (pids)."""
    body = body if isinstance(body, dict) else {}
    out: dict[str, Any] = {}
    for name in ("name", "user"):
        out[name] = body.get(name) if isinstance(body.get(name), str) else None
    cmdline = body.get("cmdline")
    if isinstance(cmdline, list):
        cmdline = [str(c) for c in cmdline]
    out["cmdline"] = cmdline if isinstance(cmdline, (str, list)) else None
    out["visible"] = body.get("visible") is not False
    for name in ("os_pid", "uid", "ppid", "container_pid"):
        value = _int(body.get(name))
        if value is not None:
            out[name] = value
    kids = body.get("children")
    if isinstance(kids, list):  # the children the samplers found (a DataLoader's workers)
        out["children"] = [k for k in kids[:64] if type(k) is int and 0 < k < 1 << 31]
    started = body.get("started")
    if type(started) in (int, float) and math.isfinite(started) and started > 0:
        out["started"] = float(started)
    return out


def event(kind: str, body: Any) -> dict[str, Any] | None:
    """A point event's body with only the fields its kind allows, or None if unusable."""
    if kind == "note":
        text = body.get("text") if isinstance(body, dict) else None
        return {"text": text} if isinstance(text, str) and text else None
    out = protocol.clean(kind, body)
    if kind == "mark" and "text" not in out:
        return None
    return out
