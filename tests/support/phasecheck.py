"""Helpers for the automatic-phase tests: a live receiver and the phases it got, in order."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator

from conftest import wait_for

from gpuwatch import protocol
from gpuwatch.session import Session
from gpuwatch.sources.annotations import AnnotationReceiver

HOLD = """
import os, sys, time
import gpuwatch
with gpuwatch.phase(sys.argv[1]):
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
"""
"""An instrumented script: holds the phase ``argv[1]`` open until the file ``argv[2]`` is."""

Row = tuple[str, int, int]
"""(name, depth, step) of one ended phase."""


def receiver(path: str) -> Iterator[Session]:
    """A session fed by a real receiver on ``path`` (use as a generator fixture body)."""
    session = Session()
    rx = AnnotationReceiver(session, path)
    rx.start()
    try:
        yield session
    finally:
        rx.stop()


def drained(session: Session, path: str, timeout: float = 30) -> bool:
    """Whether what was sent to ``path`` before this call has been applied to ``session``.

    A mark sent now, from this process, comes after everything the socket already holds
    (a datagram socket keeps its queue in order): once the session has it, nothing sent
    earlier is still on its way, so the absence of a message can be asserted.
    """
    text = f"drained {uuid.uuid4().hex}"
    t = time.monotonic_ns()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        probe = (("hello", {"argv": ["probe"]}), ("mark", {"text": text}))
        for seq, (kind, body) in enumerate(probe):
            sock.sendto(protocol.encode(kind, os.getpid(), seq, t, 0, body), path)
    return wait_for(lambda: any(m.text == text for m in list(session.marks)), timeout)


def phases(session: Session, pid: int) -> list[tuple[str, int, int, int, int, bool]]:
    """Ended phases of ``pid`` as (name, depth, step, t0, t1, error), by start time."""
    proc = session.processes.get(pid)
    if proc is None:
        return []
    cols = proc.phases.snapshot()
    rows = [
        (session.names[int(n)], int(d), int(s), int(t0), int(t1), bool(e))
        for n, d, s, t0, t1, e in zip(
            cols["name"],
            cols["depth"],
            cols["step"],
            cols["t0"],
            cols["t1"],
            cols["error"],
            strict=True,
        )
    ]
    # A late-sent data begin shares its end time with the next begin: sort by start, then
    # by depth so a parent comes before its child.
    return sorted(rows, key=lambda r: (r[3], r[1]))


def rows(session: Session, pid: int) -> list[Row]:
    """Ended phases of ``pid`` as (name, depth, step)."""
    return [r[:3] for r in phases(session, pid)]


def wait_rows(session: Session, pid: int, n: int, timeout: float = 10.0) -> list[Row]:
    """Wait until ``pid`` has at least ``n`` ended phases; returns them."""
    wait_for(lambda: len(rows(session, pid)) >= n, timeout=timeout)
    return rows(session, pid)


def step_rows(
    steps: int,
    *,
    accum: int = 1,
    zero_grad: str = "end",
    eval_every: int = 0,
    last_data: bool = False,
) -> list[Row]:
    """What the automatic phases must give for tests/scripts/plain_train.py's loop.

    Args:
        steps: Optimizer steps.
        accum: Micro-batches per step (a data gap between them).
        zero_grad: ``end`` (after step), ``start`` (first thing in the loop) or ``model``
            (``model.zero_grad()`` after step).
        eval_every: An eval forward after every N steps.
        last_data: Whether the data span begun around the last zero_grad has ended (it
            ends at exit; in-process it is still open).
    """
    assert not (eval_every and zero_grad == "start"), "not modelled"
    out: list[Row] = []
    for s in range(steps):
        evaluates = bool(eval_every) and (s + 1) % eval_every == 0
        if zero_grad == "start":
            # Between steps the data gap holds the zero_grad; before the first, it stands alone.
            out += [("data", 0, s), ("zero_grad", 1, s)] if s else [("zero_grad", 0, s)]
        for m in range(accum):
            if m:
                out.append(("data", 0, s))
            out += [("forward", 0, s), ("backward", 0, s)]
        out.append(("optimizer.step", 0, s))
        if zero_grad != "start":
            # The data span begun around zero_grad ends at the next forward or eval.
            if s < steps - 1 or last_data or evaluates:
                out.append(("data", 0, s + 1))
            out.append(("zero_grad", 1, s + 1))
        if evaluates:
            out.append(("eval", 0, s + 1))
    return out
