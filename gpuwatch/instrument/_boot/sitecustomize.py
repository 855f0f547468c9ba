"""gpuwatch's start-up hook for ``gpuwatch run`` / ``record``: phases without code changes.

The launcher puts this directory first on the child's ``PYTHONPATH``, so every Python
process it starts (and their children: torchrun workers) imports this module at start-up.
It does nothing heavy: it adds one entry to ``sys.meta_path`` that notices ``import torch``
and, once torch has finished importing, installs gpuwatch's automatic phases. Then it runs
whatever ``sitecustomize`` would have run without us.

Kept to syntax every Python 3 accepts: any Python the child starts reads it, and only
3.10+ goes further than chaining. Set ``GPUWATCH_AUTO=0`` to turn the phases off.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# .../gpuwatch/instrument/_boot -> the directory holding the gpuwatch package
_PACKAGE = os.path.dirname(os.path.dirname(_HERE))


def _load_gpuwatch():
    """gpuwatch as this process sees it, else the copy beside this file (one per process)."""
    module = sys.modules.get("gpuwatch")
    if module is not None:
        return module
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpuwatch",
        os.path.join(_PACKAGE, "__init__.py"),
        submodule_search_locations=[_PACKAGE],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuwatch"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["gpuwatch"]
        raise
    return module


def _torch_imported():
    try:
        gpuwatch = _load_gpuwatch()
        from gpuwatch.instrument import _watch

        if not _watch.autowatch():
            sys.stderr.write("gpuwatch: automatic phases are not available in this process\n")
        _in_a_kernel(gpuwatch)
    except Exception as exc:  # never break the user's program over it
        sys.stderr.write("gpuwatch: automatic phases are off: %s: %s\n" % (type(exc).__name__, exc))


def _in_a_kernel(gpuwatch):
    """A Jupyter kernel run under gpuwatch: its cells are phases too (``%load_ext``'s)."""
    if "ipykernel" not in sys.modules:
        return
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is not None:
        gpuwatch.load_ipython_extension(shell)


class _Loader:
    """Runs torch's own loader, then our hook once ``import torch`` has completed."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # torch sees its real loader, as if we were not here.
        try:
            module.__loader__ = self._loader
            module.__spec__.loader = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        _torch_imported()


_NO_TORCH = (
    'gpuwatch: torch is not installed for %s; install it with: pip install "gpuwatch[torch]"'
    " (or a build for your CUDA: https://pytorch.org/get-started/locally/)\n"
)


def _explain_missing_torch():
    """If the program ends on the ImportError for torch, say how to install it.

    Only an uncaught error reaches ``sys.excepthook``: a script that handles a missing
    torch itself hears nothing from us.
    """
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        try:
            if (
                issubclass(kind, ImportError)
                and (getattr(value, "name", None) or "").split(".")[0] == "torch"
            ):
                sys.stderr.write(_NO_TORCH % sys.executable)
        except Exception:
            pass

    sys.excepthook = hook


class _TorchWatcher:
    """A meta-path finder that answers only for ``torch``, once, by wrapping its loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        try:
            _explain_missing_torch()
        except Exception:
            pass
        return None


def _install():
    if sys.version_info < (3, 10):
        return  # gpuwatch needs 3.10; such a process just runs without phases
    if os.environ.get("GPUWATCH_AUTO", "1").strip().lower() in ("0", "off", "false", "no"):
        return
    if "torch" in sys.modules:
        _torch_imported()
    else:
        sys.meta_path.insert(0, _TorchWatcher())


def _chain():
    """Run the sitecustomize that Python would have found without this directory."""
    import importlib.machinery
    import importlib.util

    here = os.path.normcase(_HERE)
    rest = [p for p in sys.path if os.path.normcase(os.path.abspath(p or os.curdir)) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install()
except Exception:
    pass
# Last, and outside any try: errors in the chained sitecustomize surface as they would
# without gpuwatch ("Error in sitecustomize").
_chain()
