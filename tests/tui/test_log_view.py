"""The Log tab under tqdm-style output (issue 23, item 6): a ``\\r`` stream shows its
current line, and what the view holds stays bounded however long the bar runs."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

from gpuwatch.tui.log import MAX_PARTIAL, LogView

UPDATES = 100_000


class _LogApp(App):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        yield LogView(self.path)


def _bar(i: int) -> str:
    return f"{i * 100 // UPDATES:3d}%|{'#' * (i * 20 // UPDATES):20}| {i}/{UPDATES}"


async def test_a_progress_bar_shows_its_current_line_and_memory_stays_flat(
    tmp_path: Path,
) -> None:
    path = tmp_path / "child.log"
    path.write_bytes(b"loading\r\nepoch 1\n")
    app = _LogApp(path)
    async with app.run_test(size=(80, 12)) as pilot:
        view = app.query_one(LogView)
        with path.open("a") as f:
            for i in range(1, UPDATES + 1):
                f.write("\r" + _bar(i))
                if i % 10_000 == 0:
                    f.flush()
                    view.poll()
                    # The bar as it reads now, on one line under what came before.
                    assert list(view.lines) == ["loading", "epoch 1", _bar(i)]
                    # Before: every update since the last newline, kept (+4 MB here).
                    assert len(view._partial) <= len(_bar(i)) + 1
            f.write("\nepoch 2\n")
        view.poll()
        await pilot.pause()
        assert list(view.lines) == ["loading", "epoch 1", _bar(UPDATES), "epoch 2"]


async def test_a_line_without_end_is_held_to_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "child.log"
    path.write_bytes(b"")
    app = _LogApp(path)
    async with app.run_test(size=(80, 12)):
        view = app.query_one(LogView)
        with path.open("a") as f:
            for _ in range(8):
                f.write("x" * 500_000)
                f.flush()
                view.poll()
        assert len(view._partial) <= MAX_PARTIAL
        assert len(view.lines) == 1
