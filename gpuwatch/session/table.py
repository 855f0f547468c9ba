"""A growable, thread-safe columnar table of numpy arrays, ordered by a time column.

Samplers append rows from their own threads while the UI reads; appends are amortised O(1)
(capacity doubles) and a read takes a consistent snapshot under a short lock. Slices are
views, so a reader never copies more than it asks for.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

MISSING_INT = np.iinfo(np.int64).min
"""Stored where an integer field is unknown ("n/a"); never a real byte count."""


class Table:
    """Columns of equal length, the first of which is a non-decreasing int64 time column.

    Args:
        columns: ``(name, dtype)`` pairs; the first must be the time column.
        capacity: Initial rows to allocate.
    """

    def __init__(self, columns: Sequence[tuple[str, str]], capacity: int = 1024) -> None:
        self.names = tuple(name for name, _ in columns)
        self.dtypes = {name: np.dtype(dtype) for name, dtype in columns}
        self.time = self.names[0]
        self._cap = max(16, capacity)
        self._cols = {n: np.empty(self._cap, dtype=self.dtypes[n]) for n in self.names}
        self._n = 0
        self._lock = threading.Lock()
        self.version = 0

    def __len__(self) -> int:
        return self._n

    def _grow(self, need: int) -> None:
        cap = self._cap
        while cap < need:
            cap *= 2
        if cap == self._cap:
            return
        n = self._n
        for name in self.names:
            new = np.empty(cap, dtype=self.dtypes[name])
            new[:n] = self._cols[name][:n]
            self._cols[name] = new
        self._cap = cap

    def append(self, row: Mapping[str, float | int] | Sequence[float | int]) -> None:
        """Append one row, given as a mapping by name or a sequence in column order.

        Missing names in a mapping are stored as NaN (floats) or :data:`MISSING_INT`.
        """
        with self._lock:
            n = self._n
            if n >= self._cap:
                self._grow(n + 1)
            cols = self._cols
            if isinstance(row, Mapping):
                for name in self.names:
                    value = row.get(name)
                    cols[name][n] = _missing(self.dtypes[name]) if value is None else value
            else:
                for name, value in zip(self.names, row, strict=True):
                    cols[name][n] = _missing(self.dtypes[name]) if value is None else value
            self._n = n + 1
            self.version += 1

    def extend(self, columns: Mapping[str, np.ndarray | Iterable[float | int]]) -> None:
        """Append many rows given column-wise (all columns the same length)."""
        arrays = {n: np.asarray(columns[n], dtype=self.dtypes[n]) for n in self.names}
        k = len(arrays[self.time])
        if k == 0:
            return
        with self._lock:
            n = self._n
            self._grow(n + k)
            for name in self.names:
                self._cols[name][n : n + k] = arrays[name]
            self._n = n + k
            self.version += 1

    def snapshot(self) -> dict[str, np.ndarray]:
        """Views of all rows so far (consistent: all columns cut at the same length)."""
        with self._lock:
            n = self._n
            return {name: col[:n] for name, col in self._cols.items()}

    def between(self, t0: int, t1: int, pad: int = 0) -> dict[str, np.ndarray]:
        """Views of rows with ``t0 <= time <= t1``, plus ``pad`` rows either side."""
        cols = self.snapshot()
        t = cols[self.time]
        i0 = max(0, int(np.searchsorted(t, t0, "left")) - pad)
        i1 = min(len(t), int(np.searchsorted(t, t1, "right")) + pad)
        return {name: col[i0:i1] for name, col in cols.items()}

    def last(self) -> dict[str, float | int] | None:
        """The newest row as Python values, or None when empty."""
        with self._lock:
            n = self._n
            if n == 0:
                return None
            return {name: col[n - 1].item() for name, col in self._cols.items()}

    def at(self, t: int) -> dict[str, float | int] | None:
        """The newest row at or before ``t`` (step-hold), or None."""
        cols = self.snapshot()
        i = int(np.searchsorted(cols[self.time], t, "right")) - 1
        if i < 0:
            return None
        return {name: col[i].item() for name, col in cols.items()}

    def span(self) -> tuple[int, int] | None:
        """(first, last) time, or None when empty."""
        with self._lock:
            if self._n == 0:
                return None
            t = self._cols[self.time]
            return int(t[0]), int(t[self._n - 1])


def _missing(dtype: np.dtype) -> float | int:
    return np.nan if dtype.kind == "f" else MISSING_INT if dtype.kind == "i" else 0
