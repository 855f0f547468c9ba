"""One prediction registry per session: the dashboard and the exporter share each line."""

from __future__ import annotations

import synthetic
from conftest import in_threads

import gpuwatch.predict as pr
from gpuwatch.analysis.predicted import predictions
from gpuwatch.prometheus import SessionCollector
from gpuwatch.tui.app import GpuwatchApp


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = pr.predict

    def predict(facts: dict):
        calls.append(1)
        return real(facts)

    monkeypatch.setattr(pr, "predict", predict)
    return calls


async def test_the_dashboard_and_the_exporter_predict_each_process_once(monkeypatch) -> None:
    calls = _counting(monkeypatch)
    session = synthetic.build()
    app = GpuwatchApp(session, clock=lambda: synthetic.end_time())
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        await pilot.press("2")  # the Peaks tab reads the lines too
        await pilot.pause()
        list(SessionCollector(session, host="h").collect())  # a scrape
        list(SessionCollector(session, host="h").collect())  # another exporter, same lines
    assert len(calls) == 1  # one process, one prediction
    line = predictions(session)[synthetic.PID]
    assert app.dashboard.predicted is predictions(session)
    assert predictions(session).line(session.processes[synthetic.PID]) is line
    assert line.prediction is not None


def test_new_facts_predict_anew_once(monkeypatch) -> None:
    calls = _counting(monkeypatch)
    session = synthetic.build()
    proc = session.processes[synthetic.PID]
    predictions(session).update()
    predictions(session).update()
    assert len(calls) == 1
    proc.facts = dict(proc.facts)  # the script sent its facts again
    predictions(session).update()
    assert len(calls) == 2
    assert list(predictions(session)) == [synthetic.PID]


def test_a_line_serves_two_threads(monkeypatch) -> None:
    session = synthetic.build()
    line = predictions(session).line(session.processes[synthetic.PID])
    assert line is not None
    t0, t1 = session.time_range()

    def read() -> None:
        for i in range(200):
            line.window(t0, t1, 100 + i % 7)
            line.value_at(t0 + (t1 - t0) * i // 200)
            line.update()

    errors = in_threads(read, 2)
    assert errors == []
