"""``gpuwatch cluster``: every GPU Prometheus knows, a host's timelines on enter, the ranks.

``app``: the app (summary, grid, ranks tab) and its refreshes; ``grid``: the GPU rows,
repainted where they changed; ``host``: a host's drill-down from incremental range
queries; ``cadence``: the one-in-flight, once-an-interval rule both share. Styles are in
``app.tcss`` and ``host.tcss``. The data side (Prometheus, the model) is
:mod:`gpuwatch.cluster`, free of textual.
"""

from .app import ClusterApp, refresh_interval
from .grid import Grid
from .host import GpuBlock, HostScreen

__all__ = ["ClusterApp", "GpuBlock", "Grid", "HostScreen", "refresh_interval"]
