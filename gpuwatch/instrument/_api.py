"""The public training-side API: ``phase``, ``mark``, ``step`` and ``configure``.

Every function here runs on the user's training thread. Each one reads the clock, maybe
reads the allocator (only on CUDA), and appends a tuple to the sender's queue; nothing
else. None of them raises into the caller.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from itertools import count
from typing import Any, Literal, ParamSpec, TypeVar

from .. import protocol
from ._client import Client
from ._torchmem import TorchMemory

P = ParamSpec("P")
R = TypeVar("R")

_monotonic_ns = time.monotonic_ns


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return default


AFTER_STEP = frozenset(("zero_grad", "eval"))
"""Phases that, after an optimizer step, still belong to its step (unless they ran in the
step already: a loop that zeroes gradients first starts its steps with zero_grad)."""


class _State:
    """Process-wide state of the client (one per process; reset in forked children)."""

    def __init__(self) -> None:
        self.enabled = not _env_flag("GPUWATCH_DISABLE", False)
        self.memory = TorchMemory(
            peaks=_env_flag("GPUWATCH_PEAKS", True), sync=_env_flag("GPUWATCH_SYNC", False)
        )
        self.client = Client(memory=self.memory)
        self.client.enabled = self.enabled
        self.step: int = 0
        # An optimizer.step phase ended in this step: the step advances when the next
        # step's first top-level phase begins, so a zero_grad or an eval after the
        # optimizer step stays in the step that ran it (see top_phase).
        self.stepped = False
        self.step_names: set[str] = set()  # top-level phases begun before it
        self.ids = count(1)
        self.local = threading.local()
        # Called with (exc, phase name) when an OOM passes through a phase; set by the
        # OOM forensics module so that this hot module needs no knowledge of it.
        self.on_oom: Callable[[BaseException, str | None], None] | None = None

    def top_phase(self, name: str) -> None:
        """A top-level phase begins: after an optimizer step, the next step's first phase,
        unless it is a zero_grad or eval that has not run in this step yet."""
        names = self.step_names
        if self.stepped and (name in names or name not in AFTER_STEP):
            self.step += 1
            self.stepped = False
            names.clear()
        names.add(name)

    def set_step(self, n: int) -> None:
        """The script says which step this is: it owns the count from here."""
        self.step = n
        self.stepped = False
        self.step_names.clear()

    def stack(self) -> list[tuple[int, str]]:
        try:
            return self.local.stack
        except AttributeError:
            stack: list[tuple[int, str]] = []
            self.local.stack = stack
            return stack


_state = _State()


def _retry_mark(new: int, total: int) -> None:
    """A boundary's allocator read shows cudaMalloc retries: say so on the timeline."""
    mark(
        f"allocator retried cudaMalloc {new}x ({total} in all): it freed its cache to make"
        " room, so memory is fragmented or nearly full (this costs a synchronisation)",
        "warning",
    )


_state.memory.on_retry = _retry_mark
_state.memory.on_note = lambda text: mark(text)  # which allocator reader, said once


def _after_fork() -> None:
    # A forked child (a DataLoader worker, say) is a new process: new pid, no sender thread.
    _state.client.reset_after_fork()
    _state.local = threading.local()


os.register_at_fork(after_in_child=_after_fork)


def _begin(st: _State, name: str, t: int, fig: Any, sid: int | None, top: bool) -> int:
    """The one begin boundary: push a frame on this thread's stack and send the begin.

    Args:
        top: Count a top-level begin towards the step (manual phases; gpuwatch's own
            automatic spans never move the step).
    """
    try:  # the thread's stack, without a call: this runs at every boundary
        stack = st.local.stack
    except AttributeError:
        stack = st.stack()
    if top and not stack:
        st.top_phase(name)
    if sid is None:
        sid = next(st.ids)
    parent = stack[-1][0] if stack else None
    stack.append((sid, name))
    # A PhaseEvent, as a plain tuple (see there).
    st.client.emit(("phase", t, "begin", name, sid, parent, len(stack) - 1, st.step, fig, None))
    return sid


def _end(
    st: _State,
    t: int,
    name: str,
    sid: int,
    stack: list[tuple[int, str]],
    depth: int,
    fig: Any,
    exc: BaseException | None,
    error: str | None,
) -> None:
    """The one end boundary: send the end of the span popped from ``depth`` of ``stack``
    (its parent is the frame below) and hand an out-of-memory error to the OOM hook."""
    parent = stack[depth - 1][0] if depth and stack else None
    st.client.emit(("phase", t, "end", name, sid, parent, depth, st.step, fig, error))
    if exc is not None and error is not None and "OutOfMemory" in error and st.on_oom is not None:
        st.on_oom(exc, name)


class phase:
    """Annotate a phase of training, as a context manager or a decorator.

    Phases may nest; each reports, at its start and end, the time and (on CUDA) the torch
    allocated and reserved bytes and the peaks since the previous boundary. One instance can
    be entered many times, from several threads.

    Args:
        name: The phase's name, e.g. ``"forward"`` or ``"optimizer.step"``. After a phase
            named ``"optimizer.step"`` ends, the step counter advances when the next
            step's first top-level phase begins: a ``zero_grad`` or ``eval`` after the
            optimizer step stays in its step.

    Example:
        >>> with gpuwatch.phase("forward"):
        ...     loss = model(batch)
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = str(name)[: protocol.MAX_NAME]

    def __enter__(self) -> phase:
        st = _state
        if not st.enabled:
            return self
        try:
            t = _monotonic_ns()
            mem = st.memory
            # On the CPU path (no CUDA yet) the allocator is not read: one call fewer per
            # boundary than going through boundary() (bench_annotate's pairs).
            fig = mem.boundary(t, "begin") if mem.active or mem.check_active() else None
            _begin(st, self.name, t, fig, None, True)
        except Exception:
            pass
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        st = _state
        if not st.enabled:
            return False
        try:
            t = _monotonic_ns()
            mem = st.memory
            fig = mem.boundary(t, "end") if mem.active or mem.check_active() else None
            try:
                stack = st.local.stack
            except AttributeError:
                stack = st.stack()
            # Pop our own frame, almost always the top one; tolerate an unbalanced stack
            # rather than raise.
            sid = None
            if stack and stack[-1][1] == self.name:
                sid = stack.pop()[0]
            else:
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i][1] == self.name:
                        sid = stack[i][0]
                        del stack[i:]
                        break
            if sid is None:
                return False
            error = exc_type.__name__ if exc_type is not None else None
            _end(st, t, self.name, sid, stack, len(stack), fig, exc, error)
            if error is None and self.name == "optimizer.step":
                st.stepped = True  # the next step begins with its first phase
        except Exception:
            pass
        return False

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Use the phase as a decorator: each call of ``fn`` is one phase."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return fn(*args, **kwargs)

        return wrapper


_READ: Any = object()
"""Sentinel for :func:`open_span` / :func:`close_span`: read the allocator figures now."""


def open_span(
    name: str, *, t: int | None = None, fig: Any = _READ, sid: int | None = None
) -> int | None:
    """Begin a phase on this thread's stack, for gpuwatch's own automatic phases.

    Emits exactly what :class:`phase` emits (same tuple, same boundary read), so automatic
    and manual phases nest on one stack and carry figures and peaks alike.

    Args:
        name: Phase name.
        t: Event time; ``None`` means now. A begin sent late names the time it happened.
        fig: Allocator figures to send; :data:`_READ` reads them now (a boundary), ``None``
            sends none (for a begin sent late, which must not count as a boundary).
        sid: A span id already taken from the id counter, or ``None`` for a new one.

    Returns:
        The span id, or ``None`` when the client is disabled or anything failed.
    """
    st = _state
    if not st.enabled:
        return None
    try:
        if t is None:
            t = _monotonic_ns()
        if fig is _READ:
            fig = st.memory.boundary(t, "begin")
        return _begin(st, name, t, fig, sid, False)
    except Exception:
        return None


def close_span(
    sid: int,
    name: str,
    *,
    exc: BaseException | None = None,
    error: str | None = None,
    t: int | None = None,
    fig: Any = _READ,
) -> tuple[int, Any] | None:
    """End a span begun by :func:`open_span` (by id: frames above it are left alone).

    Args:
        sid: The span id :func:`open_span` returned.
        name: Its name.
        exc: The exception that ended it, if any; an out-of-memory error is handed to the
            OOM hook as for manual phases.
        error: An error name to send when there is no exception object.
        t: Event time; ``None`` means now.
        fig: As for :func:`open_span`.

    Returns:
        ``(t, figures)`` of the end boundary (so a following begin can reuse them), or
        ``None`` when nothing was sent.
    """
    st = _state
    try:
        stack = st.stack()
        depth = len(stack)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == sid:
                depth = i
                del stack[i]
                break
        if not st.enabled:
            return None
        if t is None:
            t = _monotonic_ns()
        if fig is _READ:
            fig = st.memory.boundary(t, "end")
        if exc is not None:
            error = exc.__class__.__name__
        _end(st, t, name, sid, stack, depth, fig, exc, error)
        return t, fig
    except Exception:
        return None


def current_phase() -> str | None:
    """The innermost phase open on this thread (manual or automatic), or None."""
    try:
        stack = _state.stack()
        return stack[-1][1] if stack else None
    except Exception:
        return None


def report_oom(exc: BaseException) -> None:
    """Hand an out-of-memory error that a framework caught to the OOM forensics.

    The error is attributed to the innermost open phase; an error a phase already
    reported is not reported again. Anything else is ignored. Never raises.
    """
    hook = _state.on_oom
    if hook is None or "OutOfMemory" not in type(exc).__name__:
        return
    try:
        hook(exc, current_phase())
    except Exception:
        pass


def mark(text: str, level: str = "info") -> None:
    """Record a point event (``level``: ``"info"``, ``"warning"`` or ``"error"``)."""
    st = _state
    if not st.enabled:
        return
    try:
        if level not in protocol.LEVELS:
            level = "info"
        st.client.emit(("mark", _monotonic_ns(), str(text)[: protocol.MAX_TEXT], level, st.step))
    except Exception:
        pass


def step(n: int | None = None) -> int:
    """Set the training step the next phases belong to, or just read it.

    Steps also advance by themselves after an ``optimizer.step`` phase, when the next
    step's first phase begins (see :class:`phase`), so calling this is optional; calling
    it sets the step and cancels an advance still to come, so ``gpuwatch.step(i)`` at the
    top of the loop and the optimizer step never count the same step twice.

    Returns:
        The current step.
    """
    if n is not None:
        try:
            _state.set_step(int(n))
        except (TypeError, ValueError):
            pass
    return _state.step


def configure(
    *,
    socket: str | None = None,
    sync: bool | None = None,
    peaks: bool | None = None,
    enabled: bool | None = None,
) -> None:
    """Change the client's settings (each also has an environment variable).

    Args:
        socket: Socket path (``GPUWATCH_SOCKET``); takes effect from the next send.
        sync: Synchronise CUDA at every boundary for exact timing (``GPUWATCH_SYNC=1``).
        peaks: Reset and report the allocator's peak counters (``GPUWATCH_PEAKS=0`` to
            leave the user's own peak counters alone).
        enabled: Turn the client off entirely (``GPUWATCH_DISABLE=1``).
    """
    st = _state
    if enabled is not None:
        # First: a client pointed at a new socket and turned off in one call never greets it.
        # The sender thread reads the client's flag; the API's hot paths read their own.
        st.enabled = st.client.enabled = bool(enabled)
    if socket is not None:
        st.client.path = os.path.abspath(socket)
        st.client.disconnect()  # greet whoever is there
    if sync is not None:
        st.memory.sync = bool(sync)
    if peaks is not None:
        st.memory.peaks = bool(peaks)


def send(kind: str, body: dict[str, Any], t: int | None = None) -> None:
    """Queue a message with a dict body (``facts``, ``oom``): for gpuwatch's own modules.
    ``t``: when it happened (``time.monotonic_ns()``), if not now."""
    st = _state
    if st.enabled:
        st.client.emit((kind, _monotonic_ns() if t is None else t, body))


def set_facts(facts: dict[str, Any]) -> None:
    """Send model facts now and again to any dashboard that connects later."""
    st = _state
    st.client.facts = facts
    send("facts", facts)


def flush() -> None:
    """Send what is queued now (tests and short scripts; training never needs it)."""
    try:
        _state.client.flush()
    except Exception:
        pass
