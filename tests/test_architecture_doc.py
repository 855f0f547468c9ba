"""docs/architecture.md names the code as it is: every module, class and ``Class.member``
it puts in backticks exists, so a rename that forgets the walks fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpuwatch"
DOC = ROOT / "docs" / "architecture.md"

NOT_OURS = {"keymap.toml"}
"""Files the page names that a user writes, not the project."""


def _quoted() -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", DOC.read_text()))


def _members() -> dict[str, set[str]]:
    """Each class of the package: its methods, class attributes and ``self.x`` attributes;
    each module-level alias (``SessionEvent``) with none."""
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for top in tree.body:
            if isinstance(top, ast.AnnAssign) and isinstance(top.target, ast.Name):
                out.setdefault(top.target.id, set())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            names = out.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    names.add(sub.target.id)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                    if sub.value.id == "self" and isinstance(sub.ctx, ast.Store):
                        names.add(sub.attr)
                elif isinstance(sub, ast.Assign):
                    names.update(t.id for t in sub.targets if isinstance(t, ast.Name))
    return out


def test_every_file_the_page_names_exists() -> None:
    names = {p.name for p in PACKAGE.rglob("*") if p.is_file()}
    missing = []
    for token in _quoted():
        if token in NOT_OURS or not re.fullmatch(r"[\w/]+\.(py|tcss|md)|\w+/", token):
            continue
        if "/" in token:
            if not ((PACKAGE / token).exists() or (ROOT / token).exists()):
                missing.append(token)
        elif token not in names:  # a bare name in a sentence about its package
            missing.append(token)
    assert missing == []


def test_every_class_and_member_the_page_names_exists() -> None:
    members = _members()
    missing = []
    for token in _quoted():
        dotted = re.fullmatch(r"([A-Z]\w*)\.(\w+)", token)
        if dotted:
            cls, member = dotted.groups()
            if member not in members.get(cls, set()):
                missing.append(token)
        elif re.fullmatch(r"[A-Z][a-z]\w*", token) and token not in members:
            missing.append(token)
    assert missing == []
