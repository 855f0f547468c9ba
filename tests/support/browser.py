"""Debian's Chromium driven by Playwright, as the browser tests start it (Playwright never
downloads a browser of its own here)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium calls home at start, and a closed network refuses it.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium(profile: Path, width: int, height: int) -> Iterator[Any]:
    """A fresh browser context (its own ``--user-data-dir``); the test skips where
    Chromium does not start."""
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        try:
            context = p.chromium.launch_persistent_context(
                str(profile),
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": width, "height": height},
            )
        except sync_api.Error as exc:
            pytest.skip(f"chromium does not start here: {str(exc).splitlines()[0]}")
        try:
            yield context
        finally:
            context.close()
