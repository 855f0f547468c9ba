"""gpuwatch's themes: Textual themes read from ``themes/*.toml``, with gpuwatch variables.

Every colour the dashboard draws comes from a theme variable (``gw-*`` for gpuwatch's own
roles, Textual's usual ones for the chrome), so switching theme recolours everything.
"""

from __future__ import annotations

import sys
from pathlib import Path

from textual.theme import Theme

from ..resources import data_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_THEME = "gpuwatch-dark"

# Fallbacks for every gw-* variable, so a user theme that leaves some out still parses.
VARIABLE_DEFAULTS: dict[str, str] = {
    "gw-nvml": "#e0e0e0",
    "gw-reserved": "#ffaf5f",
    "gw-allocated": "#5fd7ff",
    "gw-predicted": "#d787ff",
    "gw-peak": "#ff5f87",
    "gw-forecast": "#ff8700",  # the highest forecast peak of the phases still to come
    "gw-ceiling": "#4e5561",
    "gw-phase-data": "#4e5561",
    "gw-phase-forward": "#2f7fd0",
    "gw-phase-backward": "#d0702f",
    "gw-phase-optimizer": "#c03c5a",
    "gw-phase-zero-grad": "#6b7a2f",
    "gw-phase-eval": "#2f9a6b",
    "gw-phase-other": "#6a5acd",
    "gw-mark": "#ffd75f",
    "gw-oom": "#ff3030",
    "gw-cursor": "#7f8aa3",
    "gw-axis": "#8a93a3",
    "gw-grid": "#2a2f38",
    "gw-other-procs": "#7a7a7a",
    "gw-context": "#9e9e9e",
    "gw-cache": "#ffaf5f",
    "gw-weights": "#5f87ff",
    "gw-gradients": "#d0702f",
    "gw-optimizer-state": "#c03c5a",
    "gw-activations": "#2f9a6b",
    "gw-temporaries": "#af87ff",
    "gw-unexplained": "#ff3030",
    "gw-level-low": "#87d787",
    "gw-level-mid": "#ffd75f",
    "gw-level-high": "#ff5f5f",
}

_THEME_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "dark",
    "luminosity_spread",
    "text_alpha",
)


def load_theme(path: Path) -> Theme:
    """Read one theme file.

    Raises:
        ValueError: The file is not a valid theme (with the reason).
    """
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if "name" not in data or "primary" not in data:
        raise ValueError(f"{path}: a theme needs at least 'name' and 'primary'")
    kwargs = {k: data[k] for k in _THEME_FIELDS if k in data}
    variables = {**VARIABLE_DEFAULTS, **{k: str(v) for k, v in data.get("variables", {}).items()}}
    return Theme(name=str(data["name"]), variables=variables, **kwargs)


def builtin_themes() -> list[Theme]:
    """The themes shipped in ``themes/``, default first."""
    themes = [load_theme(p) for p in sorted(data_dir("themes").glob("*.toml"))]
    themes.sort(key=lambda t: t.name != DEFAULT_THEME)
    return themes
