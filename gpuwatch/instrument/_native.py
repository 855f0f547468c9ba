"""The native allocator reader: built from ``_native.cpp`` off the training thread, cached.

A Python read of the CUDA allocator goes through ``torch._C._cuda_memoryStats``, which
builds a nested dict of every counter; the native reader returns the eight figures a
boundary needs as a tuple, in one C call (``read(device, mode)``, see the source).

It is compiled with the C++ compiler torch's extensions use (``$CXX``, else ``c++``)
against the headers and ``libc10`` of the torch in this process, straight to a shared
object (no ninja, no setuptools), into ``<user cache dir>/gpuwatch/native/<key>/``, where
the key names the torch version and hashes the source, the compiler and the flags: a
second process with the same torch loads it without compiling. Everything here runs on a
background thread; this module imports nothing heavy until :func:`build` is called.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("_native.cpp")
MODULE = "_gpuwatch_native"
ENV = "GPUWATCH_NATIVE"
"""``GPUWATCH_NATIVE=0`` keeps the Python reader (no compiler is ever started)."""
CACHE_ENV = "GPUWATCH_NATIVE_CACHE"
"""Where built readers are kept, instead of the user cache directory."""
BUILD_TIMEOUT = 300.0


class Unavailable(Exception):
    """The native reader cannot be had here; the message says why, for the recording."""


def enabled() -> bool:
    """False where ``GPUWATCH_NATIVE`` turns the native reader off."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "no", "off")


def cache_root() -> Path:
    """The directory holding built readers, one subdirectory per key."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("gpuwatch")) / "native"


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    return torch


def command(
    source: Path, output: Path, compiler: str | None = None, torch: Any = None
) -> list[str]:
    """The compiler's command line for ``source`` against this process's torch."""
    import sysconfig

    from torch.utils import cpp_extension

    torch = torch or _torch()
    cxx = compiler or os.environ.get("CXX") or "c++"
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    includes = [sysconfig.get_paths()["include"], *cpp_extension.include_paths()]
    libs = cpp_extension.library_paths()
    return [
        cxx,
        "-O2",
        "-shared",
        "-fPIC",
        "-std=c++20",
        "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in includes),
        str(source),
        "-o",
        str(output),
        *(f"-L{p}" for p in libs),
        *(f"-Wl,-rpath,{p}" for p in libs),
        "-lc10",
    ]


def load_from(path: Path, name: str = MODULE) -> Any:
    """Import the extension module at ``path`` (without entering it in ``sys.modules``)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def compile_module(
    source: Path, directory: Path, name: str, compiler: str | None = None
) -> tuple[Path, bool]:
    """Compile ``source`` into ``directory`` unless a build is there already.

    Returns:
        (the shared object, whether it was compiled now).

    Raises:
        Unavailable: With the reason, worded for the recording.
    """
    if os.name != "posix":
        raise Unavailable(f"not built on {sys.platform}")
    import sysconfig

    torch = _torch()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    try:
        text = source.read_bytes()
    except OSError as e:
        raise Unavailable(f"source missing: {e}") from None
    cmd = command(source, directory / "probe", compiler, torch)
    exe = shutil.which(cmd[0])
    if exe is None:
        raise Unavailable(f"no compiler: {cmd[0]} not found")
    key = hashlib.sha256(text + "\0".join([exe, *cmd[1:]]).encode()).hexdigest()[:16]
    out_dir = directory / f"torch-{torch.__version__}-{key}"
    target = out_dir / f"{name}{suffix}"
    if target.exists():
        return target, False
    headers = [p[2:] for p in cmd if p.startswith("-I")]
    if not any(Path(p, "c10", "core", "CachingDeviceAllocator.h").exists() for p in headers):
        raise Unavailable(f"torch {torch.__version__} has no c10 DeviceAllocator (needs >= 2.9)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Unavailable(f"cache directory: {e}") from None
    # Each process compiles to a file of its own and renames it into place: ranks that
    # start together never load a half-written object.
    tmp = out_dir / f".{name}.{os.getpid()}.tmp{suffix}"
    cmd = command(source, tmp, compiler, torch)
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"compiler failed to run: {e}") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines()
        why = lines[0].strip() if lines else f"exit status {done.returncode}"
        try:
            tmp.unlink()
        except OSError:
            pass
        raise Unavailable(f"build failed: {why[:300]}")
    os.replace(tmp, target)
    return target, True


def build(directory: Path | None = None, compiler: str | None = None) -> tuple[Any, str]:
    """Build or load the native reader.

    Returns:
        (the module, how it was had: ``"built in 3.1 s"`` or ``"loaded from cache"``).

    Raises:
        Unavailable: Why not, worded for the recording.
    """
    start = time.monotonic()
    try:
        root = directory or cache_root()
        path, built = compile_module(SOURCE, root, MODULE, compiler)
    except Unavailable:
        raise
    except Exception as e:
        raise Unavailable(f"build failed: {type(e).__name__}: {e}") from None
    try:
        module = load_from(path)
    except Exception as e:
        raise Unavailable(f"import failed: {type(e).__name__}: {e}") from None
    took = time.monotonic() - start
    return module, (f"built in {took:.1f} s" if built else f"loaded from cache in {took:.2f} s")
