"""The status line of long work (info, export, loading several files): on a terminal only."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

from gpuwatch.cli import _common, recordings

SAMPLE = ROOT / "samples" / "gpt2-small-h100.gpuwatch"


class _Terminal(io.StringIO):
    """stderr as a terminal."""

    def isatty(self) -> bool:
        return True


def test_nothing_is_said_where_stderr_is_not_a_terminal(monkeypatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with _common.Progress(delay=0.0, every=0.01) as shown:
        shown.status = "checking x"
        time.sleep(0.1)
    assert err.getvalue() == ""


def test_on_a_terminal_it_waits_tells_and_clears(monkeypatch) -> None:
    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    with _common.Progress(delay=0.3, every=0.02) as shown:
        shown.status = "checking x"
        time.sleep(0.15)
        assert err.getvalue() == ""  # quick work says nothing
        assert wait_for(lambda: "checking x" in err.getvalue())  # past the delay it tells
        count = iter(range(1000))
        shown.status = lambda: f"read {next(count)}"
        assert wait_for(lambda: "read 3" in err.getvalue())
    out = err.getvalue()
    assert "\r\x1b[Kgpuwatch: checking x · 0 s" in out
    assert "read 3" in out  # asked anew at each rewrite
    assert out.endswith("\r\x1b[K")  # the line is gone when the work is done
    assert "\n" not in out


def test_a_status_that_fails_is_skipped(monkeypatch) -> None:
    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    with _common.Progress(delay=0.0, every=0.01) as shown:
        shown.status = lambda: 1 / 0
        time.sleep(0.1)
    assert err.getvalue() == ""


@pytest.mark.parametrize("command", ["info", "export"])
def test_info_and_export_say_what_they_read(
    command: str, tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwatch.cli import main
    from gpuwatch.store import export, info, recording

    err = _Terminal()
    quick = lambda **kw: _common.Progress(**{**kw, "delay": 0.0, "every": 0.02})  # noqa: E731
    monkeypatch.setattr(recordings, "Progress", quick)
    validate = recording.Recording.validate

    def shown(*parts: str) -> bool:
        return all(p in err.getvalue() for p in parts)

    # A big file: each step takes a while, here until the status line has said it.
    def slow_validate(self, progress=None) -> None:
        for i in range(3):
            if progress is not None:
                progress(i, 3)
                assert wait_for(lambda: shown(f"{i * 100 // 3}% of its chunks"))  # noqa: B023
        validate(self, progress)

    monkeypatch.setattr(recording.Recording, "validate", slow_validate)
    summarize = info.summarize_opened
    reading = (
        f"{'summarising' if command == 'info' else 'exporting'} {SAMPLE.name}: ",
        " chunks read · ",
    )
    monkeypatch.setattr(
        info, "summarize_opened", lambda o: (wait_for(lambda: shown(*reading)), summarize(o))[1]
    )
    write = export.write
    monkeypatch.setattr(
        export, "write", lambda *a: (wait_for(lambda: shown(*reading)), write(*a))[1]
    )
    monkeypatch.setattr("sys.stderr", err)
    args = [command, str(SAMPLE)]
    if command == "export":
        args += ["--out", str(tmp_path / "out")]
    assert main(args) == 0
    said = err.getvalue()
    assert f"checking {SAMPLE.name}: 33% of its chunks" in said
    what = "summarising" if command == "info" else "exporting"
    assert f"{what} {SAMPLE.name}: " in said and " chunks read · " in said
    if command == "info":
        assert capsys.readouterr().out.startswith(str(SAMPLE))  # the summary itself
    else:
        assert (tmp_path / "out" / "phases.csv").stat().st_size > 0
        # The status line is cleared before the line that says where the tables went.
        assert said.split("\r\x1b[K")[-1].startswith("gpuwatch: wrote ")
