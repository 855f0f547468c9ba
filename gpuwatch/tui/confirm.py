"""A yes/no question in a modal (quitting while the child still runs)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ._text import plain_lines


class Confirm(ModalScreen[bool]):
    """Ask ``question`` (lines of untrusted text); ``y`` answers yes, ``n`` / ``escape`` no."""

    DEFAULT_CSS = """
    Confirm {
        align: center middle;
    }
    Confirm > Vertical {
        width: 80;
        max-width: 90%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 1 2;
    }
    Confirm Static {
        width: 100%;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, *question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(plain_lines(self.question))
            yield Static("[b]y[/b] yes   [b]n[/b] no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
