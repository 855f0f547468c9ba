"""The device panels' list: a panel a device, in their order, drawn where they are in view."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from textual import on
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.message import Message
from textual.widget import Widget

from ..analysis.predicted import PredictedLine
from ..session import Session, is_host
from .panel import DevicePanel


class PanelList(VerticalScroll, inherit_bindings=False):
    """The device panels: they scroll, but ``home`` and ``end`` are the dashboard's.

    In the one-panel layout (80x24) a panel has the focus, and a scrolling container's own
    ``home`` / ``end`` (scroll to top / bottom) took the keys before the app saw them.

    Args:
        session: The session the panels draw.
        predicted: The predicted lines by pid, shared with the screen (which updates them).
    """

    BINDINGS = [b for b in VerticalScroll.BINDINGS if b.key not in ("home", "end")]  # type: ignore[union-attr]

    class Scrolled(Message):
        """The list scrolled: panels out of view may have come into it."""

    class CameIntoView(Message):
        """A panel not drawn at the last frame (out of view) is in view now: redraw."""

    _top: Widget | None = None  # what show_at_top waits to scroll to (not laid out yet)

    def __init__(
        self, session: Session, predicted: Mapping[int, PredictedLine], *, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.session = session
        self.predicted = predicted
        self.by_key: dict[str, DevicePanel] = {}
        self.arranged: tuple[str, ...] = ()  # the panels' keys in the order they stand
        self.host_run = False  # instrumented processes train on the host, none on a GPU
        self.behind: list[DevicePanel] = []  # out of view at the last frame

    # ------------------------------------------------------------------ scrolling

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled())

    def show_at_top(self, widget: Widget) -> None:
        """Scroll ``widget`` to the top, now or, if the list has no size yet (shown again
        after the overview: hidden, it is laid out a few refreshes later), once it has."""
        self._top = None if self.size else widget
        self.scroll_to_widget(widget, animate=False, top=True)

    def on_resize(self) -> None:
        widget, self._top = self._top, None
        if widget is not None:
            self.call_after_refresh(self.scroll_to_widget, widget, animate=False, top=True)

    def focus_on(self, key: str | None) -> None:
        """Focus device ``key``'s panel (None, or one not known: the first), at the top."""
        target = self.by_key.get(key) if key is not None else None
        if target is None:
            panels = self.panels
            target = panels[0] if panels else None
        if target is not None:
            target.focus(scroll_visible=False)
            self.show_at_top(target)

    # ------------------------------------------------------------------ panels

    @property
    def panels(self) -> list[DevicePanel]:
        """Device panels in display order (as :meth:`reorder` last placed them: a frame
        asks no process where it trains)."""
        return [self.by_key[k] for k in self.arranged]

    def new_panels(self) -> list[DevicePanel]:
        """A panel for every device the session knows that has none yet, in :meth:`_order`."""
        keys = [k for k in self._placing()[0] if k not in self.by_key]
        for key in keys:
            self.by_key[key] = DevicePanel(self.session, key, self.predicted)
        return [self.by_key[k] for k in keys]

    def sync(self) -> None:
        """Mount a panel for every device the session knows, in :meth:`_order`."""
        for panel in self.new_panels():
            self.mount(panel)

    def reorder(self) -> bool:
        """Keep the panels in :meth:`_order` (a process that trains on the CPU makes the
        host panel first when its hello comes); the first panel keeps the focus it had.

        Returns:
            Whether :attr:`host_run` changed (the overview is placed anew).
        """
        order, trains_on = self._placing()
        panels = [self.by_key[k] for k in order if k in self.by_key]
        # Training on the CPU alone, the GPUs show nothing of it: the panels, the host's
        # first, are the first screen even where they do not all fit (see panels_fit).
        trains = [(p.is_host, trains_on[p.key]) for p in panels]
        host_run = any(h and t for h, t in trains) and not any(t and not h for h, t in trains)
        changed, self.host_run = host_run != self.host_run, host_run
        keys = tuple(p.key for p in panels)
        if keys == self.arranged:
            return changed
        first = self.by_key[self.arranged[0]] if self.arranged else None
        self.arranged = keys
        for before, panel in itertools.pairwise(panels):
            self.move_child(panel, after=before)
        # With GPUs to show, a host panel is a small strip, unless it is where training runs.
        gpus = any(not p.is_host for p in panels)
        for panel in panels:
            if panel.is_host:
                panel.set_class(gpus and not trains_on[panel.key], "-secondary")
        if panels and first is not panels[0] and (first is None or first.has_focus_within):
            panels[0].focus(scroll_visible=False)
            self.scroll_home(animate=False)
        return changed

    def _placing(self) -> tuple[list[str], dict[str, bool]]:
        """Every device's key in :meth:`_order`, and whether an instrumented process trains
        on it (:meth:`_trains_on`), in one read of the session."""

        def read() -> tuple[list[str], dict[str, bool]]:
            trains = {key: self._trains_on(key) for key in self.session.devices}
            return sorted(trains, key=lambda key: self._order(key, trains[key])), trains

        return self.session.read(read)

    def _trains_on(self, key: str) -> bool:
        """Does an instrumented process report its memory on this panel: a GPU its
        allocator reads, or the host for one that uses no GPU (torch on the CPU)."""
        if is_host(key):
            return any(not p.devices for p in self.session.processes_of_host(key))
        return bool(self.session.processes_on(key))

    def _order(self, key: str, trains: bool) -> tuple[str, bool, bool, int, str]:
        """Panels by recording, the ones an instrumented process trains on first (whatever
        its device), then GPUs by index, the host last."""
        dev = self.session.devices[key]
        index = dev.index if dev.index is not None else 1 << 30
        return (dev.origin, not trains, dev.kind == "host", index, key)

    # ------------------------------------------------------------------ drawing

    def place(self, stepping: bool, short: bool) -> None:
        """Tell each panel where it is among the others when stepping through them one at
        a time, and whether the layout is the short one."""
        panels = self.panels
        for i, panel in enumerate(panels):
            panel.place = f"{i + 1}/{len(panels)} tab ▸" if stepping else ""
            panel.short = short

    def update_in_view(
        self, window: tuple[int, int], cursor: int | None, version: int, at: int
    ) -> None:
        """Update the panels in view (:meth:`DevicePanel.update_view`); those scrolled out
        of it (a run on the CPU keeps every GPU's panel below the host's) are updated when
        they come into view (:class:`CameIntoView`)."""
        view = self.region
        self.behind = []
        for panel in self.by_key.values():
            if self._out_of_view(panel, view):
                self.behind.append(panel)
                continue
            panel.update_view(window, cursor, version, at)
        if self.behind:  # a new layout can bring them into view without a scroll
            self.call_after_refresh(self._moved)

    @staticmethod
    def _out_of_view(panel: DevicePanel, view: Region) -> bool:
        region = panel.region
        return bool(region and view) and not region.overlaps(view)  # laid out, and outside

    @on(Scrolled)
    def _scrolled(self) -> None:
        # The panels' regions are those of the new offset once the screen has refreshed.
        if self.behind:
            self.call_after_refresh(self._moved)

    def _moved(self) -> None:
        view = self.region
        if any(not self._out_of_view(p, view) for p in self.behind):
            self.post_message(self.CameIntoView())
