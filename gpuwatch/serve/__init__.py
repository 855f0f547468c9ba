"""``gpuwatch serve``: the dashboard in a browser, one app process per visitor.

Each visitor's page runs Textual's web client (the JavaScript of the ``textual-serve``
package) over a websocket to a ``gpuwatch replay`` process of its own, which draws through
Textual's web driver instead of a terminal. ``docs/serve.md`` describes what is served and
how it is guarded.

Nothing here is imported by ``import gpuwatch.serve``: aiohttp is the ``serve`` extra's, and
the command line says in one line when it is missing.
"""

from __future__ import annotations

__all__: list[str] = []
