"""A live-tensor tracker for the CPU: the truth the predictor's tests compare against."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage alive, with a resettable peak."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.peak = 0
        self._live: dict[int, weakref.finalize] = {}

    def track(self, t: Any) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live or st.nbytes() == 0:
            return
        n = st.nbytes()
        self.total += n

        def gone(key: int = key, n: int = n) -> None:
            self._live.pop(key, None)
            self.total -= n

        self._live[key] = weakref.finalize(st, gone)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        self.peak = max(self.peak, self.total)
        return out
