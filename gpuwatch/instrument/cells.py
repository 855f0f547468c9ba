"""Notebook cells as phases: what a front end in the kernel (``gpuwatch.notebook``) asks of
the training side.

A cell is a phase like any other, on the same per-thread stack, so the automatic phases
nest inside it; what this adds is what a cell's two ends mean (``_auto.cell_begins`` and
``cell_ends``) and a local copy of what the client sends (``Client.tap``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _api, _auto, _watch
from ._api import close_span, open_span

Tap = Callable[[list[tuple[Any, ...]]], None]


def torch_imported() -> bool:
    """torch is imported: install the automatic phases with model discovery, and notice
    models built from now on. True when the phases are in place."""
    if not _watch.autowatch():
        return False
    _auto.watch_new_models()
    return True


def begin(name: str) -> int | None:
    """A cell begins: open its phase (the span id; None when the client is off)."""
    if _auto.cell_begins():
        _watch.rediscover()
    return open_span(name)


def end(sid: int, name: str, error: str | None = None) -> None:
    """A cell ended (``error``: the exception's class name, if it raised): what gpuwatch
    opened inside it ends, then its phase."""
    _auto.cell_ends()
    close_span(sid, name, error=error)


def set_tap(tap: Tap | None) -> Tap | None:
    """Give the client's flushed events to ``tap`` too (None: to nothing); the tap before."""
    client = _api._state.client
    before, client.tap = client.tap, tap
    return before


def tap_now() -> None:
    """Hand the tap what is queued, now (a cell's end), without sending it."""
    _api._state.client.tap_now()


def facts() -> dict[str, Any] | None:
    """The model facts sent last, if any."""
    return _api._state.client.facts


def device_used() -> int | None:
    """Memory in use on the CUDA device torch uses, as the driver counts it (what
    nvidia-smi shows); None before CUDA is in use."""
    memory = _api._state.memory
    if not memory.active:
        return None
    got = memory.mem_get_info(memory.last_device)
    if got is None:
        return None
    free, total = got
    return total - free
