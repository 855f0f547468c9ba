"""Human-readable bytes and durations, shared by the dashboard and the CLI reports."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

GIB = 1024**3
MIB = 1024**2
KIB = 1024


def fmt_bytes(n: float | None, digits: int = 2) -> str:
    """``1.50 GiB``, ``312 MiB``, ``4.0 KiB``; ``n/a`` for None or NaN."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GIB:
        return f"{sign}{n / GIB:.{digits}f} GiB"
    if n >= MIB:
        return f"{sign}{n / MIB:.0f} MiB" if n >= 100 * MIB else f"{sign}{n / MIB:.1f} MiB"
    if n >= KIB:
        return f"{sign}{n / KIB:.1f} KiB"
    return f"{sign}{int(n)} B"


OOM_SIZES: tuple[tuple[str, str], ...] = (
    ("requested", "requested"),
    ("free", "free"),
    ("allocated", "allocated"),
    ("reserved", "reserved"),
)
"""An out-of-memory error's byte counts, in the order they are told: key, word."""


def fmt_oom_sizes(body: Mapping[str, object]) -> list[str]:
    """``requested 192.00 GiB``, ``free ...``, ... for each byte count an OOM's body holds
    (a body is a process's or a recording's word: anything but a whole, non-negative
    number is left out)."""
    out = []
    for key, word in OOM_SIZES:
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            out.append(f"{word} {fmt_bytes(v)}")
    return out


def ellipsis(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with ``…``."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _escape(code: int) -> str:
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    if named:
        return named
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_UNSAFE_CODES = [
    *range(0x20),  # C0 controls: ESC starts every terminal escape sequence
    0x7F,
    *range(0x80, 0xA0),  # C1 controls (0x9B is a one-byte CSI on some terminals)
    0x061C,  # bidirectional marks and overrides: text that displays other than it reads
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    *range(0xD800, 0xE000),  # surrogates: not encodable, from non-UTF-8 file names
]
_ESCAPES = {code: _escape(code) for code in _UNSAFE_CODES}
_UNSAFE = re.compile("[" + "".join(re.escape(chr(c)) for c in _UNSAFE_CODES) + "]")


def printable(text: object) -> str:
    """``text`` safe to show on a terminal: control characters become visible escapes.

    Strings from datagrams, recordings, process tables and file names are hostile: an
    ``ESC]0;...BEL`` would set the terminal's title, ``ESC[2J`` blank it, a byte that is not
    UTF-8 would make ``print`` raise. Each such character is shown as ``\\x1b``, ``\\n``,
    ``\\u202e`` (bidirectional overrides) or ``\\xff`` (a byte of a non-UTF-8 file name).
    Exports keep the raw text; only what is shown goes through here.
    """
    s = text if isinstance(text, str) else str(text)
    if _UNSAFE.search(s) is None:
        return s
    return s.translate(_ESCAPES)


def first_line(text: object, limit: int = 200) -> str | None:
    """The first non-empty line of ``text``, cut to ``limit`` characters; None if there is none.

    Recordings and datagrams may hold null, empty or non-string values where text is
    expected (an OOM seen by the allocator's observer has no message): never assume a line.
    """
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return None


def fmt_short(n: float | None) -> str:
    """Compact bytes for dense labels: ``2.5G``, ``512M``, ``-1.2G``, ``0``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    if abs(n) >= GIB:
        return f"{n / GIB:.1f}G"
    if abs(n) >= MIB:
        return f"{n / MIB:.0f}M"
    return "0" if abs(n) < KIB else f"{n / KIB:.0f}K"


def fmt_duration(ns: float) -> str:
    """A span of time: ``850ms``, ``12.3s``, ``4:05``, ``2:03:09``."""
    sign = "-" if ns < 0 else ""
    s = abs(ns) / 1e9
    if s < 1:
        ms = s * 1000
        return f"{sign}{ms:.1f}ms" if ms < 10 else f"{sign}{ms:.0f}ms"
    if s < 60:
        return f"{sign}{s:.1f}s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{sign}{m}:{sec:02d}"
    h, m = divmod(m, 60)
    return f"{sign}{h}:{m:02d}:{sec:02d}"


def fmt_clock(ns: float, decimals: int = 1) -> str:
    """A time on the session's axis, the one format of every time the dashboard places on
    it (the cursor, the legend, the scrubber, the axis ticks): ``0:56.3``, ``1:00.0``,
    ``1:02:03.4``; ``decimals`` as the context needs (the axis: as many as its step)."""
    sign = "-" if ns < 0 else ""
    scale = 10**decimals
    s = round(abs(ns) / 1e9 * scale) / scale  # rounded first: 59.96 s is 1:00.0, not 0:60.0
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    secs = f"{sec:0{3 + decimals if decimals else 2}.{decimals}f}"
    if h >= 1:
        return f"{sign}{int(h)}:{int(m):02d}:{secs}"
    return f"{sign}{int(m)}:{secs}"


def nice_step(span: float, target: int) -> float:
    """A 1-2-5 step that divides ``span`` into about ``target`` intervals."""
    if span <= 0 or target <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if raw <= mult * mag:
            return mult * mag
    return 10 * mag


def axis_label(ns: float, step_ns: float) -> str:
    """A time-axis tick in :func:`fmt_clock`'s format, with as many decimals as the tick
    step needs (``0:57``, ``0:57.5``, ``2:30``, ``0:57.25``)."""
    step = step_ns / 1e9
    decimals = next((d for d, least in ((0, 1), (1, 0.1), (2, 0.01)) if step >= least), 3)
    return fmt_clock(ns, decimals)
