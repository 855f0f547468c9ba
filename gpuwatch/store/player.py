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

from ..session import Session, Table
from ..session import navigate as nav
from .loader import Loader, open_session
from .recording import open_recording

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""The speed steps of :meth:`Player.faster` / :meth:`Player.slower`."""

MIN_SPEED, MAX_SPEED = SPEEDS[0], SPEEDS[-1]

SMALL_RECORDING = 4 * 1024 * 1024
"""A recording written before summaries existed and up to this size (about an hour of one
GPU) is summarised before the first frame; a larger one by the loader's thread after it."""

FIRST_FRAME_GRACE = 1.0
"""Seconds :func:`open_replay` lets the dashboard draw its first frame before the loader
competes with it for the CPU (the first frame's own chunks are loaded before)."""

SPIKE_SOURCES = (("gpu", "used"), ("peaks", "peak_allocated"), ("torch", "allocated"))
"""Where the highest reading is looked for when no phase has an exact peak, in order: the
highest NVML used memory of any GPU (what nvidia-smi shows, what runs out), else the
highest exact allocator peak a script reported, else its highest allocated figure. A
recording with none of these (CPU only) uses the highest RSS of an instrumented process,
then host used memory."""


_SPIKE_SOURCE = {"gpu": "nvml", "peaks": "torch", "torch": "torch", "rss": "rss", "host": "host"}
"""The :attr:`~gpuwatch.session.navigate.Spike.source` of each kind of reading."""

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
        position: The playback position: the cursor's time (the scrubber and the cursor
            agree; space plays from there), the window's start without a cursor.
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

    def next_phase(self) -> int | None:
        """Jump to the next phase boundary; None (and no move) when there is none."""
        t = nav.next_boundary(self.session, self.position(), 1)
        return None if t is None else self.seek(t)

    def prev_phase(self) -> int | None:
        """Jump to the previous phase boundary."""
        t = nav.next_boundary(self.session, self.position(), -1)
        return None if t is None else self.seek(t)

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
        """Jump to :meth:`spike`; None when there is none."""
        spike = self.spike()
        return None if spike is None else self.seek(spike[0])

    # ------------------------------------------------------------------ opening

    def training_part(self) -> tuple[int, int] | None:
        """First and last time any instrumented process was active, or None."""
        procs = list(self.session.processes.values())
        if not procs:
            return None
        first = min(p.first_t for p in procs)
        last = max(max(p.last_t, p.ended or 0) for p in procs)
        # Where the file summarises a process's phases, their earliest begin is known
        # without reading them (a sweep of thousands would read a chunk each).
        begins = self.loader.begins("phases") if self.loader is not None else {}
        for p in procs:  # a phase may begin before the hello that announced the process
            span = p.phases.span()
            if span is not None:
                begun = begins.get(str(p.pid))
                if begun is None:
                    # The earliest begin is among the spans ending within a longest span
                    # of the first end.
                    cols = p.phases.between(span[0], span[0] + p.max_span, columns=("t0",))
                    begun = int(cols["t0"].min()) if len(cols["t0"]) else None
                if begun is not None:
                    first = min(first, begun)
                last = max(last, span[1])
        return (first, last) if last > first else None

    def highest_phase_peak(self) -> nav.Spike | None:
        """Inside the phase with the highest exact allocated peak (its time, bytes, name)."""
        found = self.loader.peak("phases") if self.loader is not None else None
        if found is not None:
            value, t1, key = found
            return nav.phase_peak(self.session, int(key), t1, value)
        if self.loader is not None:
            # The index keeps each chunk's highest peak: none there, none in the rows
            # (asking each process would read every index of a sweep for nothing).
            return None
        return nav.spike(self.session)

    def spike(self) -> nav.Spike | None:
        """Where ``s`` goes: the highest exact phase peak, else :meth:`largest_spike`
        (see :func:`gpuwatch.session.navigate.spike`), with what measured it."""
        found = self.highest_phase_peak()
        if found is not None:
            return found
        for kind, column in (*SPIKE_SOURCES, ("rss", "rss"), ("host", "used")):
            peak = self._peak(kind, column)
            if peak is not None:
                value, t, _ = peak
                return nav.Spike(t, value, _SPIKE_SOURCE[kind])
        return None

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
        found = self.highest_phase_peak()
        peak = found.t if found is not None else None
        if peak is None or not window[0] <= peak <= window[1]:
            spike = self.largest_spike()
            peak = spike[0] if spike is not None else None
        cursor = peak if peak is not None and window[0] <= peak <= window[1] else None
        # The position is the cursor's time: the scrubber and the cursor tell one time.
        return Opening(window, cursor, window[0] if cursor is None else cursor)

    def _peak(self, kind: str, column: str) -> tuple[int, int, str] | None:
        if self.loader is not None:
            # The chunk index keeps each chunk's maximum: no need to wait for the samples.
            return self.loader.peak(kind)
        best: tuple[int, int, str] | None = None
        for key, table in _tables(self.session, kind):
            found = table.max_between(column)
            if found is not None and (best is None or int(found[1]) > best[0]):
                best = (int(found[1]), found[0], key)
        return best


def open_replay(path: str | os.PathLike[str], *, speed: float = 1.0) -> Player:
    """Open a recording for replay: what ``gpuwatch replay`` does before its first frame.

    The session is windowed: each view reads what it shows from the file (the chunk index
    and the chunks' summaries answer a zoomed-out view), so nothing is loaded up front and
    memory does not grow with the file. The loader's thread follows a file still being
    written (and summarises one written before summaries existed).
    :meth:`Player.close` stops it and closes the file.

    Raises:
        RecordingError: The file is not a readable recording.
    """
    rec = open_recording(path)
    try:
        session, loader = open_session(rec, windowed=True)
        growing = rec.writer_alive()
        loader.following = growing
        # A finished recording opens paused (the dashboard shows its data first, see
        # Player.opening); one still being written plays at its tail.
        player = Player(session, loader, speed=speed, playing=growing)
        if growing:
            player.end()
        if not loader.done and rec.file_size() <= SMALL_RECORDING:
            loader.load_all()  # milliseconds: the first frame has everything
    except BaseException:
        rec.close()
        raise
    loader.start(follow=growing, delay=FIRST_FRAME_GRACE if not loader.done else 0.0)
    return player


def _tables(session: Session, kind: str) -> list[tuple[str, Table]]:
    if kind == "gpu":
        return list(session.gpu.items())
    if kind == "host":
        return list(session.hosts.items())
    return [(str(pid), getattr(p, kind)) for pid, p in list(session.processes.items())]


def _clamp_speed(speed: float) -> float:
    return float(min(max(speed, MIN_SPEED), MAX_SPEED))
