"""The floors of docs/architecture.md: only gpuwatch/tui imports textual; `import gpuwatch`
stays light; no circle between units, nor between the modules of one package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "gpuwatch"


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Top-level module names a file imports (all imports, or module-level ones only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_tui_imports_textual() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in PKG.rglob("*.py")
        if "tui" not in p.relative_to(PKG).parts[:1] and ({"textual", "rich"} & _imports(p))
    ]
    assert offenders == [], f"textual/rich imported outside gpuwatch/tui: {offenders}"


def test_instrument_has_no_heavy_module_level_imports() -> None:
    heavy = {"textual", "rich", "numpy", "sqlite3", "torch", "psutil"}
    offenders = {
        str(p.relative_to(ROOT)): sorted(heavy & _imports(p, top_level_only=True))
        for p in (PKG / "instrument").rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}


def test_layering_checker_catches_a_violation(tmp_path: Path) -> None:
    # The checker itself must be able to fail.
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\nfrom textual.app import App\n")
    assert {"numpy", "textual"} <= _imports(bad, top_level_only=True)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return set(out.split())


def test_import_gpuwatch_is_light() -> None:
    loaded = _modules_after("import gpuwatch\nwith gpuwatch.phase('x'): gpuwatch.mark('m')")
    assert not {"textual", "numpy", "sqlite3", "torch", "rich", "psutil"} & loaded


def test_session_and_sources_do_not_pull_textual() -> None:
    loaded = _modules_after(
        "import gpuwatch.session, gpuwatch.sources.annotations, gpuwatch.sources.host, gpuwatch.cli"
    )
    assert "textual" not in loaded


# ---------------------------------------------------------------------- the package graph

# Each unit: a top-level module or subpackage of gpuwatch. Arrows point from importer to
# imported; the graph has no circle, and a unit imports only from the units listed here
# (what sits below it). Only the command line (and ``python -m gpuwatch``) starts the
# dashboard, and nothing imports the command line.
ALLOWED: dict[str, set[str]] = {
    "_version": set(),
    "protocol": set(),
    "facts": set(),
    "fmt": set(),
    "resources": set(),
    "instrument": {"_version", "protocol", "facts"},
    "integrations": {"instrument"},
    # fmt: the estimate's table; instrument: the activation meter a config's fake-tensor
    # trace counts with (imported inside the trace, with torch and transformers).
    "predict": {"facts", "fmt", "instrument"},
    "session": {"protocol", "fmt"},
    "analysis": {"session", "predict", "fmt", "facts"},  # facts: the type predict() takes
    "cluster": {"analysis", "fmt", "protocol"},  # protocol: job_id, the ranks' key
    "sources": {"protocol", "session", "fmt"},
    "store": {"_version", "protocol", "session", "analysis", "fmt", "predict"},
    "prometheus": {
        "_version",
        "session",
        "analysis",
        "predict",
        "fmt",
        "protocol",
    },
    "launch": {"protocol"},
    "live_sources": {"session", "sources", "store", "prometheus", "protocol", "fmt", "analysis"},
    "tui": {
        "session",
        "store",
        "predict",
        "fmt",
        "resources",
        "protocol",
        "analysis",
        "cluster",
    },
    # gpuwatch serve: aiohttp, and app processes of ``gpuwatch replay`` (never textual).
    "serve": {"fmt", "store", "sources", "protocol"},
    "cli": {
        "_version",
        "analysis",
        "cluster",
        "fmt",
        "launch",
        "live_sources",
        "predict",
        "session",
        "store",
        "tui",
        "instrument",
        "resources",
        "protocol",
        "serve",
    },
    # The IPython extension and gpuwatch.plan: a front end inside the user's kernel.
    "notebook": {"instrument", "predict", "analysis", "fmt", "facts"},
    # notebook: only when loaded; analysis: watch(warn=True)'s forecast, on its own thread.
    "__init__": {"_version", "instrument", "notebook", "analysis"},
    "__main__": {"cli"},
}


def _unit(parts: tuple[str, ...]) -> str:
    return parts[0] if parts else "__init__"


def package_graph(root: Path = PKG) -> dict[str, set[str]]:
    """unit -> the gpuwatch units it imports (relative and absolute imports alike)."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("").parts
        src = _unit(rel)
        found = graph.setdefault(src, set())
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = list(rel[:-1])[: len(rel) - node.level]
                target = base + (node.module.split(".") if node.module else [])
                if target:
                    found.add(target[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuwatch."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found.update(
                    a.name.split(".")[1] for a in node.names if a.name.startswith("gpuwatch.")
                )
        found.discard(src)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle (as a path that returns to its start), none when it is a DAG."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_package_graph_has_no_circle_and_only_allowed_arrows() -> None:
    graph = package_graph()
    assert cycles(graph) == []
    unknown = sorted(set(graph) - set(ALLOWED))
    assert unknown == [], f"new units: say where they sit in ALLOWED: {unknown}"
    extra = {unit: sorted(deps - ALLOWED[unit]) for unit, deps in graph.items()}
    assert {k: v for k, v in extra.items() if v} == {}
    importers_of_tui = sorted(u for u, deps in graph.items() if "tui" in deps)
    assert importers_of_tui == ["cli"]
    # Nothing but `python -m gpuwatch` imports the command line; gpuwatch.plan (notebook/)
    # asks predict/ as `gpuwatch estimate` does.
    assert [u for u, deps in graph.items() if "cli" in deps] == ["__main__"]


def test_the_graph_checker_catches_a_circle_and_an_arrow(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "store").mkdir(parents=True)
    (pkg / "store" / "__init__.py").write_text("")
    (pkg / "store" / "x.py").write_text("from ..cli import main\n")
    (pkg / "cli.py").write_text("from .store import x\n")
    graph = package_graph(pkg)
    assert graph["store"] == {"cli"} and graph["cli"] == {"store"}
    assert cycles(graph) == [["cli", "store", "cli"]]


def _module(parts: tuple[str, ...]) -> str:
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the modules of the same unit it imports, function-level imports included.

    Modules are dotted paths below ``root`` (``store.loader``; a package is its face,
    ``store``). An import done inside a function is still a circle: it only hides it.
    """
    files = {_module(p.relative_to(root).with_suffix("").parts): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = list(path.relative_to(root).parts[:-1])
        found = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                target = package[: len(package) - node.level + 1]
                target += node.module.split(".") if node.module else []
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuwatch."):
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                sub = ".".join([*target, alias.name])
                found.add(sub if sub in files else ".".join(target))
        found = {m for m in found if m.split(".")[0] == name.split(".")[0]}
        found.discard(name)
        graph[name] = found
    return graph


def test_no_circle_between_modules_of_one_package() -> None:
    assert cycles(module_graph()) == []


def test_the_module_checker_catches_a_hidden_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "store").mkdir(parents=True)
    (pkg / "store" / "__init__.py").write_text("")
    (pkg / "store" / "a.py").write_text("from .b import B\n")
    # A function-level import hides the circle from the interpreter, not from the check.
    (pkg / "store" / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "store" / "c.py").write_text("from .. import other\nfrom ..store import a\n")
    (pkg / "other.py").write_text("")
    graph = module_graph(pkg)
    assert graph["store.a"] == {"store.b"} and graph["store.b"] == {"store.a"}
    assert graph["store.c"] == {"store.a"}
    assert cycles(graph) == [["store.a", "store.b", "store.a"]]


def test_no_package_reads_another_package_s_private_names() -> None:
    # A private name used across packages is a contract nobody wrote down: write it down
    # (protocol.py, facts.py, a package's face) instead.
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = list(rel[:-1])[: len(rel) - node.level]
            target = base + (node.module.split(".") if node.module else [])
            if not target or target[0] == _unit(rel):
                continue
            private = [p for p in target if p.startswith("_") and p != "_version"]
            names = [a.name for a in node.names if a.name.startswith("_")]
            names = [n for n in names if n not in ("__version__", "_version")]
            if private or names:
                offenders.append(f"{'/'.join(rel)}: {'.'.join(target)} {names}")
    assert offenders == []


def _is_session_type(annotation: ast.expr | None) -> bool:
    """An annotation that names ``Session`` (``Session``, ``Session | None``, ...)."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Session":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Session":
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "Session" in node.value.replace("|", " ").split()
        ):
            return True
    return False


def _session_names(scope: ast.AST) -> set[str]:
    """Names bound to a session in a function (or module): parameters and variables
    annotated ``Session``, and variables assigned ``Session(...)`` or ``x.session``."""
    names = {"session"}
    args = getattr(scope, "args", None)
    if isinstance(args, ast.arguments):
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if _is_session_type(arg.annotation):
                names.add(arg.arg)
    for node in ast.walk(scope):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if _is_session_type(node.annotation):
                names.add(node.target.id)
        elif isinstance(node, ast.Assign) and _names_a_session(node.value, names):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.withitem)
            and isinstance(node.optional_vars, ast.Name)
            and _names_a_session(node.context_expr, names)
        ):
            names.add(node.optional_vars.id)
    return names


def _names_a_session(node: ast.expr, names: set[str]) -> bool:
    """``node`` is a session: one of ``names``, any ``<x>.session``, or ``Session(...)``."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr == "session"
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "Session"
    return False


def session_private_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of each private attribute of a session that ``tree`` reads or
    writes: ``session._lock``, ``self.session._emit``, ``s._x`` where ``s: Session``, and
    ``getattr``/``setattr`` of a private name on one."""
    scopes: list[ast.AST] = [tree]
    scopes += [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    ]
    found: set[tuple[int, str]] = set()
    module_names = _session_names(tree)  # once: it walks the whole module
    for scope in scopes:
        names = _session_names(scope) | module_names
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute):
                target, attr = node.value, node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                target, attr = node.args[0], node.args[1].value
            else:
                continue
            private = attr.startswith("_") and not attr.startswith("__")
            if private and _names_a_session(target, names):
                found.add((node.lineno, attr))
    return sorted(found)


def test_no_module_outside_session_touches_a_private_name_of_a_session() -> None:
    # The session's neighbours go through its ports (session/ports.py) and its public
    # methods: a private name used from outside is a callback nobody wrote down.
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "session":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        offenders += [f"{rel}:{line}: {name}" for line, name in session_private_uses(tree)]
    assert offenders == []


def test_the_session_private_check_sees_attribute_access() -> None:
    # What store/writer.py did before the ports: each form is one the check must see.
    code = """
class Writer:
    def __init__(self, session: Session) -> None:
        self.session = session
        with session._lock:
            session.marks_wait = True
        session._emit("device", ())

    def sync(self) -> None:
        s = self.session
        with s._lock:
            pass
        with self.session._lock:
            pass
        getattr(self.session, "_versions")

def restore(sess: "Session | None", other: Other) -> None:
    sess._let_marks_go()
    other._lock  # not a session
    self_lock = Writer()._lock  # not a session either
"""
    uses = session_private_uses(ast.parse(code))
    assert [name for _, name in uses] == [
        "_lock",
        "_emit",
        "_lock",
        "_lock",
        "_versions",
        "_let_marks_go",
    ]
