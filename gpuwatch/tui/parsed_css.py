"""Textual CSS parsed once per process, not once per app.

Textual's :class:`~textual.css.stylesheet.Stylesheet` keeps what it parsed in a cache of
its own, so every new app parses the app's CSS and each widget's ``DEFAULT_CSS`` again.
``gpuwatch serve``'s fork server draws the dashboard once before it forks its visitors'
processes: with :class:`SharedStylesheet` what that drawing parsed stays in the process,
and each visitor's app finds it there (copy-on-write) instead of tokenizing it again.

Rules are shared only between stylesheets with the same variables (the theme's): Textual
substitutes them while parsing. They are shared as Textual's own cache shares them between
the parses of one stylesheet: a parsed rule set is read, never changed, once made.
"""

from __future__ import annotations

from textual.css.model import RuleSet
from textual.css.stylesheet import CSSLocation, Stylesheet

PARSED_MAX = 4096
"""Parsed CSS sources kept (a theme's worth is a few dozen): past it, the cache restarts."""

_parsed: dict[tuple[object, ...], list[RuleSet]] = {}


class SharedStylesheet(Stylesheet):
    """A stylesheet that parses each CSS source once per process and set of variables."""

    def __init__(self, *, variables: dict[str, str] | None = None) -> None:
        super().__init__(variables=variables)
        self._variables_key: tuple[tuple[str, str], ...] | None = None

    def set_variables(self, variables: dict[str, str]) -> None:
        super().set_variables(variables)
        self._variables_key = None

    def reparse(self) -> None:
        """Parse every source again with the current variables (a theme set), as Textual's
        ``reparse`` does, but into a stylesheet of this class, which finds what is shared."""
        fresh = SharedStylesheet(variables=self._variables)
        fresh.source = dict(self.source)
        try:
            fresh.parse()
        except Exception:
            # Keeps what Textual's reparse keeps: the invalid CSS is not tried again.
            self._invalid_css.update(fresh._invalid_css)
            raise
        self._rules = fresh.rules
        self._rules_map = None
        self.source = fresh.source
        self._require_parse = False

    def _parse_rules(
        self,
        css: str,
        read_from: CSSLocation,
        is_default_rules: bool = False,
        tie_breaker: int = 0,
        scope: str = "",
    ) -> list[RuleSet]:
        if self._variables_key is None:
            self._variables_key = tuple(sorted(self._variables.items()))
        key = (css, read_from, is_default_rules, tie_breaker, scope, self._variables_key)
        rules = _parsed.get(key)
        if rules is None:
            rules = super()._parse_rules(css, read_from, is_default_rules, tie_breaker, scope)
            if len(_parsed) >= PARSED_MAX:
                _parsed.clear()
            _parsed[key] = rules
        return rules
