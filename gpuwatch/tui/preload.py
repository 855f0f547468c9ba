"""What a dashboard for a browser imports, imported ahead: ``gpuwatch serve``'s fork server
calls :func:`preload` once, and each visitor's process forked from it starts warm."""

from __future__ import annotations


def preload() -> None:
    """Import Textual's web driver and the replay dashboard with what it draws."""
    import textual.drivers.web_driver
    import textual.widgets  # noqa: F401

    from . import replay  # noqa: F401
