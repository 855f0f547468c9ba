"""A datagram checked in the relay and applied in gpuwatch: the same as checked in place."""

from __future__ import annotations

import json
import marshal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_protocol import HOSTILE, NOW

from gpuwatch import protocol
from gpuwatch.protocol import Message, encode
from gpuwatch.sources._datagram import checked, pack, unpack

T = NOW - 10**6
VALID = [
    encode("hello", 42, 0, T, 0, {"argv": ["train.py", "--lr", "1e-3"], "rank": 0, "world_size": 2,
                                  "devices": [{"index": 0, "uuid": "GPU-1", "total": 80}]}),
    encode("facts", 42, 1, T, 0, {"facts": {"params": [{"dtype": "float32", "count": 10}],
                                            "lr": 0.5, "name": "é\u2603\U0001f600"}}),
    encode("phase", 42, 2, T, 7, {"event": "begin", "name": "forward", "id": 3, "parent": None,
                                  "step": 1, "allocated": 10, "reserved": 2**49}),
    encode("mark", 42, 3, T, 0, {"text": "x" * protocol.MAX_TEXT, "level": "warning"}),
    encode("oom", 42, 4, T, 0, {"requested": 1 << 30, "phase": "backward"}),
    encode("bye", 42, 5, T, 0, {"exit_code": -9, "reason": "signal"}),
]  # fmt: skip


def _same(data: bytes, sender: int | None) -> None:
    here = checked(data, sender, NOW)
    there = unpack(pack(data, sender, NOW))
    assert there == here
    assert type(there) is type(here)


@pytest.mark.parametrize("data", VALID, ids=lambda d: json.loads(d)["kind"])
@pytest.mark.parametrize("sender", [None, 42, 7])
def test_a_valid_datagram_arrives_as_its_message(data: bytes, sender: int | None) -> None:
    _same(data, sender)
    msg = unpack(pack(data, sender, NOW))
    assert isinstance(msg, Message)
    if sender == 7:  # the kernel's word stands; the claim is kept as the container's pid
        assert (msg.pid, msg.container_pid) == (7, 42)
    else:
        assert (msg.pid, msg.container_pid) == (42, None)


@pytest.mark.parametrize(("fields", "reason"), HOSTILE)
def test_a_hostile_datagram_arrives_as_its_reason_and_sequence(fields: dict, reason: str) -> None:
    obj = {"v": 1, "kind": "mark", "seq": 4, "pid": 123, "t": T, "text": "hi", **fields}
    if obj["kind"] != "mark":
        obj.pop("text")
    data = json.dumps(obj).encode()
    _same(data, 123)
    got = unpack(pack(data, 123, NOW))
    assert got[0] == reason
    readable = reason != "json" and "seq" not in fields  # its own number is good
    assert got[1] == (4 if readable else None)


def test_size_and_identity_are_refused_where_the_datagram_is_read() -> None:
    assert unpack(pack(b"x" * (protocol.MAX_DATAGRAM + 1), 5, NOW)) == ("size", None)
    assert unpack(pack(VALID[2], 0, NOW)) == ("identity", None)  # not in our PID namespace


def test_what_the_relay_did_not_pack_is_an_error_to_count_not_a_message() -> None:
    for payload in (b"", b"\xff\x00", marshal.dumps(("phase", 1))[:-1]):
        with pytest.raises((ValueError, EOFError, TypeError)):
            unpack(payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([None, 1, 123]))
def test_random_bytes_arrive_as_checked_in_place(data: bytes, sender: int | None) -> None:
    _same(data, sender)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(protocol.KINDS),
    st.dictionaries(
        st.sampled_from(["event", "name", "id", "text", "level", "argv", "facts", "step",
                         "allocated", "reserved", "devices", "dev", "exit_code", "rank"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                  allow_infinity=False)
            | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4)
            | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=12,
        ),
        max_size=6,
    ),
)  # fmt: skip
def test_random_objects_arrive_as_checked_in_place(kind: str, fields: dict) -> None:
    obj = {"v": 1, "kind": kind, "seq": 1, "pid": 2, "t": T, **fields}
    _same(json.dumps(obj).encode(), 2)
