"""Protocol v1: encoding, validation, and the socket path rules."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch import protocol
from gpuwatch.protocol import ProtocolError, decode, encode


def _raw(**fields: object) -> bytes:
    base = {"v": 1, "kind": "mark", "seq": 0, "pid": 123, "t": 5, "text": "hi"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (
            "hello",
            {
                "argv": ["train.py", "--lr", "1"],
                "rank": 0,
                "world_size": 2,
                "devices": [{"index": 0, "uuid": "abc", "name": "H100", "total": 80}],
            },
        ),
        ("facts", {"facts": {"params": [{"dtype": "float32", "count": 10}]}}),
        (
            "phase",
            {
                "event": "begin",
                "name": "forward",
                "id": 7,
                "parent": None,
                "step": 3,
                "allocated": 10,
                "reserved": 20,
                "peak_allocated": 15,
                "peak_reserved": 20,
                "dev": 0,
            },
        ),
        ("mark", {"text": "checkpoint saved", "level": "warning"}),
        ("memory", {"dev": 1, "allocated": 1, "reserved": 2}),
        ("oom", {"requested": 1 << 30, "free": 0, "total": 80, "phase": "forward"}),
        ("bye", {"exit_code": 0, "reason": "exit"}),
    ],
)
def test_round_trip(kind: str, body: dict) -> None:
    msg = decode(encode(kind, 42, 9, 1234, 3, body))
    assert (msg.kind, msg.pid, msg.seq, msg.t, msg.dropped) == (kind, 42, 9, 1234, 3)
    for key, value in body.items():
        assert msg.body[key] == value


def test_unknown_fields_are_ignored() -> None:
    msg = decode(_raw(future_field={"x": 1}))
    assert "future_field" not in msg.body
    assert msg.body["text"] == "hi"
    assert msg.body["level"] == "info"  # default


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json", "json"),
        (b"[1, 2]", "json"),
        (b"\xff\xfe", "json"),
        (_raw(v=2), "version"),
        (_raw(v="1"), "version"),
        (_raw(v=True), "version"),
        (_raw(v=...), "version"),
        (_raw(kind="teleport"), "kind"),
        (_raw(kind=None), "kind"),
        (_raw(pid=-1), "range"),
        (_raw(pid=0), "range"),
        (_raw(pid=True), "field"),
        (_raw(seq=1.5), "field"),
        (_raw(t="now"), "field"),
        (_raw(text=...), "field"),
        (_raw(text=5), "field"),
        (_raw(text="x" * 5000), "field"),
        (_raw(level="fatal"), "field"),
        (_raw(dropped=-3), "range"),
        (_raw(kind="phase", event="middle", name="f", id=1), "field"),
        (_raw(kind="phase", event="begin", name="f", id=1, allocated=-5), "range"),
        (_raw(kind="phase", event="begin", name="f", id=1, allocated=True), "field"),
        (_raw(kind="hello", argv="python train.py"), "field"),
        (_raw(kind="hello", devices=[{"index": "0"}]), "field"),
        (_raw(kind="facts", facts=[1, 2]), "field"),
        (b"{" + b" " * protocol.MAX_DATAGRAM + b"}", "size"),
    ],
)
def test_rejects(data: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(data)
    assert info.value.reason == reason


def test_encode_refuses_oversized() -> None:
    with pytest.raises(ProtocolError):
        encode("facts", 1, 0, 0, 0, {"facts": {"blob": "x" * protocol.MAX_DATAGRAM}})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decode_random_bytes_only_raises_protocol_error(data: bytes) -> None:
    try:
        decode(data)
    except ProtocolError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(protocol.KINDS),
    st.dictionaries(
        st.sampled_from(
            [
                "event",
                "name",
                "id",
                "text",
                "level",
                "argv",
                "facts",
                "allocated",
                "devices",
                "step",
                "exit_code",
                "dev",
            ]
        ),
        json_values,
        max_size=6,
    ),
)
def test_decode_random_objects_only_raises_protocol_error(kind: str, fields: dict) -> None:
    obj = {"v": 1, "kind": kind, "seq": 1, "pid": 2, "t": 3, **fields}
    try:
        msg = decode(json.dumps(obj).encode())
    except ProtocolError:
        return
    assert msg.kind == kind


def test_socket_path_order(tmp_path) -> None:
    assert protocol.socket_path({"GPUWATCH_SOCKET": "/x/y.sock"}) == "/x/y.sock"
    runtime = str(tmp_path)
    assert protocol.socket_path({"XDG_RUNTIME_DIR": runtime}) == os.path.join(
        runtime, "gpuwatch", "gpuwatch.sock"
    )
    assert protocol.socket_path({}) == f"/tmp/gpuwatch-{os.getuid()}/gpuwatch.sock"
    # A runtime dir that does not exist is skipped.
    assert protocol.socket_path({"XDG_RUNTIME_DIR": "/nonexistent/dir"}).startswith("/tmp/")


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, protocol.MAX_PID),
    st.integers(0, 2**40),
    st.integers(0, 2**62),
    st.integers(0, 99),
    st.sampled_from(protocol.PHASE_EVENTS),
    st.text(max_size=40),
    st.integers(0, 2**40),
    st.none() | st.integers(0, 2**40),
    st.integers(0, 20),
    st.none() | st.integers(-5, 2**40),
    st.none()
    | st.tuples(
        st.integers(0, 7),
        st.integers(0, 2**45),
        st.integers(0, 2**45),
        st.none() | st.integers(0, 2**45),
        st.integers(0, 2**45),
    ),
    st.none() | st.text(max_size=20),
)
def test_fast_phase_encoder_says_what_encode_says(
    pid, seq, t, dropped, event, name, sid, parent, depth, step, fig, error
) -> None:
    fast = protocol.encode_phase(
        pid, seq, t, dropped, event, name, sid, parent, depth, step, fig, error
    )
    body = {"event": event, "name": name, "id": sid, "parent": parent, "depth": depth, "step": step}
    if error is not None:
        body["error"] = error
    if fig is not None:
        body.update(dev=fig[0], allocated=fig[1], reserved=fig[2])
        if fig[3] is not None:
            body.update(peak_allocated=fig[3], peak_reserved=fig[4])
    assert json.loads(fast) == json.loads(encode("phase", pid, seq, t, dropped, body))
    if len(name) <= protocol.MAX_NAME:
        assert decode(fast).body["name"] == name


# ---------------------------------------------------------------------- ranges: hostile values


def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


NOW = 10**15  # the receiver's clock in these tests (~11.6 days of uptime)
BIG = 2**63  # one past SQLite's and numpy's int64
PHASE = {"kind": "phase", "event": "end", "name": "forward", "id": 1}
HOSTILE = [
    # Valid JSON, right types, values no real process sends: each would reach a table, a file
    # or an axis. (fields, reason)
    ({"t": BIG}, "range"),
    ({"t": BIG - 1}, "time"),  # 292 years ahead
    ({"t": 0}, "time"),  # the boot: an axis reaching back days
    ({"t": NOW - protocol.PAST_NS - 1}, "time"),
    ({"t": NOW + protocol.FUTURE_NS + 1}, "time"),
    ({"pid": BIG}, "range"),
    ({"pid": protocol.MAX_PID + 1}, "range"),
    ({"seq": BIG}, "range"),
    ({"dropped": 10**30}, "range"),
    ({**PHASE, "allocated": BIG}, "range"),
    ({**PHASE, "reserved": protocol.MAX_BYTES + 1}, "range"),
    ({**PHASE, "peak_allocated": 10**40}, "range"),
    ({**PHASE, "id": BIG}, "range"),
    ({**PHASE, "parent": -1}, "range"),
    ({**PHASE, "depth": 10**6}, "range"),
    ({**PHASE, "step": BIG}, "range"),
    ({**PHASE, "step": -BIG}, "range"),
    ({**PHASE, "dev": 10**9}, "range"),
    ({"kind": "memory", "allocated": BIG, "reserved": 0}, "range"),
    ({"kind": "oom", "requested": BIG}, "range"),
    ({"kind": "oom", "total": -1}, "range"),
    ({"kind": "bye", "exit_code": BIG}, "range"),
    ({"kind": "bye", "exit_code": -BIG}, "range"),
    ({"kind": "mark", "text": "x", "step": BIG}, "range"),
    ({"kind": "hello", "wall_ns": BIG}, "range"),
    ({"kind": "hello", "rank": BIG}, "range"),
    ({"kind": "hello", "world_size": -1}, "range"),
    ({"kind": "hello", "devices": [{"index": i, "uuid": f"u{i}"} for i in range(63)]}, "range"),
    ({"kind": "hello", "devices": [{"index": 0, "total": BIG}]}, "range"),
    ({"kind": "hello", "devices": [{"index": BIG}]}, "range"),
    ({"kind": "facts", "facts": {"params": {"bytes": BIG}}}, "range"),
    ({"kind": "facts", "facts": {"params": {"bytes": 1e308 * 10}}}, "json"),  # inf in JSON
    ({"kind": "hello", "facts": {"deep": _nested(protocol.MAX_FACTS_DEPTH + 1)}}, "field"),
]


@pytest.mark.parametrize(("fields", "reason"), HOSTILE)
def test_hostile_values_are_rejected_by_range(fields: dict, reason: str) -> None:
    obj = {"v": 1, "kind": "mark", "seq": 0, "pid": 123, "t": NOW - 10**6, "text": "hi"}
    obj.update(fields)
    if obj["kind"] != "mark":
        obj.pop("text")
    data = json.dumps(obj).encode()
    with pytest.raises(ProtocolError) as info:
        decode(data, now=NOW)
    assert info.value.reason == reason


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_json_constants_are_not_numbers(constant: bytes) -> None:
    # Python's json reads them; the recording's JSON writer refuses them (allow_nan=False),
    # so one NaN in a facts object would have stopped the recording at its next commit.
    data = b'{"v":1,"kind":"facts","seq":0,"pid":5,"t":1,"facts":{"x":' + constant + b"}}"
    with pytest.raises(ProtocolError) as info:
        decode(data)
    assert info.value.reason == "json"


def test_deep_nesting_is_a_json_reject_not_a_crash() -> None:
    data = b'{"v":1,"kind":"facts","seq":0,"pid":5,"t":1,"facts":' + b"[" * 60000
    with pytest.raises(ProtocolError):
        decode(data)


def test_the_clock_window_admits_a_late_begin_and_the_present() -> None:
    late = {**PHASE, "event": "begin", "t": NOW - protocol.PAST_NS + 1}
    for fields in (late, {"t": NOW}, {"t": NOW + 10**6}):
        obj = {"v": 1, "kind": "mark", "seq": 0, "pid": 123, "text": "hi", **fields}
        assert decode(json.dumps(obj).encode(), now=NOW).t == fields["t"]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(protocol.KINDS),
    st.dictionaries(
        st.sampled_from(
            [
                "t",
                "pid",
                "seq",
                "dropped",
                "allocated",
                "reserved",
                "peak_allocated",
                "requested",
                "free",
                "total",
                "exit_code",
                "step",
                "id",
                "parent",
                "depth",
                "dev",
                "wall_ns",
                "rank",
                "world_size",
            ]
        ),
        st.integers(-(2**70), 2**70),
        max_size=5,
    ),
)
def test_any_integer_that_decodes_fits_int64_and_its_range(kind: str, fields: dict) -> None:
    obj = {
        "v": 1,
        "kind": kind,
        "seq": 1,
        "pid": 2,
        "t": NOW,
        "text": "x",
        "facts": {},
        "event": "end",
        "name": "f",
        "id": 1,
        **fields,
    }
    try:
        msg = decode(json.dumps(obj).encode(), now=NOW)
    except ProtocolError as exc:
        assert exc.reason in ("range", "time", "field")
        return
    assert 0 < msg.pid <= protocol.MAX_PID
    assert abs(msg.t - NOW) <= protocol.PAST_NS
    for value in msg.body.values():
        if type(value) is int:
            assert -(2**63) < value < 2**63
