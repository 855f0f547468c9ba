"""``gpuwatch.watch(model, opt, warn=True)``: the training process forecasts its own phases
and emits exactly one ForecastWarning, before the phase, when one will not fit; none when
every phase fits. A real torch loop on the CPU; what the device can give is set (a CPU run
would be measured against the host's memory, which this model never fills)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for

pytestmark = pytest.mark.torch
MiB = 1 << 20


@pytest.fixture
def isolated(sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The warning's state and the facts listeners, fresh for this test."""
    import gpuwatch
    from gpuwatch.instrument import _watch

    listeners: list[Any] = []
    monkeypatch.setattr(_watch, "facts_listeners", listeners)
    monkeypatch.setattr(gpuwatch._instrument, "facts_listeners", listeners)
    monkeypatch.setattr(gpuwatch, "_warning", {"said": False, "runs": 0})
    yield gpuwatch


def _train(gpuwatch: Any, sent: list[dict[str, Any]], usable: int) -> list[Any]:
    import torch
    from torch import nn

    from gpuwatch.analysis import forecast

    def capacity(facts: Any) -> forecast.Capacity:
        return forecast.Capacity(usable, 1 << 30, 0, 0, "this GPU")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forecast_capacity = forecast.capacity_here
        forecast.capacity_here = capacity
        try:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
            opt = torch.optim.AdamW(model.parameters())
            assert gpuwatch.watch(model, opt, warn=True) is model
            for _ in range(3):
                model(torch.randn(64, 512)).square().mean().backward()
                opt.step()
                opt.zero_grad()

            def settled() -> bool:  # warned, or every set of facts sent forecast
                said = [w for w in caught if issubclass(w.category, gpuwatch.ForecastWarning)]
                return bool(said) or gpuwatch._warning["runs"] >= len(sent) > 0

            assert wait_for(settled, timeout=60)
        finally:
            forecast.capacity_here = forecast_capacity
    return [w for w in caught if issubclass(w.category, gpuwatch.ForecastWarning)]


def test_warn_true_gives_exactly_one_warning(isolated: Any, sent: list[dict[str, Any]]) -> None:
    # AdamW's first step needs 40 MiB (weights, gradients, state, temporary): 30 are free.
    (one,) = _train(isolated, sent, 30 * MiB)
    text = str(one.message)
    assert text.startswith("gpuwatch forecast: optimizer.step (first step) will need 40.0 MiB")
    assert "10.0 MiB more than this GPU can give (30.0 MiB)" in text
    assert "AdamW state 16.0 MiB" in text and "fits with --" in text
    assert len(sent) >= 2  # facts at watch() and again, completed: one warning all the same


def test_warn_true_on_a_run_that_fits_warns_of_nothing(
    isolated: Any, sent: list[dict[str, Any]]
) -> None:
    assert _train(isolated, sent, 1 << 30) == []
