"""What a visitor's dashboard sends a browser: a whole first frame, then nothing while paused.

The real ``gpuwatch replay`` on Textual's web driver (as a visitor's process runs it), its
output read packet by packet from the pipe, the text rebuilt as the page's terminal shows it
(tests/support/vtscreen.py). Every byte after the first frame is sent, parsed and painted by
each browser, in a crowd of visitors at the cost of the others' first frames.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import ROOT
from vtscreen import Screen

from gpuwatch.serve.visitor import DRIVER_ENV

SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"
SIZES = {"browser": (155, 42), "80x24": (80, 24)}
"""A browser window's cells, and a laptop terminal's (one panel at a time, ``-short``)."""
FRAME = 4096
"""Bytes from which a packet is a frame (the driver's own escapes are a few bytes each)."""
QUIET = 1.5
"""Seconds without output that make the dashboard settled (six of the replay's ticks)."""


def _packets(proc: subprocess.Popen[bytes], limit: float) -> Iterator[tuple[float, bytes]]:
    """The driver's data packets (``D``, length, payload) as they come, with their time."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    buf = b""
    started = False
    deadline = time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        if not sel.select(min(left, 0.1)):
            yield time.monotonic(), b""  # a look at the clock: nothing came
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buf += chunk
        if not started:
            if b"__GANGLION__\n" not in buf:
                continue
            buf = buf.split(b"__GANGLION__\n", 1)[1]
            started = True
        while len(buf) >= 5 and len(buf) >= 5 + (size := int.from_bytes(buf[1:5], "big")):
            kind, payload, buf = buf[:1], buf[5 : 5 + size], buf[5 + size :]
            if kind == b"D":
                yield time.monotonic(), payload


@pytest.fixture(params=SIZES)
def visitor(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[bytes]]:
    width, height = SIZES[request.param]
    env = {**os.environ, **DRIVER_ENV, "COLUMNS": str(width), "ROWS": str(height)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "replay", str(SPIKE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    yield proc
    proc.kill()
    proc.wait()


def test_first_frame_is_whole_and_a_paused_replay_then_sends_nothing(
    visitor: subprocess.Popen[bytes],
) -> None:
    screen = Screen(500, 200)
    first: list[str] | None = None
    frame = 0  # the first frame's bytes
    sent = 0  # all bytes until settled
    last_output = 0.0
    settled_at = None
    sent_after: list[int] = []
    for at, payload in _packets(visitor, 60.0):
        if payload:
            screen.feed(payload)
            sent += len(payload)
            if first is None and len(payload) >= FRAME:
                first, frame = screen.lines(), len(payload)
            elif first is not None:
                sent_after.append(len(payload))
            last_output = at
        elif first is not None and at - last_output >= QUIET:
            settled_at = at
            break
    assert first is not None, "no frame in 60 s"
    text = "\n".join(first)
    # The panels were mounted after the first layout: the first frame had the status
    # bar and the tabs but no device panel, and full redraws followed.
    assert "REPLAY" in text and "peak in phase" in text, text
    # Paused on the spike, loaded: the scrubber redrew the same line every 0.25 s.
    assert settled_at is not None, f"still sending after its first frame: {sent_after[-8:]}"
    # The same picture was sent three more times (two resizes to the size it had, the
    # repaint of everything the first layout sized), and once more restyled with the
    # breakpoint classes: one redraw is left (Textual's own, of each widget that got its
    # size), and the tabs' underline.
    assert sent < 2.5 * frame, f"{sent} bytes to settle, the frame is {frame}: {sent_after}"
    late = [len(p) for _, p in _packets(visitor, 2.0) if p]
    assert late == [], f"paused and settled, it still sent packets of {late} bytes"
    # Silence, not an exit: the dashboard is still running.
    assert visitor.poll() is None
