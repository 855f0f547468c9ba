"""The host panel's RSS figure counts only the processes alive at the moment (issue 23).

An ended process's memory is freed: summing its last RSS made the host figure grow under
churn, above the host's own used memory. Checked on a real Session (live and replayed),
and on the live dashboard's host legend under Pilot.
"""

from __future__ import annotations

import itertools

import pytest

from gpuwatch.analysis.moment import moment
from gpuwatch.protocol import Message
from gpuwatch.session import HOST, Session

MIB = 1 << 20
MS = 10**6
ORIGIN = 10**12
STAYS, ENDS, KILLED = 5001, 5002, 5003
BYE = ORIGIN + 2000 * MS  # ENDS says bye
GONE = ORIGIN + 3000 * MS  # KILLED found gone by the host sampler
END = ORIGIN + 4000 * MS


def _session() -> Session:
    """Three processes on the host, sampled every 100 ms: one runs throughout, one says
    bye at 2 s, one is killed (no bye) and found gone at 3 s."""
    s = Session(t_origin=ORIGIN, wall_offset=0)
    s.ensure_host("testhost", 64 << 30)
    seq = itertools.count(1)
    rss = {STAYS: 100 * MIB, ENDS: 700 * MIB, KILLED: 30 * MIB}
    for pid in rss:
        s.ingest(Message(kind="hello", pid=pid, seq=next(seq), t=ORIGIN, body={"argv": ["x"]}))
    for t in range(ORIGIN, END + 1, 100 * MS):
        s.add_host_sample({"t": t, "total": 64 << 30, "used": 8 << 30, "available": 56 << 30})
        if t == BYE:
            s.ingest(Message(kind="bye", pid=ENDS, seq=next(seq), t=t, body={"exit_code": 0}))
        if t == GONE:
            s.process_gone(KILLED, t)
        for i, (pid, value) in enumerate(rss.items()):
            if s.runs_at(s.processes[pid], t):
                s.add_rss(pid, t, value)
                # A message now and then: a replay takes a silent process for ended.
                body = {"event": "begin", "id": t, "name": "step", "depth": 0}
                s.ingest(Message(kind="phase", pid=pid, seq=next(seq), t=t + i, body=body))
    return s


@pytest.mark.parametrize("live", [True, False], ids=["live", "replay"])
def test_host_rss_sums_the_processes_alive_at_the_moment(live: bool) -> None:
    s = _session()
    s.live = live
    # Before the bye: all three.
    assert moment(s, HOST, BYE - 50 * MS).values["allocated"] == 830 * MIB
    # After it (before: 830 MiB, the ended process's last RSS still counted).
    assert moment(s, HOST, BYE + 50 * MS).values["allocated"] == 130 * MIB
    # The killed one counts until the sampler found it gone, not after.
    assert moment(s, HOST, GONE - 50 * MS).values["allocated"] == 130 * MIB
    assert moment(s, HOST, GONE + 50 * MS).values["allocated"] == 100 * MIB
    assert moment(s, HOST, END).values["allocated"] == 100 * MIB


async def test_the_host_legend_shows_only_the_living() -> None:
    from gpuwatch.tui.app import GpuwatchApp

    s = _session()
    app = GpuwatchApp(s, clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        host = next(p for p in app.dashboard.panels if p.key == HOST)
        for cursor, shown in ((BYE - 50 * MS, "830 MiB"), (END, "100 MiB")):
            app.view = app.view.with_cursor(cursor, END)
            await pilot.pause()
            legend = str(host.legend.render())
            assert f"RSS {shown}" in legend, legend
