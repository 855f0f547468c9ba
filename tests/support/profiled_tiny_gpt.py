"""``samples/train_tiny_gpt.py`` with each phase's true peak from torch.profiler.

Run as ``python tests/support/profiled_tiny_gpt.py TRUTH.json SAMPLE-ARGS...`` (under
``gpuwatch record`` too): the sample trains as it always does, and every phase it opens
with ``gpuwatch.phase`` is also a ``profmem`` range, so the allocator's events give its
peak. TRUTH.json gets ``{"<step>:<phase>": bytes}``, steps counted from 1.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profmem import ProfiledMemory

import gpuwatch

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "train_tiny_gpt.py"


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[1:]
    spec = importlib.util.spec_from_file_location("train_tiny_gpt", SAMPLE)
    assert spec is not None and spec.loader is not None
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    mem = ProfiledMemory("cpu")
    now = {"step": 0}
    phase, step = gpuwatch.phase, gpuwatch.step

    def step_(n: int, *args: Any, **kwargs: Any) -> Any:
        now["step"] = int(n) + 1
        return step(n, *args, **kwargs)

    @contextlib.contextmanager
    def phase_(name: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        with phase(name, *args, **kwargs), mem.phase(now["step"], name):
            yield

    gpuwatch.step, gpuwatch.phase = step_, phase_  # type: ignore[assignment]
    mem.start()
    try:
        code = sample.main(rest)
    finally:
        truth = mem.stop(None)
    Path(out).write_text(json.dumps({f"{s}:{p}": v for (s, p), v in truth.peaks.items()}, indent=1))
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
