"""The dashboard's screen: drawn once at start, laid out again only for a new size."""

from __future__ import annotations

from textual import events
from textual.geometry import Size
from textual.screen import Screen


class DashboardScreen(Screen[None]):
    """The app's default screen, which sends its first picture once.

    At start Textual drew the dashboard four times over, the same picture each time: the
    first layout (every widget new: a full frame), the repaint that laying out asks of
    every widget given its size and of the screen (two more), and one for each of two
    resize events of the size the screen already has (the app's own, then the driver's,
    which the app passes on though the size is unchanged), and the restyle and redraw
    when the breakpoint classes came after the first frame. In a terminal that is wasted
    work; for a browser each frame is sent, parsed and painted by every visitor.
    """

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        first = not self.stack_updates
        if first:
            # Textual gives the breakpoint classes at the first resize event, after the
            # first frame: drawn without them (at 80x24 in the wrong layout), then
            # restyled and drawn again. Here the restyle of the resume takes them.
            self.update_classes(self._breakpoints(self.app.size), update=False)
        event.prevent_default()  # Screen's own handler is called here, then no other
        Screen._on_screen_resume(self, event)
        if first and self.is_current:
            # The first layout of every widget painted the whole screen (at once, or
            # queued with all of it dirty): what it asked to repaint is in that frame.
            self._repaint_required = False

    def _screen_resized(self, size: Size) -> None:
        # A resize to the size the screen has changes nothing that a widget's own
        # refresh would not lay out.
        if size != self.outer_size:
            super()._screen_resized(size)

    def _breakpoints(self, size: Size) -> dict[str, bool]:
        """The breakpoint classes of ``size``, as the screen's resize handler gives them."""
        app = self.app
        across = self.HORIZONTAL_BREAKPOINTS
        down = self.VERTICAL_BREAKPOINTS
        across = (app.HORIZONTAL_BREAKPOINTS if across is None else across) or []
        down = (app.VERTICAL_BREAKPOINTS if down is None else down) or []
        classes = {name: False for _, name in [*across, *down]}
        for cells, breakpoints in ((size.width, across), (size.height, down)):
            reached = [(at, name) for at, name in breakpoints if cells >= at]
            if reached:
                classes[max(reached)[1]] = True
        return classes
