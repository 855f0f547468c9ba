"""An option several commands take is one option: the same help, the same meaning."""

from __future__ import annotations

import argparse

from gpuwatch.cli import build_parser


def _options(option: str) -> dict[str, argparse.Action]:
    """``option`` in every command that takes it, by command."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: action
        for name, p in sub.choices.items()
        for action in p._actions
        if option in action.option_strings
    }


def test_every_theme_option_names_its_default() -> None:
    themes = _options("--theme")
    assert {"live", "run", "replay", "serve", "cluster"} <= set(themes)
    for name, action in themes.items():
        assert action.help and "$GPUWATCH_THEME" in action.help, name


def test_every_command_that_merges_recordings_aligns_them_alike() -> None:
    aligns = _options("--align")
    assert {"replay", "info", "export", "serve"} <= set(aligns)
    assert len({(a.help, tuple(a.choices or ()), a.default) for a in aligns.values()}) == 1


def test_every_socket_option_is_the_annotation_socket_with_one_default() -> None:
    sockets = _options("--socket")
    assert {"live", "run", "record", "serve"} <= set(sockets)
    for name, action in sockets.items():
        assert action.metavar == "PATH" and action.default in (None, argparse.SUPPRESS), name
        assert action.help and "annotation socket" in action.help, name
        assert action.help.endswith("(default: $GPUWATCH_SOCKET or a per-user path)"), name
