"""How loaded a GPU is, as nvitop tells it: memory and utilisation in three levels.

A figure below the first threshold is ``low``, from it up to the second ``mid``, at or
above the second ``high`` (nvitop's rule, ``light < th1 <= moderate < th2 <= heavy``, and
its defaults: memory 10/80 %, utilisation 10/75 %). The dashboard draws each level in its
theme's colour (``$gw-level-low``, ``-mid``, ``-high``); without colour (``NO_COLOR``) a
``high`` figure carries :data:`HIGH_SIGN`.

The thresholds come from ``--mem-util-thresh`` / ``--gpu-util-thresh``, else the
``[thresholds]`` table of ``$XDG_CONFIG_HOME/gpuwatch/config.toml`` (``$GPUWATCH_CONFIG``
names another file)::

    [thresholds]
    memory = [10, 80]        # % of the GPU's memory used
    utilisation = [10, 75]   # GPU utilisation %

Nothing here imports textual: the command line reads the file before it has a terminal.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..fmt import printable
from ._config_file import config_file, read_toml

CONFIG_ENV = "GPUWATCH_CONFIG"
"""A config file to read instead of the one in the config directory."""

LEVELS = ("low", "mid", "high")
HIGH_SIGN = "!"
"""What marks a ``high`` figure without colour (the figure stays as it is before it)."""

Pair = tuple[int, int]


@dataclass(frozen=True)
class Thresholds:
    """The two thresholds (%) of memory used and of utilisation."""

    memory: Pair = (10, 80)
    util: Pair = (10, 75)

    def memory_level(self, used: float | None, total: float | None) -> str | None:
        """The level of ``used`` of ``total`` bytes; None when either is unknown."""
        if used is None or not total or total <= 0:
            return None
        return level(100.0 * used / total, self.memory)

    def util_level(self, pct: float | None) -> str | None:
        """The level of a utilisation (%); None when unknown."""
        return None if pct is None else level(pct, self.util)


DEFAULT = Thresholds()


def of(app: object) -> Thresholds:
    """The thresholds an app carries (``GpuwatchApp.thresholds``), else the defaults."""
    found = getattr(app, "thresholds", None)
    return found if isinstance(found, Thresholds) else DEFAULT


def level(pct: float, pair: Pair) -> str:
    """``low`` below ``pair[0]``, ``high`` at or above ``pair[1]``, else ``mid``."""
    if pct >= pair[1]:
        return "high"
    return "low" if pct < pair[0] else "mid"


def marked(text: str, lvl: str | None, no_color: bool) -> str:
    """``text`` with :data:`HIGH_SIGN` after it when it is ``high`` and there is no colour."""
    return text + HIGH_SIGN if no_color and lvl == "high" else text


def level_style(lvl: str | None) -> str | None:
    """The theme variable a level is drawn in (None: the line's own colour)."""
    return None if lvl is None else f"$gw-level-{lvl}"


class ConfigError(ValueError):
    """The config file cannot be used; ``str()`` is one line that says why."""


def config_path() -> Path:
    """Where the config is read from (it need not exist)."""
    return config_file(CONFIG_ENV, "config.toml")


def load(path: Path | None = None) -> Thresholds:
    """The thresholds of the config file (defaults for what it leaves out, or none).

    Raises:
        ConfigError: The file cannot be read, is not TOML, or its thresholds are not two
            whole percentages, the first below the second, between 1 and 99.
    """
    path = path or config_path()
    shown = printable(str(path))
    doc = read_toml(path, "config", ConfigError)
    if doc is None:
        return DEFAULT
    table = doc.get("thresholds", {})
    if not isinstance(table, dict):
        raise ConfigError(f"the config {shown}: [thresholds] must be a table")
    pairs = {}
    for key, field in (("memory", "memory"), ("utilisation", "util"), ("utilization", "util")):
        if key in table:
            pair = checked_pair(table[key])
            if pair is None:
                raise ConfigError(
                    f"the config {shown}: thresholds.{key} must be two whole percentages "
                    "th1 < th2 between 1 and 99, like [10, 80]"
                )
            pairs[field] = pair
    return Thresholds(**pairs)


def checked_pair(value: object) -> Pair | None:
    """Two whole percentages between 1 and 99, first below second; None if not that."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    if not all(type(v) is int and 1 <= v <= 99 for v in value):
        return None
    lo, hi = value
    return (lo, hi) if lo < hi else None


def add_options(p: argparse.ArgumentParser) -> None:
    """``--mem-util-thresh`` and ``--gpu-util-thresh``, as nvitop has them."""
    for flag, what, pair in (
        ("--mem-util-thresh", "memory used", DEFAULT.memory),
        ("--gpu-util-thresh", "GPU utilisation", DEFAULT.util),
    ):
        p.add_argument(
            flag,
            type=int,
            nargs=2,
            choices=range(1, 100),
            metavar=("TH1", "TH2"),
            help=f"{what} %% below TH1 is low, from TH2 up high (drawn in the warning "
            f"colour); default: config.toml's [thresholds], else {pair[0]} {pair[1]}",
        )


def from_args(args: argparse.Namespace, path: Path | None = None) -> Thresholds:
    """The flags over the config file over the defaults.

    Raises:
        ConfigError: The config file cannot be used, or a flag's two values are equal.
    """
    base = load(path)
    out = {}
    for flag, field in (("mem_util_thresh", "memory"), ("gpu_util_thresh", "util")):
        given = getattr(args, flag, None)
        if given is not None:
            pair = checked_pair(sorted(given))
            if pair is None:
                name = "--" + flag.replace("_", "-")
                raise ConfigError(f"{name} needs two different percentages, like 10 80")
            out[field] = pair
    return Thresholds(memory=out.get("memory", base.memory), util=out.get("util", base.util))
