"""The whole cluster live, from Prometheus: ``gpuwatch cluster --prometheus URL``.

``client``: Prometheus' HTTP API (auth, TLS, timeouts, hostile answers); ``model``: the
GPU cells, their states and the ranks, one query per metric family and refresh;
``history``: a host's timelines from range queries; ``text``: the view as plain lines
(``--once``). No textual here: the view is ``gpuwatch.tui.cluster``. See docs/cluster.md.
"""

from .client import Auth, PromClient, PromError, Series, parse_matchers, selector
from .model import (
    LOST,
    OK,
    ROW_FAMILIES,
    SLOW,
    SLOW_EVERY,
    SORTS,
    STALE,
    Answers,
    Cluster,
    Gpu,
    fetch,
)

__all__ = [
    "LOST",
    "OK",
    "ROW_FAMILIES",
    "SLOW",
    "SLOW_EVERY",
    "SORTS",
    "STALE",
    "Answers",
    "Auth",
    "Cluster",
    "Gpu",
    "PromClient",
    "PromError",
    "Series",
    "fetch",
    "parse_matchers",
    "selector",
]
