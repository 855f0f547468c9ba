"""Calls that may hang on the network, run where nobody has to wait for them.

Prometheus may take its whole timeout to answer, or never answer in time. A thread of a
``concurrent.futures`` executor (asyncio's default executor, which runs Textual's thread
workers, included) is joined when the interpreter exits, so a query in flight on one kept
``q`` waiting for the timeout. Here each call runs on a daemon thread, which the exit does
not wait for, and the caller waits for it in short slices, asking ``cancelled`` between
them: a cancelled caller returns at once and leaves the call to end on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

POLL_S = 0.05
"""How often a waiting caller asks whether it was cancelled (seconds)."""


class Cancelled(Exception):
    """The caller was cancelled (the view is closing) before the call ended."""


def never() -> bool:
    return False


def call(fn: Callable[[], R], cancelled: Callable[[], bool] = never, name: str = "gw-call") -> R:
    """``fn()`` on a daemon thread; its result, or what it raised.

    Raises:
        Cancelled: ``cancelled()`` became true first.
    """
    return each(lambda _: fn(), [None], 1, cancelled, name)[0]


def each(
    fn: Callable[[T], R],
    items: Sequence[T],
    threads: int,
    cancelled: Callable[[], bool] = never,
    name: str = "gw-query",
) -> list[R]:
    """``fn`` over ``items`` on at most ``threads`` daemon threads, the results in the
    order of ``items`` (an exception ``fn`` raised is raised here, the first in order).

    Raises:
        Cancelled: ``cancelled()`` became true before every call ended.
    """
    results: list[object] = [None] * len(items)
    failed: list[BaseException | None] = [None] * len(items)
    lock = threading.Lock()
    todo = iter(range(len(items)))
    done = threading.Event()
    left = [len(items)]

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # handed to the caller, who decides
                failed[i] = exc
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    if not items:
        return []
    for n in range(max(1, min(threads, len(items)))):
        threading.Thread(target=work, name=f"{name}-{n}", daemon=True).start()
    while not done.wait(POLL_S):
        if cancelled():
            raise Cancelled()
    for exc in failed:
        if exc is not None:
            raise exc
    return results  # type: ignore[return-value]
