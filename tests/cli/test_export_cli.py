"""``gpuwatch export``: where it writes by default, --force, and what an empty table becomes."""

from __future__ import annotations

import os
from pathlib import Path

import synthetic
from conftest import ROOT, run_gpuwatch

from gpuwatch.store import save_session
from gpuwatch.store.export import TABLES


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_default_directory_is_what_the_help_says(tmp_path: Path) -> None:
    recs = tmp_path / "recs"
    recs.mkdir()
    path = save_session(synthetic.build(), recs / "run.gpuwatch")
    work = tmp_path / "work"
    work.mkdir()
    helped = run_gpuwatch("export", "--help", env={**_env(), "COLUMNS": "400"}, cwd=work)
    assert "run.gpuwatch -> ./run-export/" in helped.stdout
    result = run_gpuwatch("export", str(path), env=_env(), cwd=work)
    assert result.returncode == 0, result.stderr
    assert sorted(p.stem for p in (work / "run-export").iterdir()) == sorted(TABLES)
    assert not (recs / "run-export").exists()
    assert f"to run-export{os.sep}" in result.stderr


def test_export_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    path = save_session(synthetic.build(), tmp_path / "run.gpuwatch")
    out = tmp_path / "out"
    first = run_gpuwatch("export", str(path), "--out", str(out), env=_env())
    assert first.returncode == 0, first.stderr
    phases = out / "phases.csv"
    phases.write_text("mine\n")
    again = run_gpuwatch("export", str(path), "--out", str(out), env=_env())
    assert again.returncode == 2
    lines = again.stderr.splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and "already exist" in lines[0], lines
    assert phases.read_text() == "mine\n"  # nothing was touched
    # One table asked for and present: refused too, naming that file.
    one = run_gpuwatch("export", str(path), "--table", "phases", "--out", str(out), env=_env())
    assert one.returncode == 2 and "phases.csv already exists" in one.stderr
    forced = run_gpuwatch("export", str(path), "--out", str(out), "--force", env=_env())
    assert forced.returncode == 0, forced.stderr
    assert phases.read_text().startswith("pid,name,")
    # Another format is another set of files: no clash, no --force needed.
    jsonl = run_gpuwatch("export", str(path), "--out", str(out), "--format", "jsonl", env=_env())
    assert jsonl.returncode == 0, jsonl.stderr


def test_empty_tables_are_named_and_csv_keeps_its_header(tmp_path: Path) -> None:
    path = save_session(synthetic.build(), tmp_path / "run.gpuwatch")
    out = tmp_path / "out"
    jl = run_gpuwatch("export", str(path), "--out", str(out), "--format", "jsonl", env=_env())
    assert jl.returncode == 0, jl.stderr
    empty = sorted(p.stem for p in out.iterdir() if p.stat().st_size == 0)
    assert empty, "the synthetic session has tables without rows"
    assert f"({', '.join(sorted(empty, key=list(TABLES).index))}: no rows, empty files)" in (
        jl.stderr
    )
    csv = run_gpuwatch("export", str(path), "--out", str(out), env=_env())
    assert csv.returncode == 0, csv.stderr
    for name in empty:
        header = (out / f"{name}.csv").read_text()
        assert header.count("\n") == 1 and header.strip(), name
    assert "a header row only" in csv.stderr


def test_the_parsers_table_names_are_the_exports() -> None:
    from gpuwatch.cli.recordings import EXPORT_FORMATS, EXPORT_TABLES
    from gpuwatch.store.export import FORMATS

    assert list(EXPORT_TABLES) == list(TABLES) and EXPORT_FORMATS == FORMATS


def test_a_reader_that_leaves_early_is_no_error() -> None:
    # `gpuwatch export --table gpu F | head -1`: the reader is gone before the rows are.
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "export", "--table", "gpu",
         str(ROOT / "samples" / "gpt2-small-h100.gpuwatch")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before it writes its first row
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and err == b"", err
