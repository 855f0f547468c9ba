"""CSS parsed once per process and theme: what a served visitor's process inherits from
the fork server's drawing of the dashboard (gpuwatch/tui/parsed_css.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import synthetic
import textual.css.stylesheet as textual_stylesheet

from gpuwatch.store import Player, open_recording, open_session, save_session
from gpuwatch.tui import parsed_css
from gpuwatch.tui.parsed_css import SharedStylesheet
from gpuwatch.tui.replay import replay_app

SIZE = (140, 45)


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    return save_session(synthetic.build(), tmp_path / "synthetic.gpuwatch")


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The CSS sources Textual tokenizes, in order (its parser, counted), from an empty
    process-wide cache (other tests of this process have filled it)."""
    monkeypatch.setattr(parsed_css, "_parsed", {})
    seen: list[str] = []
    real = textual_stylesheet.parse

    def counted(scope, css, read_from, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(css)
        return real(scope, css, read_from, *args, **kwargs)

    monkeypatch.setattr(textual_stylesheet, "parse", counted)
    return seen


async def draw(path: Path, theme: str) -> None:
    """The dashboard over ``path`` drawn once in ``theme``."""
    rec = open_recording(path)
    try:
        session, loader = open_session(rec)
        loader.load_all()
        app = replay_app(Player(session, loader, playing=False), theme_name=theme)
        assert isinstance(app.stylesheet, SharedStylesheet)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app.current_theme.name == theme
            assert "REPLAY" in str(app.dashboard.status_bar.render())
    finally:
        rec.close()


async def test_a_second_dashboard_parses_no_css_the_first_parsed(recording, parses) -> None:
    await draw(recording, "gpuwatch-dark")
    first = len(parses)
    assert first > 10  # the app's CSS and every widget's DEFAULT_CSS
    await draw(recording, "gpuwatch-dark")
    assert len(parses) == first, "the second app tokenized CSS the first had parsed"


async def test_another_theme_is_parsed_with_its_own_variables(recording, parses) -> None:
    await draw(recording, "gpuwatch-dark")
    first = len(parses)
    await draw(recording, "gpuwatch-light")
    # Variables are substituted while parsing: the light theme's rules are its own.
    assert len(parses) > first
    light = len(parses)
    await draw(recording, "gpuwatch-light")
    assert len(parses) == light
