"""gpuwatch: where did my GPU memory go?

A training script imports this package for its annotations::

    import gpuwatch

    with gpuwatch.phase("forward"):
        loss = model(batch)
    gpuwatch.mark("checkpoint saved")

or lets gpuwatch infer the phases (forward, backward, optimizer.step, ...) itself::

    gpuwatch.watch(model, optimizer)

In a Jupyter notebook, ``%load_ext gpuwatch`` makes each cell a phase and shows a line
under each cell that used torch memory; ``gpuwatch.plan(...)`` answers ``gpuwatch
estimate`` in a cell.

Importing it loads only the training-side client (no textual, numpy, sqlite3 or torch);
the dashboard lives in ``gpuwatch.tui`` and is started by the ``gpuwatch`` command.
"""

import threading
from typing import Any, TypeVar

from . import instrument as _instrument
from ._version import __version__
from .instrument import configure, flush, mark, phase, step

M = TypeVar("M")


class ForecastWarning(UserWarning):
    """``watch(..., warn=True)``: a phase not yet run is forecast above what the device
    can give (docs/foresight.md)."""


def watch(model: M, optimizer: Any = None, *, warn: bool = False, **options: Any) -> M:
    """Describe ``model`` to gpuwatch and infer its training phases automatically.

    See :func:`gpuwatch.instrument.watch` for ``optimizer`` and ``options`` (``amp_dtype``,
    ``checkpointing``, ``phases``).

    Args:
        model: The ``torch.nn.Module`` being trained.
        optimizer: Its optimizer (else the first that steps its parameters).
        warn: Also forecast, in this process, each phase not yet run against what the
            device can give, and emit one :class:`ForecastWarning` (once per process,
            never an exception, never a pause: the forecast runs on a thread of its own)
            when one will not fit, before it runs.
        **options: Passed on to :func:`gpuwatch.instrument.watch`.

    Returns:
        ``model``, unchanged.
    """
    if warn and _forecast_when_described not in _instrument.facts_listeners:
        _instrument.facts_listeners.append(_forecast_when_described)
    return _instrument.watch(model, optimizer, **options)


_warning = {"said": False, "runs": 0}  # one warning per process; forecasts made (tests)
_warning_lock = threading.Lock()


def _forecast_when_described(facts: dict[str, Any]) -> None:
    """A facts listener: forecast on a thread of its own (the training thread sent them)."""
    if not _warning["said"]:
        threading.Thread(
            target=_forecast, args=(facts,), name="gpuwatch-forecast", daemon=True
        ).start()


def _forecast(facts: dict[str, Any]) -> None:
    try:
        # Imported here, off the training thread: the predictor and the explanations.
        from .analysis.forecast import capacity_here, warn_text

        capacity = capacity_here(facts)
        text = warn_text(facts, capacity) if capacity is not None else None
        with _warning_lock:
            _warning["runs"] += 1
            if text is None or _warning["said"]:
                return
            _warning["said"] = True
        import warnings

        warnings.warn(f"gpuwatch {text}", ForecastWarning, stacklevel=2)
    except Exception:
        pass


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuwatch``: each cell a phase, a line under each that used torch memory."""
    from .notebook import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gpuwatch``."""
    from .notebook import unload

    unload(ipython)


def plan(**options: Any) -> Any:
    """``gpuwatch estimate`` in a notebook cell: see :func:`gpuwatch.notebook.plan`."""
    from .notebook import plan as _plan

    return _plan(**options)


__all__ = [
    "ForecastWarning",
    "__version__",
    "configure",
    "flush",
    "load_ipython_extension",
    "mark",
    "phase",
    "plan",
    "step",
    "unload_ipython_extension",
    "watch",
]
