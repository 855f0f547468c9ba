"""The help screen (``?``): every key and mouse action, and what the lines mean.

The keys come from the screen that opened it, as bound now (:func:`~.keys.bound_keys`: a
keymap's keys, not the defaults); this page holds only the words around them.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# gpuwatch

Each panel is one device. The chart shows, on one time axis:

| line | what it is |
| --- | --- |
| **nvidia-smi** | NVML's *used* memory for the whole GPU (host: RAM used) |
| **reserved** | what torch's caching allocator holds from the driver |
| **allocated** | what live tensors use (host: the script's RSS) |
| **predicted** | what gpuwatch expects from the model's facts |
| **peak in phase** | the exact allocator peak inside each phase, drawn over the phase |

nvidia-smi − reserved is the CUDA context and memory outside torch (and other processes);
reserved − allocated is the allocator's cache. Under the chart, the phase band has one row
per instrumented process (past six, the rest fold into `+N more`): ◆ is a mark, ✖ an
out-of-memory error; the row under it names the phases in view in their colours. The
breakdown bar splits the memory at the cursor from the figures valid then, and never adds
up to more than nvidia-smi's used memory: other processes, the CUDA context (and memory
outside torch), ▓ *unclaimed* (used memory no process accounts for: without NVML's process
list, all that torch does not hold; with it, what the list leaves out beyond the driver's
few MiB, such as other containers' processes), ╱ *not split* (used memory the figures at the cursor
cannot split: NVML's process list is older than a change, or its used sample predates the
allocator's figures), ▒ fragmented cache, the cache, then what is allocated split by the
prediction (*over-predicted* names a prediction above what can have been allocated; ▲ *phase
peak +N* what the phase reached above the figure at the cursor, as predicted: the cause of a
spike between two boundaries); ░ is free memory. The header and legend give the figures
at the cursor (without one: the newest time, or the playback position). Inside a phase with
an exact peak the bar and the legend read that phase's explanation, the one of the Peaks tab
and `gpuwatch info`: at its peak the bar splits it the same way, and the legend sets the
phase's *predicted peak* beside it. In a phase an out-of-memory error broke, the bar tells
what it requested and what was free.

Each ✖ also says what would have fitted: the run re-planned from its recorded facts and
GPU (as `gpuwatch estimate --from` does, off the screen's thread), the cheapest ranked
change that fits, such as `--checkpointing` or a smaller micro-batch with accumulation.
The status line at the cursor names it (`--checkpointing fits`, or the closest change),
the ✖'s row in the Peaks tab's marks gives its peak against the GPU's usable memory, and
`o`'s notice repeats it once planned.

On a short terminal one panel fills the screen: `tab` and `shift+tab` step through them.

CUDA runs asynchronously: phase boundaries are when Python *enqueued* the work. Allocated,
reserved and NVML memory line up with them; GPU utilisation does not.

## Keys

| key | action |
| --- | --- |
{keys}

## On the Processes tab

| key | action |
| --- | --- |
{process_keys}

Signals go only to your own processes (root: any), never from a replay or a served page;
a refusal says why.

## Mouse

| action | effect |
| --- | --- |
| click a chart | put the cursor there (pauses) |
| wheel on a chart | zoom around the pointer |
| horizontal wheel | pan |
| click a tab | switch view |

Every action is also in the command palette (`ctrl+p`), and so is the theme switcher.
"""


class HelpScreen(ModalScreen[None]):
    """Keys, mouse actions and a legend."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 90;
        max-width: 95%;
        height: 90%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def __init__(
        self,
        keys: list[tuple[str, str]],
        text: str = HELP,
        process_keys: list[tuple[str, str]] | None = None,
    ) -> None:
        """``keys`` and ``process_keys``: (keys as shown, what they do) rows of the page's
        ``{keys}`` and ``{process_keys}`` tables (``text``: the cluster view has its own)."""
        super().__init__()
        self.keys = keys
        self.text = text
        self.process_keys = process_keys or []

    def compose(self) -> ComposeResult:
        def table(rows: list[tuple[str, str]]) -> str:
            return "\n".join(f"| `{key}` | {desc} |" for key, desc in rows)

        page = self.text.format(keys=table(self.keys), process_keys=table(self.process_keys))
        with VerticalScroll():
            yield Markdown(page)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
