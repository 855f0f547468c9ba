"""Build the stand-in allocator extension (``standin_allocator.cpp``) for a test session."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

SOURCE = Path(__file__).with_name("standin_allocator.cpp")


def build_standin(directory: Path) -> Any:
    """The stand-in module, installed as CUDA's allocator and device guard; skips the
    calling test where no C++ toolchain (compiler, ninja) is here to build it."""
    torch = pytest.importorskip("torch")
    from torch.utils import cpp_extension

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        pytest.skip("no ninja (torch.utils.cpp_extension.load needs it)")
    if not hasattr(torch, "_C"):
        pytest.skip("torch without its C extension")
    try:
        module = cpp_extension.load(
            name="gpuwatch_standin",
            sources=[str(SOURCE)],
            build_directory=str(directory),
            extra_cflags=["-O1"],
            verbose=False,
        )
    except Exception as e:  # a torch too old for c10::DeviceAllocator, a broken toolchain
        pytest.skip(f"stand-in allocator not built: {type(e).__name__}: {str(e)[:200]}")
    module.install()
    return module
