"""Replay transport: a playback position over a loaded session, and where to jump.

Pure Python (no textual): the replay screen's keys call these methods, and
:meth:`Player.position` is the app's ``clock``, so the dashboard draws the window that ends
at the playback position exactly as it draws "now" when live.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..session import MISSING_INT, Session
from ..session import navigate as nav
from .loader import Loader
from .recording import open_recording

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""The speed steps of :meth:`Player.faster` / :meth:`Player.slower`."""

MIN_SPEED, MAX_SPEED = SPEEDS[0], SPEEDS[-1]

SMALL_RECORDING = 4 * 1024 * 1024
"""Recordings up to this size (about an hour of one GPU) open fully loaded; larger ones
load what the first frame needs, then the rest on the loader's thread."""

FIRST_FRAME_GRACE = 1.0
"""Seconds :func:`open_replay` lets the dashboard draw its first frame before the loader
competes with it for the CPU (the first frame's own chunks are loaded before)."""

SPIKE_SOURCES = (("gpu", "used"), ("peaks", "peak_allocated"), ("torch", "allocated"))
"""Where "the largest spike" is looked for, in order: the highest NVML used memory of any
GPU (what nvidia-smi shows, what runs out), else the highest exact allocator peak a script
reported, else its highest allocated figure. A recording with none of these (CPU only)
uses the highest RSS of an instrumented process, then host used memory."""


WHOLE_SHARE = 0.8
"""A recording whose training part (with margins) fills at least this share of it opens
whole; otherwise replay opens on the training part (a 64 s recording that trains for 6 s
after building a model on the CPU opens on those 6 s)."""

OPENING_MARGIN = 0.05
"""Room left either side of the training part, as a share of its length."""

MIN_OPENING = 10**9
"""The narrowest window replay opens on (1 s)."""


@dataclass(frozen=True)
class Opening:
    """What replay shows first.

    Attributes:
        window: ``(t0, t1)``: the whole recording, or its training part.
        cursor: Where the cursor starts: inside the phase with the highest exact allocator
            peak (the spike gpuwatch exists to explain), else at the highest memory
            reading; None for a recording without memory figures.
        position: The playback position: the window's start (space plays from there).
    """

    window: tuple[int, int]
    cursor: int | None
    position: int


class Player:
    """Play / pause, speed, seek and jumps over a replayed session.

    Args:
        session: The replayed session (``live`` False).
        loader: Its loader, for the bounds of the whole file before it is all loaded, the
            peaks from the chunk index, and whether the file is still being written.
        speed: Playback speed (clamped to x0.25..x64).
        playing: Start playing (else paused).
        start: Initial position; default the start of the recording.
        clock: Wall clock in ns (tests pass a fake one).
    """

    def __init__(
        self,
        session: Session,
        loader: Loader | None = None,
        *,
        speed: float = 1.0,
        playing: bool = True,
        start: int | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.session = session
        self.loader = loader
        self._clock = clock
        self._speed = _clamp_speed(speed)
        self._playing = playing
        self._anchor_pos = self.bounds()[0] if start is None else start
        self._anchor_clock = clock()
        self._anchor_pos = self._clamp(self._anchor_pos)
        self._boundaries: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))

    # ------------------------------------------------------------------ state

    def bounds(self) -> tuple[int, int]:
        """First and last time of the recording (the whole file, loaded or not)."""
        if self.loader is not None:
            return self.loader.bounds()
        return self.session.time_range()

    @property
    def growing(self) -> bool:
        """The file is still being written and its new data keeps arriving."""
        return self.loader is not None and self.loader.following

    @property
    def playing(self) -> bool:
        self.position()  # reaching the end of a finished recording pauses
        return self._playing

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def at_end(self) -> bool:
        return self.position() >= self.bounds()[1]

    def position(self) -> int:
        """The playback position on the session's time axis (ns); the app's clock."""
        pos = self._anchor_pos
        if self._playing:
            pos += int((self._clock() - self._anchor_clock) * self._speed)
        last = self.bounds()[1]
        if pos >= last:
            pos = last
            if self._playing and not self.growing:
                # A finished recording stops at its end; a growing one stays at the tail.
                self._playing = False
                self._anchor_pos, self._anchor_clock = last, self._clock()
        return max(pos, self.bounds()[0])

    def _clamp(self, t: int) -> int:
        first, last = self.bounds()
        return min(max(t, first), last)

    def _reanchor(self, pos: int) -> None:
        self._anchor_pos = self._clamp(pos)
        self._anchor_clock = self._clock()

    # ------------------------------------------------------------------ transport

    def play(self) -> None:
        """Play; from the start again when a finished recording is at its end."""
        pos = self.position()
        if pos >= self.bounds()[1] and not self.growing:
            pos = self.bounds()[0]
        self._reanchor(pos)
        self._playing = True

    def pause(self) -> None:
        """Stop the position where it is."""
        self._reanchor(self.position())
        self._playing = False

    def toggle(self) -> None:
        """Play if paused, pause if playing."""
        if self.playing:
            self.pause()
        else:
            self.play()

    def set_speed(self, speed: float) -> None:
        """Set the speed (clamped to x0.25..x64), keeping the position continuous."""
        self._reanchor(self.position())
        self._speed = _clamp_speed(speed)

    def faster(self) -> float:
        """The next speed step up; returns the new speed."""
        self.set_speed(next((s for s in SPEEDS if s > self._speed), MAX_SPEED))
        return self._speed

    def slower(self) -> float:
        """The next speed step down; returns the new speed."""
        self.set_speed(next((s for s in reversed(SPEEDS) if s < self._speed), MIN_SPEED))
        return self._speed

    def seek(self, t: int) -> int:
        """Move to time ``t`` (clamped to the recording); returns the new position."""
        self._reanchor(t)
        return self._anchor_pos

    def seek_by(self, delta: int) -> int:
        """Move by ``delta`` ns (negative: back); returns the new position."""
        return self.seek(self.position() + delta)

    def home(self) -> int:
        """Go to the start."""
        return self.seek(self.bounds()[0])

    def end(self) -> int:
        """Go to the end; on a file still being written, follow its tail (playing)."""
        pos = self.seek(self.bounds()[1])
        if self.growing:
            self._playing = True
        return pos

    def close(self) -> None:
        """Stop loading and close the recording (when it came from :func:`open_replay`)."""
        if self.loader is not None:
            self.loader.stop()
            self.loader.recording.close()

    # ------------------------------------------------------------------ jumps

    def _jump(self, targets: np.ndarray, forward: bool) -> int | None:
        pos = self.position()
        if forward:
            i = int(np.searchsorted(targets, pos, "right"))
            if i >= len(targets):
                return None
        else:
            i = int(np.searchsorted(targets, pos, "left")) - 1
            if i < 0:
                return None
        return self.seek(int(targets[i]))

    def phase_boundaries(self) -> np.ndarray:
        """Sorted times at which any phase of any process began or ended."""
        procs = list(self.session.processes.values())
        stamp = sum(len(p.phases) + len(p.open) for p in procs)
        if stamp != self._boundaries[0]:
            self._boundaries = (stamp, nav.boundaries(self.session))
        return self._boundaries[1]

    def next_phase(self) -> int | None:
        """Jump to the next phase boundary; None (and no move) when there is none."""
        return self._jump(self.phase_boundaries(), True)

    def prev_phase(self) -> int | None:
        """Jump to the previous phase boundary."""
        return self._jump(self.phase_boundaries(), False)

    def next_mark(self) -> int | None:
        """Jump to the next mark."""
        return self._jump(nav.events(self.session, kinds=("mark",)), True)

    def prev_mark(self) -> int | None:
        """Jump to the previous mark."""
        return self._jump(nav.events(self.session, kinds=("mark",)), False)

    def next_oom(self) -> int | None:
        """Jump to the next OOM."""
        return self._jump(nav.events(self.session, kinds=("oom",)), True)

    def prev_oom(self) -> int | None:
        """Jump to the previous OOM."""
        return self._jump(nav.events(self.session, kinds=("oom",)), False)

    def largest_spike(self) -> tuple[int, int, str] | None:
        """Where memory was highest (see :data:`SPIKE_SOURCES`).

        Returns:
            ``(time, bytes, device or pid key)`` of the first time the highest value was
            reached, or None for a recording without memory figures.
        """
        for kind, column in (*SPIKE_SOURCES, ("rss", "rss"), ("host", "used")):
            found = self._peak(kind, column)
            if found is not None:
                value, t, key = found
                return t, value, key
        return None

    def jump_to_spike(self) -> int | None:
        """Jump to :meth:`largest_spike`; None when there is none."""
        spike = self.largest_spike()
        return None if spike is None else self.seek(spike[0])

    # ------------------------------------------------------------------ opening

    def training_part(self) -> tuple[int, int] | None:
        """First and last time any instrumented process was active, or None."""
        procs = list(self.session.processes.values())
        if not procs:
            return None
        first = min(p.first_t for p in procs)
        last = max(max(p.last_t, p.ended or 0) for p in procs)
        for p in procs:  # a phase may begin before the hello that announced the process
            span = p.phases.span()
            if span is not None:
                cols = p.phases.snapshot()
                first = min(first, int(cols["t0"].min()))
                last = max(last, span[1])
        return (first, last) if last > first else None

    def highest_phase_peak(self) -> tuple[int, int] | None:
        """``(time, bytes)`` inside the phase with the highest exact allocated peak."""
        found = self.loader.peak("phases") if self.loader is not None else None
        pid: int | None = None
        if found is not None:
            value, t1, key = found
            pid = int(key)
        else:
            best = None
            for p in list(self.session.processes.values()):
                cols = p.phases.snapshot()
                known = cols["peak_alloc"] != MISSING_INT
                if known.any():
                    i = int(np.argmax(np.where(known, cols["peak_alloc"], MISSING_INT)))
                    if best is None or int(cols["peak_alloc"][i]) > best[0]:
                        best = (int(cols["peak_alloc"][i]), int(cols["t1"][i]), p.pid)
            if best is None:
                return None
            value, t1, pid = best
        # The middle of that phase when its row is loaded (a small file is, whole), else
        # just inside its end.
        proc = self.session.processes.get(pid)
        if proc is not None:
            cols = proc.phases.snapshot()
            rows = np.flatnonzero((cols["t1"] == t1) & (cols["peak_alloc"] == value))
            if len(rows):
                return (int(cols["t0"][rows[-1]]) + t1) // 2, value
        return t1 - 1, value

    def opening(self) -> Opening:
        """The window, cursor and position replay opens on (see :data:`WHOLE_SHARE`)."""
        first, last = self.bounds()
        window = (first, max(last, first + 1))
        part = self.training_part()
        if part is not None:
            margin = int((part[1] - part[0]) * OPENING_MARGIN)
            t0, t1 = max(first, part[0] - margin), min(last, part[1] + margin)
            if t1 - t0 < MIN_OPENING:
                mid = (t0 + t1) // 2
                t0, t1 = max(first, mid - MIN_OPENING // 2), min(last, mid + MIN_OPENING // 2)
            if t1 > t0 and (t1 - t0) < WHOLE_SHARE * (last - first):
                window = (t0, t1)
        peak = self.highest_phase_peak()
        if peak is None or not window[0] <= peak[0] <= window[1]:
            spike = self.largest_spike()
            peak = (spike[0], spike[1]) if spike is not None else None
        cursor = peak[0] if peak is not None and window[0] <= peak[0] <= window[1] else None
        return Opening(window, cursor, window[0])

    def _peak(self, kind: str, column: str) -> tuple[int, int, str] | None:
        if self.loader is not None:
            # The chunk index keeps each chunk's maximum: no need to wait for the samples.
            return self.loader.peak(kind)
        best: tuple[int, int, str] | None = None
        for key, table in _tables(self.session, kind):
            cols = table.snapshot()
            values = cols[column]
            known = values != MISSING_INT
            if not known.any():
                continue
            i = int(np.argmax(np.where(known, values, MISSING_INT)))
            if best is None or int(values[i]) > best[0]:
                best = (int(values[i]), int(cols[table.time][i]), key)
        return best


def open_replay(path: str | os.PathLike[str], *, speed: float = 1.0) -> Player:
    """Open a recording for replay: what ``gpuwatch replay`` does before its first frame.

    Loads the chunks the first frame needs (the start of a finished recording, or the tail
    of one still being written, which the player then follows) and starts loading the rest
    on the loader's thread. :meth:`Player.close` stops it and closes the file.

    Raises:
        RecordingError: The file is not a readable recording.
    """
    rec = open_recording(path)
    try:
        session, loader = rec.open_session()
        growing = rec.writer_alive()
        loader.following = growing
        # A finished recording opens paused (the dashboard shows its data first, see
        # Player.opening); one still being written plays at its tail.
        player = Player(session, loader, speed=speed, playing=growing)
        if growing:
            player.end()
        loader.load_until(player.position())
        if rec.file_size() <= SMALL_RECORDING:
            # Loads in milliseconds: open it whole, so the first frame has everything.
            loader.load_all()
    except BaseException:
        rec.close()
        raise
    loader.start(follow=growing, delay=0.0 if loader.done else FIRST_FRAME_GRACE)
    return player


def _tables(session: Session, kind: str) -> list:
    if kind == "gpu":
        return list(session.gpu.items())
    if kind == "host":
        return list(session.hosts.items())
    return [(str(pid), getattr(p, kind)) for pid, p in list(session.processes.items())]


def _clamp_speed(speed: float) -> float:
    return float(min(max(speed, MIN_SPEED), MAX_SPEED))
