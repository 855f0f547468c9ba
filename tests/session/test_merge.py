"""Several recordings as one session: alignment by wall clock, names by host, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import synthetic
from conftest import run_cli, until
from store_data import assert_tables_equal

from gpuwatch.session import HOST, gpu_key
from gpuwatch.session.merge import PID_STRIDE, Part, merge, origins
from gpuwatch.store import Player, save_session
from gpuwatch.store.multi import load_many
from gpuwatch.tui.replay import replay_app

SECOND = 10**9
W = synthetic.WALL_OFFSET
# Host B's monotonic clock reads 3 days more than host A's at the same instant: its times
# are far from A's, and only the wall-clock offsets say how they line up.
B_CLOCK = 3 * 86_400 * SECOND
GPU = gpu_key(synthetic.UUID)


def host_b(late: int = 0, steps: int = 6):
    """Host B's session: the same job as A's, started ``late`` ns later in wall time."""
    return synthetic.build(steps, t_origin=B_CLOCK + late, wall_offset=W - B_CLOCK)


def test_origins_are_hosts_unless_they_repeat() -> None:
    assert origins(["node1", "node2"], ["a", "b"]) == ["node1", "node2"]
    assert origins(["vm", "vm"], ["run-a", "run-b"]) == ["run-a", "run-b"]
    assert origins(["vm", "vm"], ["x", "x"]) == ["x", "x#2"]
    assert origins(["a/b", "c"], ["1", "2"]) == ["a_b", "c"]


def test_merge_by_wall_clock_lines_the_hosts_up() -> None:
    a, b = synthetic.build(), host_b(late=2 * SECOND)
    parts = [Part(a, "node-a"), Part(b, "node-b")]
    m = merge(parts)
    assert parts[1].shift == -B_CLOCK and parts[0].shift == 0
    assert m.wall_offset == W and m.t_origin == a.t_origin
    # Devices: the same GPU UUID on both hosts stays two devices, named by host.
    assert set(m.devices) == {"node-a/" + GPU, "node-a/host", "node-b/" + GPU, "node-b/host"}
    assert m.devices["node-b/" + GPU].origin == "node-b"
    assert m.devices["node-b/" + GPU].index == 0
    # B's samples are A's, 2 s later (B started 2 s later in wall time).
    ta = a.gpu[GPU].snapshot()
    tb = m.gpu["node-b/" + GPU].snapshot()
    np.testing.assert_array_equal(tb["t"], ta["t"] + 2 * SECOND)
    np.testing.assert_array_equal(tb["used"], ta["used"])
    assert_tables_equal(m.gpu["node-a/" + GPU], a.gpu[GPU], "node-a gpu")
    assert set(m.hosts) == {"node-a/host", "node-b/host"}
    assert m.time_range() == (a.time_range()[0], a.time_range()[1] + 2 * SECOND)
    # The same pid on both hosts: B's is renumbered and remembers its own.
    pid = synthetic.PID
    assert set(m.processes) == {pid, pid + PID_STRIDE}
    pb = m.processes[pid + PID_STRIDE]
    assert pb.os_pid == pid and pb.origin == "node-b" and pb.host == "node-b/host"
    assert pb.label == f"node-b pid {pid}"
    assert pb.devices == {0: "node-b/" + GPU}
    assert m.processes_on("node-b/" + GPU) == [pb]
    pa_phases = a.processes[pid].phases.snapshot()
    pb_phases = pb.phases.snapshot()
    np.testing.assert_array_equal(pb_phases["t0"], pa_phases["t0"] + 2 * SECOND)
    assert [m.names[i] for i in pb_phases["name"]] == [a.names[i] for i in pa_phases["name"]]
    # Point events moved and renumbered too.
    assert sorted(o.t for o in m.ooms) == [a.ooms[0].t, a.ooms[0].t + 2 * SECOND]
    assert {o.pid for o in m.ooms} == {pid, pid + PID_STRIDE}


def test_merge_by_start_overlays_runs() -> None:
    a, b = synthetic.build(), host_b(late=3600 * SECOND)
    parts = [Part(a, "run-a"), Part(b, "run-b")]
    m = merge(parts, align="start")
    ta, tb = (m.gpu[f"{o}/{GPU}"].snapshot()["t"] for o in ("run-a", "run-b"))
    np.testing.assert_array_equal(ta, tb)
    with pytest.raises(ValueError, match="align"):
        merge(parts, align="sideways")
    with pytest.raises(ValueError, match="origin"):
        merge([Part(a, "x"), Part(b, "x")])


def test_phase_names_are_interned_again() -> None:
    a = synthetic.build()
    b = host_b()
    b.name_id("only-on-b")  # B's name table differs from A's from here on
    b.names.reverse()  # ...and in order: ids must be translated, not copied
    b._name_ids = {n: i for i, n in enumerate(b.names)}
    cols = b.processes[synthetic.PID].phases.snapshot()
    cols["name"][:] = len(b.names) - 1 - cols["name"]
    m = merge([Part(a, "a"), Part(b, "b")])
    pa = a.processes[synthetic.PID].phases.snapshot()
    pb = m.processes[synthetic.PID + PID_STRIDE].phases.snapshot()
    assert [m.names[i] for i in pb["name"]] == [a.names[i] for i in pa["name"]]


@pytest.fixture
def two_files(tmp_path: Path) -> list[Path]:
    """Recordings of two hosts of one job: B's clock is 3 days ahead, it started 2 s later."""
    a = save_session(synthetic.build(), tmp_path / "node-a.gpuwatch")
    b = save_session(host_b(late=2 * SECOND), tmp_path / "node-b.gpuwatch")
    return [a, b]


def test_info_json_of_two_files_shows_both_aligned(two_files: list[Path]) -> None:
    run = run_cli("info", "--json", *map(str, two_files))
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    a, b = info["files"]
    assert (a["origin"], b["origin"]) == ("node-a", "node-b")  # one host name: file names
    assert a["shift_s"] == 0 and b["shift_s"] == -B_CLOCK / SECOND
    assert b["start_s"] == pytest.approx(a["start_s"] + 2)
    assert b["end_s"] == pytest.approx(a["end_s"] + 2)
    assert info["duration_s"] == pytest.approx(a["duration_s"] + 2)
    gpus = [d for d in info["devices"] if d["kind"] == "gpu"]
    assert sorted(d["origin"] for d in gpus) == ["node-a", "node-b"]
    assert all(d["samples"] > 0 for d in info["devices"])
    procs = info["processes"]
    assert sorted(p["os_pid"] for p in procs) == [synthetic.PID] * 2
    assert sorted(p["label"] for p in procs) == [
        f"node-a pid {synthetic.PID}",
        f"node-b pid {synthetic.PID}",
    ]
    assert [o["t_s"] for o in info["ooms"]] == pytest.approx(
        [info["ooms"][0]["t_s"], info["ooms"][0]["t_s"] + 2]
    )
    # Per phase name, counts add up over both hosts.
    single = json.loads(run_cli("info", "--json", str(two_files[0])).stdout)
    assert info["phases"]["forward"]["count"] == 2 * single["phases"]["forward"]["count"]
    text = run_cli("info", *map(str, two_files))
    assert text.returncode == 0 and "2 recordings merged" in text.stdout
    assert "node-b gpu 0" in text.stdout


def test_export_of_two_files(two_files: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "x"
    run = run_cli("export", "--format", "jsonl", "--out", str(out), *map(str, two_files))
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines()]
    by_device: dict[str, list[float]] = {}
    for r in rows:
        by_device.setdefault(r["device"], []).append(r["time_s"])
    assert set(by_device) == {"node-a/" + GPU, "node-b/" + GPU}
    np.testing.assert_allclose(
        np.array(by_device["node-b/" + GPU]), np.array(by_device["node-a/" + GPU]) + 2
    )
    hosts = {json.loads(line)["device"] for line in (out / "host.jsonl").read_text().splitlines()}
    assert hosts == {"node-a/host", "node-b/host"}
    meta = [json.loads(line) for line in (out / "meta.jsonl").read_text().splitlines()]
    shifts = {m["origin"]: int(m["value"]) for m in meta if m["key"] == "shift_ns"}
    assert shifts == {"node-a": 0, "node-b": -B_CLOCK}
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    ooms = [e for e in events if e["kind"] == "oom"]
    assert [e["origin"] for e in ooms] == ["node-a", "node-b"]
    assert ooms[1]["t"] - ooms[0]["t"] == 2 * SECOND


def test_bad_files_among_several_are_one_line_errors(two_files: list[Path], tmp_path: Path):
    junk = tmp_path / "junk.gpuwatch"
    junk.write_text("not sqlite")
    for args in (
        [str(two_files[0]), str(junk)],
        [str(two_files[0]), str(two_files[0])],
        [str(two_files[0]), str(tmp_path / "missing.gpuwatch")],
    ):
        run = run_cli("info", *args)
        assert run.returncode == 2, args
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    run = run_cli("info", "--align", "sideways", *map(str, two_files))
    assert run.returncode == 2


async def test_merged_replay_under_pilot(two_files: list[Path]) -> None:
    opened = load_many(two_files)
    opened.close()
    player = Player(opened.session, playing=False)
    app = replay_app(player, theme_name="gpuwatch-dark", subtitle="merged")
    async with app.run_test(size=(160, 60)) as pilot:
        # Each host's GPU, then its host strip; hosts in the order given.
        keys = ["node-a/" + GPU, "node-a/host", "node-b/" + GPU, "node-b/host"]
        assert await until(pilot, lambda: [p.key for p in app.dashboard.panels] == keys), [
            p.key for p in app.dashboard.panels
        ]
        titles = [str(p.border_title) for p in app.dashboard.panels]
        assert titles[0].startswith("node-a · GPU 0") and titles[2].startswith("node-b · GPU 0")
        # A time inside node-a's forward of step 2 is B's data phase (B runs 2 s behind,
        # so it is in step 0 there): the cursor shows each host's own phase.
        t = app.session.t_origin + 2 * SECOND + 200 * synthetic.MS
        app.view = app.view.with_cursor(t, t)
        await pilot.pause(0.1)
        span_a = app.dashboard.panels[0].span_at(t)
        span_b = app.dashboard.panels[2].span_at(t)
        assert span_a["name"] == "forward" and span_a["step"] == 2
        assert span_b["name"] == "forward" and span_b["step"] == 0
        # The replay's largest spike is looked for over both hosts' GPUs: node-a's comes
        # first in time (the same job, 2 s earlier).
        t_spike, value, key = player.largest_spike()
        used_a = opened.session.gpu["node-a/" + GPU].snapshot()
        assert key == "node-a/" + GPU and value == int(used_a["used"].max())
        assert t_spike == int(used_a["t"][np.argmax(used_a["used"])])


def test_single_file_opens_as_itself(two_files: list[Path]) -> None:
    opened = load_many(two_files[:1])
    try:
        assert not opened.merged
        assert HOST in opened.session.devices and opened.parts[0].origin == ""
    finally:
        opened.close()
