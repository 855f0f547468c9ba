"""The recording's SQLite schema, version 2 (``docs/recording.md`` is the prose version).

Samples are not stored a row per sample: each series (one session table, such as one GPU's
NVML samples or one process's phases) is cut into chunks of up to :data:`CHUNK_ROWS` rows
or :data:`CHUNK_SPAN` of time, and each chunk is one compressed columnar blob with its row
offset, time bounds and the maximum of its main column. That keeps a day of 8 GPUs at
10 Hz to tens of megabytes and lets a reader fetch any time range by index. Each chunk
also has its min/max summaries (the chunk's own, and one per block of rows:
:mod:`gpuwatch.session.summary`), so a view of days is drawn without reading the rows.
"""

from __future__ import annotations

import numpy as np

from ..session.model import (
    GPU_COLUMNS,
    GPU_PROC_COLUMNS,
    HOST_COLUMNS,
    PEAK_COLUMNS,
    PHASE_COLUMNS,
    RSS_COLUMNS,
    TORCH_COLUMNS,
)

FORMAT = "gpuwatch-recording"
"""``meta.format``: tells a gpuwatch recording from any other SQLite database."""

SCHEMA_VERSION = 2
"""``meta.schema``: bumped on any change an older reader would misread."""

SUFFIX = ".gpuwatch"
"""File name suffix of recordings."""

CHUNK_ROWS = 8192
"""Most rows in one chunk."""

CHUNK_SPAN = 600 * 10**9
"""Most time one chunk covers (ns), so slow series still land in the file in pieces."""

SQLITE_MAGIC = b"SQLite format 3\x00"

SUMMARIES = "summaries"
"""``meta`` key: the version of the ``summaries`` table's layout
(:data:`gpuwatch.session.summary.VERSION`); files without it have no summaries."""

Layout = tuple[tuple[str, str], ...]

SERIES: dict[str, tuple[Layout, str]] = {
    "gpu": (GPU_COLUMNS, "used"),
    "gpu_procs": (GPU_PROC_COLUMNS, "used"),
    "host": (HOST_COLUMNS, "used"),
    "torch": (TORCH_COLUMNS, "allocated"),
    "peaks": (PEAK_COLUMNS, "peak_allocated"),
    "rss": (RSS_COLUMNS, "rss"),
    "phases": (PHASE_COLUMNS, "peak_alloc"),
}
"""Series kind -> (column layout, the column whose per-chunk maximum the index keeps).

``gpu`` and ``gpu_procs`` are keyed by device key, ``host`` by ``"host"``, the rest by pid.
"""

PROCESS_SERIES = ("torch", "peaks", "rss", "phases")
"""Series kinds that belong to an instrumented process (``Process`` attributes)."""

DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE names (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE devices (key TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE processes (pid INTEGER PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE open_spans (
    pid INTEGER NOT NULL, id INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (pid, id)
);
CREATE TABLE proc_info (pid INTEGER PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE rejects (reason TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY, t INTEGER NOT NULL, kind TEXT NOT NULL, pid INTEGER,
    body TEXT NOT NULL
);
-- Marks a session let go of are read back by time (gpuwatch.store.marks).
CREATE INDEX events_by_time ON events (kind, t);
CREATE TABLE series (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, columns TEXT NOT NULL,
    UNIQUE (kind, key)
);
CREATE TABLE chunks (
    series INTEGER NOT NULL REFERENCES series (id), row0 INTEGER NOT NULL,
    n INTEGER NOT NULL, t_first INTEGER NOT NULL, t_last INTEGER NOT NULL,
    vmax INTEGER, t_vmax INTEGER, codec INTEGER NOT NULL, data BLOB NOT NULL
);
-- Covers the whole index, so a reader reads it without touching a blob's pages.
CREATE INDEX chunks_index ON chunks (series, row0, n, t_first, t_last, vmax, t_vmax);
"""

SUMMARIES_DDL = """
CREATE TABLE IF NOT EXISTS summaries (
    series INTEGER NOT NULL, row0 INTEGER NOT NULL, chunk BLOB NOT NULL,
    blocks BLOB NOT NULL, PRIMARY KEY (series, row0)
);
-- The chunks' own summaries, readable without the blocks' pages.
CREATE INDEX IF NOT EXISTS summaries_chunk ON summaries (series, row0, chunk);
"""
"""Made with the first sealed chunk: sealed chunks have summaries (the small ones a
recording adds at each commit until a chunk is full have none; a reader summarises them)."""

EXPECTED_TABLES = frozenset(
    [
        "meta",
        "names",
        "devices",
        "processes",
        "open_spans",
        "proc_info",
        "rejects",
        "events",
        "series",
        "chunks",
    ]
)


def layout_dtypes(layout: Layout) -> list[tuple[str, np.dtype]]:
    """``(name, dtype)`` pairs of a column layout."""
    return [(name, np.dtype(code)) for name, code in layout]


READ_TABLES = EXPECTED_TABLES | {"summaries", "index_memo"}
"""Every table a reader queries: where one exists, it must be a plain table."""
