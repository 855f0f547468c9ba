"""The child processes of the processes gpuwatch follows: a DataLoader's workers, a
launcher's ranks, for the Processes tab's tree.

A worker of a DataLoader uses no GPU and sends nothing, so neither NVML nor the annotation
socket names it; its parent's ``/proc/PID/task/PID/children`` does (the children its main
thread started, where DataLoaders start their workers; Linux with CONFIG_PROC_CHILDREN,
as distributions build it; elsewhere no child is shown). Each followed process's children
are read once every :data:`EVERY` seconds (workers live for an epoch: a few seconds late
costs nothing, and hundreds of processes are not read every tick); a child not seen
before is described, and the parent's description gains ``children``, its child pids (a
new description only when they change).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

EVERY = 5.0
"""Seconds between two reads of a followed process's children."""

MAX_CHILDREN = 64
"""Children of one process named at most (a fork bomb is not a tree to draw)."""


def read_children(pid: int) -> list[int] | None:
    """The pids of the children ``pid``'s main thread started; None where unknown."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            data = f.read(16 * 1024)
    except OSError:
        return None
    try:
        return [int(p) for p in data.split()[:MAX_CHILDREN]]
    except ValueError:
        return None


class ChildWatch:
    """Reads the children of followed processes every :data:`EVERY` seconds and says what
    changed through ``describe`` and ``publish``.

    Args:
        describe: Describes a pid (:func:`~gpuwatch.sources.gpu.describe_pid`).
        publish: Gives the session a pid's description (``set_proc_info``).
        every: Seconds between two reads of one process's children (None: :data:`EVERY`).
    """

    def __init__(
        self,
        describe: Callable[[int], dict[str, Any]],
        publish: Callable[[int, dict[str, Any]], None],
        every: float | None = None,
    ) -> None:
        self.describe = describe
        self.publish = publish
        self.every = EVERY if every is None else every
        self._due: dict[int, float] = {}  # pid -> when its children are read next
        self._kids: dict[int, tuple[int, ...]] = {}  # pid -> its children as published
        self._described: set[int] = set()  # children described

    def update(self, pids: Iterable[int], info_of: Callable[[int], dict[str, Any] | None]) -> None:
        """Read the children of those of ``pids`` that are due; forget the others.

        ``info_of(pid)``: the parent's description now (None: not described yet, so its
        children wait for the next read).
        """
        now = time.monotonic()
        followed = set(pids)
        for pid in followed:
            due = self._due.get(pid)
            if due is None:  # spread the first reads over a period, not all in one tick
                due = self._due[pid] = now + (pid % 97) / 97 * self.every
            if now < due:
                continue
            self._due[pid] = now + self.every
            kids = read_children(pid)
            if kids is None:
                continue
            known = tuple(sorted(kids))
            info = info_of(pid)
            if info is None:
                continue
            if known == self._kids.get(pid, ()) and info.get("children", []) == list(known):
                continue  # as published (and not described anew since without them)
            for kid in known:
                if kid not in self._described:
                    self._described.add(kid)
                    self.publish(kid, self.describe(kid))
            self._kids[pid] = known
            self.publish(pid, {**info, "children": list(known)})
        for pid in [p for p in self._due if p not in followed]:
            del self._due[pid]
            self._kids.pop(pid, None)
        if len(self._described) > 4 * MAX_CHILDREN * max(1, len(followed)):
            # A bound, not a history: those described again are published again, no more.
            self._described = {k for kids in self._kids.values() for k in kids}
