"""``gpuwatch serve`` beside a gpuwatch that records to no file (issue 51 item 1): the
live session is recorded through the owner's view socket by a ``gpuwatch record`` the
server starts, and visitors replay that file as it grows (before, serve refused to start:
"records to no file, so there is nothing to follow")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="gpuwatch serve needs the serve extra (aiohttp)")
pytest.importorskip("textual_serve", reason="gpuwatch serve needs the serve extra")

from conftest import fake_nvml_env, wait_for
from serveproc import serving

from gpuwatch.live_sources import LiveSources
from gpuwatch.protocol import Message
from gpuwatch.store.recording import open_recording


def test_live_records_through_an_owner_that_records_to_no_file(tmp_path: Path) -> None:
    env = fake_nvml_env(dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data")), {"gpus": 1})
    sock = str(tmp_path / "gw.sock")
    env["GPUWATCH_SOCKET"] = sock
    sessions = tmp_path / "data" / "gpuwatch" / "sessions"
    owner = LiveSources(socket=sock)  # as `gpuwatch --no-record` (no NVML of its own here)
    owner.start()
    try:
        owner.session.ingest(
            Message(
                "phase", 4321, 0, time.monotonic_ns(), 0, {"event": "begin", "name": "fw", "id": 1}
            )
        )
        with serving(["--bind", "0"], env=env) as served:
            status, _, page = served.get("/live")
            assert status == 200, page
            assert f"views the running gpuwatch (pid {os.getpid()})" in page, page
            (recording,) = sessions.glob("*.gpuwatch")
            assert recording.name in page
            served.get("/live")  # a second visit: the same recorder
            assert len(list(sessions.glob("*.gpuwatch"))) == 1
            assert wait_for(lambda: owner.hub is not None and owner.hub.views == 1, 20)
    finally:
        owner.stop()
    rec = open_recording(recording)
    try:
        assert rec.complete
    finally:
        rec.close()
