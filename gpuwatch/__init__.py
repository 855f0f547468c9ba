"""gpuwatch: where did my GPU memory go?

A training script imports this package for its annotations::

    import gpuwatch

    with gpuwatch.phase("forward"):
        loss = model(batch)
    gpuwatch.mark("checkpoint saved")

or lets gpuwatch infer the phases (forward, backward, optimizer.step, ...) itself::

    gpuwatch.watch(model, optimizer)

Importing it loads only the training-side client (no textual, numpy, sqlite3 or torch);
the dashboard lives in ``gpuwatch.tui`` and is started by the ``gpuwatch`` command.
"""

from ._version import __version__
from .instrument import configure, flush, mark, phase, step, watch

__all__ = ["__version__", "configure", "flush", "mark", "phase", "step", "watch"]
