"""SVG snapshots of the main views at a fixed terminal size, in every theme.

Regenerate after an intended change with ``python -m pytest tests/test_snapshots.py
--snapshot-update`` and look at the report before committing.
"""

from __future__ import annotations

import pytest
import synthetic

from gpuwatch.tui.app import GpuwatchApp

SIZE = (140, 45)
# Zoom to the six seconds of data and put the cursor inside an optimizer.step.
ZOOMED = ("plus", "plus", "plus", "home", "m", "left", "left", "left", "left")


def app(theme: str = "gpuwatch-dark") -> GpuwatchApp:
    return GpuwatchApp(synthetic.build(), theme_name=theme, clock=lambda: synthetic.end_time())


@pytest.mark.parametrize("theme", ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"])
def test_timelines(snap_compare, theme: str) -> None:
    assert snap_compare(app(theme), press=ZOOMED, terminal_size=SIZE)


def test_peaks_table(snap_compare) -> None:
    assert snap_compare(app(), press=("2",), terminal_size=SIZE)


def test_process_table(snap_compare) -> None:
    assert snap_compare(app(), press=("3",), terminal_size=SIZE)


def test_help_screen(snap_compare) -> None:
    assert snap_compare(app(), press=("question_mark",), terminal_size=SIZE)
