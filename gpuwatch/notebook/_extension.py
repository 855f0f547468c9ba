"""``%load_ext gpuwatch``: every cell a phase, and a line under each that used torch memory.

Each cell that runs is a phase named ``[N] <its first line>``; the automatic phases
(forward, backward, optimizer.step, ...) nest inside it. When it ends, nothing gpuwatch
opened stays open (``_auto.cell_ends``): the time between cells is idle, and no other cell
runs under the activations measurement. The client measures locally (:class:`CellTap`), so
the line appears whether or not a dashboard or recorder listens; what a listener gets is
what any instrumented process sends, with the kernel named by its notebook.

``%gpuwatch off`` / ``on`` turns the lines off and on, ``%gpuwatch chart`` adds the cell's
timeline under each line (``%gpuwatch nochart``), ``%gpuwatch`` alone says what is on.
"""

from __future__ import annotations

import resource
import sys
import threading
from typing import Any

from .. import predict as pr
from ..analysis.forecast import capacity_here
from ..instrument import cells
from . import _chart
from ._line import CellReport, Predictor, report, spans_of, step_ahead
from ._tap import CellTap, Ended

MAX_FIRST_LINE = 60
"""Characters of a cell's first line kept in its phase name."""

USAGE = "usage: %gpuwatch [on | off | chart | nochart | status]"


def cell_name(number: int | None, source: str) -> str:
    """``[3] loss.backward()``: the cell's number and its first non-blank line."""
    first = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    if len(first) > MAX_FIRST_LINE:
        first = first[: MAX_FIRST_LINE - 1] + "…"
    head = f"[{number}]" if number is not None else "[ ]"
    return f"{head} {first}".rstrip()


def _peak_rss() -> int:
    """The process's peak resident set size so far, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


class CellWatch:
    """The extension's state in one kernel: hooks, the open cell, the tap, the settings.

    Args:
        shell: The IPython shell.
    """

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.lines = True
        self.chart = False
        self.tap = CellTap()
        self.predictor = Predictor()
        self.sid: int | None = None
        self.name = ""
        self.rss0 = 0
        self.used0: int | None = None
        self.last: CellReport | None = None
        self._torch_seen = False
        self._finder: _TorchWatcher | None = None
        # The shell's count read in pre_run_cell, and what to add to it for the cell's
        # number: IPython 9 counts the running cell before pre_run_cell, 8 after. Learnt
        # again at each cell's end (the load cell's included) from its result.
        self._count = _count(shell)
        self._offset = -1 if _ipython_major() >= 9 else 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Register the cell hooks and the tap; watch for torch if it is not imported."""
        cells.set_tap(self.tap)
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self.shell.register_magic_function(self.magic, magic_kind="line", magic_name="gpuwatch")
        if "torch" in sys.modules:
            self._torch_imported()
        else:
            self._finder = _TorchWatcher(self._torch_imported)
            sys.meta_path.insert(0, self._finder)

    def stop(self) -> None:
        """Undo :meth:`start`: hooks, tap, magic; a cell still open is closed."""
        for event, fn in (
            ("pre_run_cell", self.pre_run_cell),
            ("post_run_cell", self.post_run_cell),
        ):
            try:
                self.shell.events.unregister(event, fn)
            except ValueError:
                pass
        if self.sid is not None:
            cells.end(self.sid, self.name, error="unloaded")
            self.sid = None
        before = cells.set_tap(None)
        if before is not self.tap:
            cells.set_tap(before)  # not ours: leave it
        if self._finder is not None:
            try:
                sys.meta_path.remove(self._finder)
            except ValueError:
                pass
            self._finder = None
        try:
            self.shell.magics_manager.magics["line"].pop("gpuwatch", None)
        except Exception:
            pass

    def _torch_imported(self) -> None:
        """torch is here: the automatic phases, and models built later looked for."""
        if self._torch_seen:
            return
        self._torch_seen = True
        try:
            cells.torch_imported()
        except Exception:
            pass

    # ------------------------------------------------------------------ cells

    def pre_run_cell(self, info: Any = None) -> None:
        """A cell begins: its phase opens (never raises into the kernel)."""
        try:
            if getattr(info, "silent", False):
                return
            if not self._torch_seen and "torch" in sys.modules:
                self._torch_imported()
            if self.sid is not None:  # the last cell's end was never heard (an interrupt)
                cells.end(self.sid, self.name, error="unfinished")
            self._count = _count(self.shell)
            number = None if self._count is None else self._count + self._offset
            if not getattr(info, "store_history", True):
                number = None
            self.name = cell_name(number, getattr(info, "raw_cell", "") or "")
            self.rss0 = _peak_rss()
            self.used0 = cells.device_used()
            self.sid = cells.begin(self.name)
        except Exception:
            self.sid = None

    def post_run_cell(self, result: Any = None) -> None:
        """A cell ended: close what it opened, then show its line."""
        sid, self.sid = self.sid, None
        number = getattr(result, "execution_count", None)
        if type(number) is int and self._count is not None:
            self._offset = number - self._count
        if sid is None:
            return
        try:
            error = getattr(result, "error_in_exec", None) or getattr(
                result, "error_before_exec", None
            )
            cells.end(sid, self.name, type(error).__name__ if error else None)
            rep, inside = self._report(sid)
            self.last = rep
            if rep is not None and self.lines:
                self._show(rep, inside)
        except Exception:
            pass

    def _report(self, sid: int) -> tuple[CellReport | None, list[Ended]]:
        """The cell's line, and the spans that ran inside it."""
        cells.tap_now()
        cell = self.tap.ended(sid)
        if cell is None:
            return None, []
        inside = self.tap.inside(cell)
        facts = cells.facts()
        spans = spans_of(self.tap.history(cell.t1 + 1)[-(len(inside) + 64) :])
        prediction = self.predictor(facts)
        rep = report(cell, inside, spans, prediction, self.tap.first_step)
        if rep is None:
            return None, inside
        if prediction is not None and self.chart:
            times, values = pr.predicted_curve(prediction, spans, first_step=self.tap.first_step)
            rep.curve = [(t, v) for t, v in zip(times, values, strict=True) if t >= cell.t0]
        if rep.measured:
            after = cells.device_used()
            if self.used0 is not None and after is not None:
                rep.used = (self.used0, after)
        else:
            rss = _peak_rss()
            rep.rss_peak = (rss, rss > self.rss0)
        if self.predictor.error:
            rep.notes.append(f"facts unusable ({self.predictor.error})")
        if any(s.name == "backward" for s in inside):  # the step cell comes next
            rep.ahead = step_ahead(inside, prediction, self.tap.first_step, capacity_here(facts))
        return rep, inside

    def _show(self, rep: CellReport, inside: list[Ended]) -> None:
        from IPython.display import display

        data = {"text/plain": rep.text(), "text/html": rep.html()}
        if self.chart:
            svg = _chart.svg(rep, inside, self.tap.window(rep.cell.t0, rep.cell.t1))
            if svg:
                data["text/html"] += svg
        display(data, raw=True)

    # ------------------------------------------------------------------ the magic

    def magic(self, line: str = "") -> None:
        """``%gpuwatch [on | off | chart | nochart | status]``."""
        word = line.strip().lower()
        if word == "off":
            self.lines = False
        elif word == "on":
            self.lines = True
        elif word == "chart":
            self.lines = self.chart = True
        elif word == "nochart":
            self.chart = False
        elif word not in ("", "status"):
            print(USAGE, file=sys.stderr)
            return
        lines = "on" if self.lines else "off"
        chart = "on" if self.chart else "off"
        print(f"gpuwatch: lines under cells {lines}, chart {chart}")


def _count(shell: Any) -> int | None:
    count = getattr(shell, "execution_count", None)
    return count if type(count) is int else None


def _ipython_major() -> int:
    ipython = sys.modules.get("IPython")
    info = getattr(ipython, "version_info", None)
    return int(info[0]) if info else 0


class _TorchWatcher:
    """A meta-path finder that notices ``import torch`` end, once (then steps aside)."""

    def __init__(self, then: Any) -> None:
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is None:
                continue
            loader = spec.loader
            if loader is not None and hasattr(loader, "exec_module"):
                spec.loader = _Loader(loader, self.then)
            return spec
        return None


class _Loader:
    """torch's own loader, then ``then()`` once torch has finished importing."""

    def __init__(self, loader: Any, then: Any) -> None:
        self._loader = loader
        self._then = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            module.__loader__ = self._loader  # torch sees its real loader
            module.__spec__.loader = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        try:
            self._then()
        except Exception:
            pass


_active: CellWatch | None = None
_lock = threading.Lock()


def load(shell: Any) -> None:
    """``%load_ext gpuwatch`` (and ``%reload_ext``): one set of hooks per kernel."""
    global _active
    with _lock:
        if _active is not None:
            if _active.shell is shell:
                return
            _active.stop()
        _active = CellWatch(shell)
        _active.start()


def unload(shell: Any) -> None:
    """``%unload_ext gpuwatch`` (and the first half of ``%reload_ext``)."""
    global _active
    with _lock:
        if _active is not None:
            _active.stop()
            _active = None


def active() -> CellWatch | None:
    """The extension's state in this kernel, if it is loaded."""
    return _active


__all__ = ["CellWatch", "Ended", "active", "cell_name", "load", "unload"]
