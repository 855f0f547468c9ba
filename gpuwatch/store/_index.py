"""A recording's chunk index, read when it is opened: from the memo a finished file keeps,
else from the ``chunks`` and ``summaries`` tables.

A long recording holds tens of thousands of chunks. Reading their index a row at a time
makes Python build a tuple and seven ints per chunk at every open; the memo holds the same
figures as one array per series, written once when the recorder closes the file. The
memo is a copy, never the truth: it is used only where it agrees with the tables on each
series' chunk count, rows and first and last ``row0`` (one aggregate query, cheap beside
the read it saves), and ``validate`` compares it to them in full.
"""

from __future__ import annotations

import sqlite3

import numpy as np

from ._codec import MAX_ROWS, ChunkError

NONE = int(np.iinfo(np.int64).min)
"""``vmax``/``t_vmax`` of a chunk without a maximum (NULL in the table)."""

_CHUNK = np.dtype("<i8")
_FIELDS = 6  # row0, n, t_first, t_last, vmax, t_vmax: the memo's row of a chunk

MEMO_DDL = """
CREATE TABLE IF NOT EXISTS index_memo (
    series INTEGER PRIMARY KEY, chunks BLOB NOT NULL, summary_row0 BLOB NOT NULL,
    summaries BLOB NOT NULL
);
"""

Index = dict[int, np.ndarray]
"""Series id -> its chunks in ``row0`` order, one row each: series, row0, n, t_first,
t_last, vmax, t_vmax (int64; :data:`NONE` for no maximum)."""

Summaries = dict[int, tuple[np.ndarray, bytes]]
"""Series id -> the ``row0`` of its summarised chunks and their own summaries, joined."""


def read(db: sqlite3.Connection) -> tuple[Index, Summaries]:
    """The index and the chunks' own summaries: the memo where it agrees, else the tables.

    Raises:
        ChunkError: A series' chunks do not hold its rows once each, in order.
    """
    memo = read_memo(db)
    index, summaries = memo if memo is not None else (read_index(db), read_summaries(db))
    check(index)
    return index, summaries


def check(index: Index) -> None:
    """Raise :class:`~gpuwatch.store._codec.ChunkError` unless each series' chunks follow
    one another from row 0, each of 1 to :data:`~gpuwatch.store._codec.MAX_ROWS` rows.

    The writer never leaves a gap or an overlap; a file with one would show part of a
    table (or rows twice) as if it were whole, and sizes tables by its last row.
    """
    for sid, part in index.items():
        row0, n = part[:, 1], part[:, 2]
        if row0[0] != 0 or (n < 1).any() or (n > MAX_ROWS).any():
            raise ChunkError(f"damaged chunk index: series {sid} has chunks of bad rows")
        if (row0[1:] != row0[:-1] + n[:-1]).any():
            raise ChunkError(f"damaged chunk index: series {sid} has overlapping or missing rows")


def read_index(db: sqlite3.Connection) -> Index:
    """The ``chunks`` table's index, a row at a time."""
    rows = db.execute(
        "SELECT series, row0, n, t_first, t_last, ifnull(vmax, ?), ifnull(t_vmax, ?)"
        " FROM chunks ORDER BY series, row0",
        (NONE, NONE),
    ).fetchall()
    if not rows:
        return {}
    a = np.array(rows, dtype=np.int64)
    return {int(part[0, 0]): part for part in np.split(a, np.flatnonzero(np.diff(a[:, 0])) + 1)}


def read_summaries(db: sqlite3.Connection) -> Summaries:
    """The ``summaries`` table's own summaries of chunks (none without the table)."""
    try:
        rows = db.execute(
            "SELECT series, row0, chunk FROM summaries ORDER BY series, row0"
        ).fetchall()
    except sqlite3.Error:  # no summaries table
        return {}
    out: Summaries = {}
    start = 0
    for i in range(1, len(rows) + 1):
        if i < len(rows) and rows[i][0] == rows[start][0]:
            continue
        part = rows[start:i]
        if all(isinstance(r[2], bytes) for r in part):  # a hostile file's TEXT is not ours
            row0 = np.array([r[1] for r in part], dtype=np.int64)
            out[part[0][0]] = (row0, b"".join(r[2] for r in part))
        start = i
    return out


def write_memo(db: sqlite3.Connection) -> None:
    """Replace the memo with the tables' index (inside the caller's transaction)."""
    index, summaries = read_index(db), read_summaries(db)
    db.execute(MEMO_DDL)
    db.execute("DELETE FROM index_memo")
    none: tuple[np.ndarray, bytes] = (np.zeros(0, dtype=np.int64), b"")
    rows = []
    for sid, part in index.items():
        row0, joined = summaries.get(sid, none)
        rows.append(
            (sid, part[:, 1:].astype(_CHUNK).tobytes(), row0.astype(_CHUNK).tobytes(), joined)
        )
    db.executemany(
        "INSERT INTO index_memo (series, chunks, summary_row0, summaries) VALUES (?, ?, ?, ?)",
        rows,
    )


def read_memo(db: sqlite3.Connection) -> tuple[Index, Summaries] | None:
    """The memo, if the file has one and it agrees with the tables; else None."""
    try:
        memo = db.execute(
            "SELECT series, chunks, summary_row0, summaries FROM index_memo"
        ).fetchall()
    except sqlite3.Error:  # a file from before memos, or one still being written
        return None
    if not memo:
        return None
    chunks = {
        sid: (count, rows, lo, hi)
        for sid, count, rows, lo, hi in db.execute(
            "SELECT series, count(*), sum(n), min(row0), max(row0) FROM chunks GROUP BY series"
        )
    }
    try:
        summarised = {
            sid: (count, lo, hi)
            for sid, count, lo, hi in db.execute(
                "SELECT series, count(*), min(row0), max(row0) FROM summaries GROUP BY series"
            )
        }
    except sqlite3.Error:
        summarised = {}
    if len(memo) != len(chunks):
        return None
    index: Index = {}
    summaries: Summaries = {}
    for sid, blob, row0_blob, joined in memo:
        if not all(isinstance(b, bytes) for b in (blob, row0_blob, joined)):
            return None
        if not blob or len(blob) % (_FIELDS * 8) or len(row0_blob) % 8:
            return None
        part = np.frombuffer(blob, dtype=_CHUNK).reshape(-1, _FIELDS)
        row0 = part[:, 0]
        if np.any(np.diff(row0) <= 0):
            return None
        got = (len(part), int(part[:, 1].sum()), int(row0[0]), int(row0[-1]))
        if chunks.get(sid) != got:
            return None
        srow0 = np.frombuffer(row0_blob, dtype=_CHUNK).astype(np.int64)
        want = summarised.get(sid)
        if (want is None) != (len(srow0) == 0):
            return None
        if want is not None:
            if want != (len(srow0), int(srow0[0]), int(srow0[-1])):
                return None
            summaries[sid] = (srow0, joined)
        full = np.empty((len(part), _FIELDS + 1), dtype=np.int64)
        full[:, 0] = sid
        full[:, 1:] = part
        index[sid] = full
    if len(summaries) != len(summarised):
        return None
    return index, summaries


def memo_agrees(db: sqlite3.Connection) -> bool:
    """The file has no memo, or its memo equals the tables' index figure for figure."""
    try:
        if db.execute("SELECT count(*) FROM index_memo").fetchone()[0] == 0:
            return True
    except sqlite3.Error:
        return True
    memo = read_memo(db)
    if memo is None:
        return False
    (m_index, m_summaries), index, summaries = memo, read_index(db), read_summaries(db)
    if index.keys() != m_index.keys() or summaries.keys() != m_summaries.keys():
        return False
    if not all(np.array_equal(part, m_index[sid]) for sid, part in index.items()):
        return False
    return all(
        np.array_equal(row0, m_summaries[sid][0]) and joined == m_summaries[sid][1]
        for sid, (row0, joined) in summaries.items()
    )
