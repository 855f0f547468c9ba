"""What a dashboard for a browser costs before its first frame, paid ahead: ``gpuwatch
serve``'s fork server calls :func:`preload` and :func:`warm` once, and each visitor's
process forked from it starts warm."""

from __future__ import annotations

import asyncio
import contextlib

WARM_SIZE = (150, 44)
"""Cells of the headless dashboard drawn once (about a browser window's)."""


def preload() -> None:
    """Import Textual's web driver and the replay dashboard with what it draws."""
    import textual.drivers.web_driver
    import textual.widgets  # noqa: F401

    from . import replay  # noqa: F401


def warm(path: str, theme: str | None = None) -> None:
    """Draw the replay dashboard of ``path`` once, headless, in ``theme``, and close it.

    What a first frame costs beyond the imports (stylesheets parsed in that theme, see
    :mod:`.parsed_css`, the widgets' lazy imports, caches filled) is then in the helper's
    memory, which each fork shares. Best effort: a recording that cannot be drawn leaves
    the helper as it was. Leaves no thread.
    """
    from ..store.player import open_replay
    from .replay import replay_app

    async def draw() -> None:
        player = open_replay(path)
        try:
            app = replay_app(player, theme_name=theme, subtitle="")
            async with app.run_test(size=WARM_SIZE) as pilot:
                await pilot.pause()
        finally:
            player.close()

    with contextlib.suppress(Exception):
        asyncio.run(draw())
