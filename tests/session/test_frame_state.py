"""Issue 53: the dashboard's frame reads the session once, as an immutable FrameState."""

from __future__ import annotations

import dataclasses

import pytest
import synthetic

from gpuwatch.session import Device, Session
from gpuwatch.session.model import Mark

MS = synthetic.MS


def _whole(first: int) -> tuple[int, int]:
    return first, synthetic.end_time()


def test_the_frame_state_holds_what_the_frame_draws() -> None:
    session = synthetic.build()
    session.count_reject("oversized")
    session.note("no driver")
    state = session.frame_state(_whole)
    assert state.version == session.version and not state.live
    assert state.time_range == session.time_range()
    assert state.window == (session.time_range()[0], synthetic.end_time())
    assert state.devices == tuple(session.devices) and state.gpus == 1
    assert state.instrumented == len(session.active(*state.window)) == 1
    assert (state.rejects, state.notes) == (1, ("no driver",))
    marks, ooms = session.events_between(*state.window)
    assert state.events == (*ooms, *marks) and state.events
    near = state.nearest(2500 * MS)
    assert near is not None
    assert near is min(state.events, key=lambda e: abs(e.t - 2500 * MS))


def test_the_frame_state_is_immutable_and_the_session_changing_leaves_it_as_read() -> None:
    session = synthetic.build()
    state = session.frame_state(_whole)
    before = dataclasses.astuple(state)
    for field in dataclasses.fields(state):  # figures and tuples, no live container
        assert isinstance(getattr(state, field.name), int | bool | tuple), field.name
    session.add_device(Device("host", "host", name="host", total=1, source="host"))
    session.add_device(Device("gpu:x", "gpu", index=1, name="GPU", total=1, source="nvml"))
    session.count_reject("malformed", pid=synthetic.PID)
    session.note("recording stopped")
    session.add_mark(Mark(3000 * MS, synthetic.PID, "look here"))
    session.processes[synthetic.PID].dropped = 7
    assert dataclasses.astuple(state) == before
    assert state.version != session.version
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.version = 0
    with pytest.raises((AttributeError, TypeError)):
        state.notes.append("x")
    after = session.frame_state(_whole)
    assert (after.gpus, after.rejects, after.dropped) == (2, 1, 7)
    assert after.notes == ("recording stopped",) and len(after.events) == len(state.events) + 1


def test_the_frame_state_is_read_under_the_session_lock() -> None:
    # Writers that hold the lock (a message applied, a device added) come wholly before or
    # after the read: the window, which needs the data's first time, is asked under it.
    session = synthetic.build()
    held: list[bool] = []

    def window_of(first: int) -> tuple[int, int]:
        held.append(session._lock._is_owned())
        return _whole(first)

    session.frame_state(window_of)
    assert held == [True]
    assert not session._lock._is_owned()


def test_a_new_session_has_a_frame_state() -> None:
    state = Session(t_origin=5).frame_state(lambda first: (first, first))
    assert (state.time_range, state.window, state.devices, state.events) == ((5, 5), (5, 5), (), ())
