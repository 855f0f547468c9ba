"""Training-side instrumentation: runs inside the user's training process.

Imports neither textual, numpy nor sqlite3, and torch only if the process already did.

Besides the user's API (``phase``, ``mark``, ``step``, ``watch``, ``configure``,
``flush``), this face is what gpuwatch's own integrations (``gpuwatch.integrations``) and
automatic phases build on:

- the span stack: :func:`open_span` / :func:`close_span` (a phase begun and ended by id,
  on the same per-thread stack as ``phase``) and :func:`current_phase`;
- :func:`report_oom` for an out-of-memory error a framework caught;
- :func:`describe_batch` and :func:`auto_phases` for frameworks that know the batch and
  the model calls.
"""

from . import _oom
from ._activations import Meter as ActivationMeter
from ._api import (
    close_span,
    configure,
    current_phase,
    flush,
    mark,
    open_span,
    phase,
    report_oom,
    step,
)
from ._facts import batch_facts, collect_facts
from ._watch import describe_batch, facts_listeners, watch

_oom.install()


def auto_phases(*, discover: bool = True) -> bool:
    """Install the automatic phases (torch must be imported); see ``_auto.install``."""
    from . import _auto

    return _auto.install(discover=discover)


__all__ = [
    "ActivationMeter",
    "auto_phases",
    "batch_facts",
    "close_span",
    "collect_facts",
    "configure",
    "current_phase",
    "describe_batch",
    "facts_listeners",
    "flush",
    "mark",
    "open_span",
    "phase",
    "report_oom",
    "step",
    "watch",
]
