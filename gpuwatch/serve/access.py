"""Who may see the dashboard: the token, the Host the page was asked by, and the origin.

Standard library only, so these rules are tested without a server.

- A loopback bind answers only to a loopback ``Host`` (``127.0.0.1``, ``localhost``,
  ``[::1]``): a page of another site whose name was made to point at 127.0.0.1 (DNS
  rebinding) is refused.
- Any other bind needs a token, given once as ``?token=`` and compared in constant time.

  What keeps it is scoped to this server. Browsers send a cookie to every port of a host
  (cookies ignore ports), so a cookie at ``/`` would reach every other web service of a
  shared GPU box. Instead, everything this server serves lives under a path prefix of its
  own, ``/<prefix>/``, derived from the token and the port (HMAC), and the cookie is set
  with ``Path=/<prefix>/``: a browser sends it to another port only for a URL under that
  prefix, which the other service does not serve and cannot guess. The cookie holds a
  session value (an HMAC of the token and the port), not the token: a token given in a
  file and reused for a server on another port is not given away, and the value opens
  only this server (another server's expects another). The prefix alone (in the address
  bar, in a shared link) opens nothing.

  The cookie is ``SameSite=Lax`` so that a visitor who holds it and follows a link from a
  wiki or a chat gets in; what another site's page could make a browser do with it stays
  refused by the origin checks below (a fetch, a frame, a websocket), and a page visit
  changes nothing on the server (opening the live session may start ``gpuwatch record``,
  as a visit typed by hand would).

  Not covered: a service on another port of this host that the holder's browser is sent to
  at this server's prefix (it needs the prefix, which a shared link gives away; whoever
  has the cookie's value can use it here, as any session cookie), and anyone reading
  plain HTTP on the network (use the loopback bind and SSH).
- A request that says it comes from another origin (``Origin``), or a page fetched or
  framed by another site (``Sec-Fetch-Site``), is refused, on the page and the websocket.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

TOKEN_MIN = 16
"""Fewest characters a token read from a file may have."""
TOKEN_MAX = 256


class TokenError(ValueError):
    """A token file that cannot be read or holds no usable token."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    """A fresh random token (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def read_token(path: str) -> str:
    """The token in ``path``: its first line, stripped.

    Raises:
        TokenError: Unreadable, too short or long, or not printable ASCII.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(TOKEN_MAX * 4)
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}")
    try:
        text = data.decode("ascii").split("\n", 1)[0].strip()
    except UnicodeDecodeError:
        raise TokenError(f"the token file {path} holds non-ASCII bytes")
    if not TOKEN_MIN <= len(text) <= TOKEN_MAX or not all(33 <= ord(c) < 127 for c in text):
        raise TokenError(
            f"the token in {path} must be {TOKEN_MIN} to {TOKEN_MAX} printable characters "
            "without spaces"
        )
    return text


def _host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8765`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else ""
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


@dataclass
class Access:
    """The rules for one server.

    Attributes:
        loopback: The server listens on loopback only.
        port: The port it listens on (the prefix and the session value depend on it:
            set it once bound).
        token: The token visitors must give; None for a loopback bind without one.
    """

    loopback: bool
    port: int
    token: str | None = None

    COOKIE = "gpuwatch_session"
    """The cookie's name (its path tells servers apart, not its name)."""

    def _mac(self, what: str) -> str:
        assert self.token is not None
        digest = hmac.new(
            self.token.encode(), f"gpuwatch serve {what} {self.port}".encode(), hashlib.sha256
        )
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    @property
    def prefix(self) -> str:
        """The path everything is served under: ``""``, or ``/<22 characters>`` with a token."""
        return "" if self.token is None else "/" + self._mac("path")[:22]

    @property
    def session(self) -> str | None:
        """The cookie's value (never the token itself); None without a token."""
        return None if self.token is None else self._mac("session")

    def session_ok(self, given: str | None) -> bool:
        """Whether a cookie's value opens this server (always, when no token is needed)."""
        expected = self.session
        if expected is None:
            return True
        if not given or len(given) > TOKEN_MAX:
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())

    def host_refused(self, host_header: str) -> str | None:
        """Why a request's ``Host`` is refused, or None."""
        if not self.loopback:
            return None  # the token guards it
        if not is_loopback(_host_name(host_header)):
            return "this server answers only to a loopback address"
        return None

    def origin_refused(self, headers: Mapping[str, str], host_header: str) -> str | None:
        """Why a request from another origin is refused, or None.

        A top-level visit (an address typed, a link followed) is the way in; a fetch, a
        frame or a websocket from another site's page is not.
        """
        origin = headers.get("Origin")
        if origin is not None and origin not in (f"http://{host_header}", f"https://{host_header}"):
            return "requests from another origin are refused"
        site = headers.get("Sec-Fetch-Site", "")
        dest = headers.get("Sec-Fetch-Dest", "document")
        if site == "cross-site" and not (
            dest == "document" and headers.get("Sec-Fetch-Mode", "navigate") == "navigate"
        ):
            return "another site's page may not fetch or frame this one"
        return None

    def token_ok(self, given: str | None) -> bool:
        """Whether ``given`` is the token (always, when none is needed)."""
        if self.token is None:
            return True
        if not given or len(given) > TOKEN_MAX:
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())
