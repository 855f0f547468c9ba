"""Training-side instrumentation: runs inside the user's training process.

Imports neither textual, numpy nor sqlite3, and torch only if the process already did.
"""

from . import _oom
from ._api import configure, flush, mark, phase, step
from ._watch import watch

_oom.install()

__all__ = ["configure", "flush", "mark", "phase", "step", "watch"]
