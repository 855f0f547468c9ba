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

from typing import Any

from ._version import __version__
from .instrument import configure, flush, mark, phase, step, watch


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
