"""Every recording shipped in samples/ opens in info (text and JSON), export and a full load.

The H100 recordings were made on a real GPU; the OOM one holds an ``oom`` event with the
allocator observer's figures and torch's error text. An ``oom`` whose ``message`` is null
(the observer saw it before any exception text existed, and none came) is that file with
the text taken out.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from gpuwatch.store import load

SAMPLES = sorted((ROOT / "samples").glob("*.gpuwatch"))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_opens_in_info_export_and_load(path: Path, tmp_path: Path) -> None:
    text = run_cli("info", str(path))
    assert text.returncode == 0, text.stderr
    assert "Traceback" not in text.stderr
    as_json = run_cli("info", "--json", str(path))
    assert as_json.returncode == 0, as_json.stderr
    info = json.loads(as_json.stdout)
    assert info["devices"]
    out = tmp_path / "export"
    exported = run_cli("export", str(path), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert (out / "events.csv").exists()
    session = load(path)
    assert session.processes


OOM_SAMPLE = ROOT / "samples" / "gpt2-small-h100-oom.gpuwatch"


def test_oom_without_message_is_reported_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "oom-no-message.gpuwatch"
    shutil.copyfile(OOM_SAMPLE, path)
    with sqlite3.connect(path) as db:
        [(seq, body)] = db.execute("SELECT seq, body FROM events WHERE kind = 'oom'").fetchall()
        body = json.loads(body)
        assert body["message"].startswith("CUDA out of memory.")  # the sample's own text
        body["message"] = None
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (json.dumps(body), seq))
    result = run_cli("info", "--json", str(path))
    assert result.returncode == 0, result.stderr
    [oom] = json.loads(result.stdout)["ooms"]
    assert oom["phase"] == "forward" and oom["step"] == 5
    assert oom["requested"] > 100 * 1024**3  # the sample asks for 192 GiB on purpose
    assert oom["message"] is None
    text = run_cli("info", str(path))
    assert text.returncode == 0, text.stderr
    [line] = [x for x in text.stdout.splitlines() if "OOM at" in x]
    assert line.endswith("reserved 4.61 GiB"), line  # the figures, and no text after them


def test_info_tells_what_the_oom_asked_for_and_what_was_there() -> None:
    text = run_cli("info", str(OOM_SAMPLE))
    assert text.returncode == 0, text.stderr
    [line] = [x for x in text.stdout.splitlines() if "OOM at" in x]
    head, tail = line.split(" (step 5): ")
    assert head.endswith("pid 684 in forward")
    # The file holds them: the request, the device's free memory and torch's figures,
    # then the first 200 characters of torch's error text.
    figures = "requested 192.00 GiB, free 73.84 GiB, allocated 2.46 GiB, reserved 4.61 GiB"
    [oom] = json.loads(run_cli("info", "--json", str(OOM_SAMPLE)).stdout)["ooms"]
    assert tail == f"{figures}, {oom['message']}"
    assert len(oom["message"]) == 200
    assert oom["message"].startswith("CUDA out of memory. Tried to allocate 192.00 GiB.")
    assert oom["requested"] == 192 * 1024**3
    assert oom["free"] > 0 and oom["allocated"] < oom["reserved"]


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_allocated_max_covers_the_exact_phase_peaks(path: Path) -> None:
    info = json.loads(run_cli("info", "--json", str(path)).stdout)
    peaks = [ph["peak_allocated"] for ph in info["phases"].values() if ph["peak_allocated"]]
    if not peaks:
        pytest.skip("no exact peaks in this recording (CPU)")
    [proc] = info["processes"]
    assert proc["allocated_max"] >= max(peaks)


def test_info_marks_a_cut_command_and_keeps_it_off_the_step_count() -> None:
    # Before: `... --step-sl 6 steps`, the cut command running into the count.
    out = run_cli("info", str(ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"))
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "train_tiny_gpt.py" in x and "steps," in x)
    assert "…  6 steps, " in line, line


def test_a_chunk_summarised_after_info_let_its_index_go(monkeypatch, tmp_path: Path) -> None:
    # info lets go of a series' index once it has summarised it, while the loader's
    # thread may still be summarising one of that series' chunks (a file written before
    # summaries): that summary is dropped, never an IndexError in the thread.
    from gpuwatch.store import archive as archive_module
    from gpuwatch.store import open_recording
    from gpuwatch.store.loader import open_session

    asleep = []
    real = archive_module.chunk_summary

    def meanwhile(spec, blocks):  # info's thread lets go while the chunk is summarised
        for feed in loader._feeds.values():
            if feed.archive is not None:
                feed.archive.sleep()
                asleep.append(feed.archive)
        return real(spec, blocks)

    monkeypatch.setattr(archive_module, "chunk_summary", meanwhile)
    path = tmp_path / "old.gpuwatch"
    shutil.copyfile(ROOT / "samples" / "gpt2-small-h100.gpuwatch", path)
    with sqlite3.connect(path) as db:  # as written before summaries existed
        db.execute("DROP TABLE summaries")
        db.execute("DELETE FROM meta WHERE key IN ('summaries', 'summary_block_rows')")
    rec = open_recording(path)
    try:
        _, loader = open_session(rec, windowed=True)
        assert not loader.done  # written before summaries: chunks to summarise
        while loader.step():
            pass
        assert loader.done and asleep
    finally:
        rec.close()
