"""The status line's forecast warning: a phase still to come that will not fit.

A source of the status line's parts (``StatusLine.add_source("forecast", ...)``): while a
running process has a phase not yet run whose forecast peak is above what its GPU can
give, the line says so, ``!`` first (the sign that stays without colour, ``NO_COLOR``),
until that phase has run. The foresight of the live sources makes the forecasts; a replay
shows the warning marks its recording holds instead.
"""

from __future__ import annotations

from ..analysis.forecast import Foresight, foresight_of
from ..session import Session
from ._text import Part, markup_safe


class ForecastParts:
    """The status line's ``forecast`` source for ``session``.

    Args:
        session: The session shown.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    def __call__(self, window: tuple[int, int]) -> list[Part]:
        fs: Foresight | None = foresight_of(self.session)
        said = fs.warning() if fs is not None else None
        if said is None:
            return []
        # A safety warning: it never gives way (keep None), as the others do not.
        return [Part(f"[$warning]! {markup_safe(said)}[/]")]
