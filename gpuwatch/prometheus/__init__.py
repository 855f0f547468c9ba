"""A Prometheus exporter of a live session: ``--prometheus [HOST:]PORT``.

The metrics and what they read (:mod:`.exporter`), and the one-thread HTTP server that
answers the scrapes (:mod:`.http_server`). Imported only when ``--prometheus`` is given:
``gpuwatch --help`` never loads prometheus_client.
"""

from .exporter import (
    JOB,
    MAX_PHASE_NAMES,
    METRICS,
    RANK_INFO,
    STRATEGIES,
    MetricsServer,
    SessionCollector,
    host_port,
)

__all__ = [
    "JOB",
    "MAX_PHASE_NAMES",
    "METRICS",
    "RANK_INFO",
    "STRATEGIES",
    "MetricsServer",
    "SessionCollector",
    "host_port",
]
