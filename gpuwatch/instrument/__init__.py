"""Training-side instrumentation: runs inside the user's training process.

Imports neither textual, numpy nor sqlite3, and torch only if the process already did.
"""

from ._api import configure, flush, mark, phase, step

__all__ = ["configure", "flush", "mark", "phase", "step"]
