"""No function in src is over 80 lines unless its docstring says why (docs/development.md,
Conventions): a long function is split along its seams, one step per concern."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "rocm_audit"
MAX_LINES = 80
# A sentence of the docstring that starts with this says why the function is long.
MARKER = re.compile(r"(?:^|[.:;]\s+|\n\s*)Long because\b")

_Function = ast.FunctionDef | ast.AsyncFunctionDef


def _length(node: _Function) -> int:
    """Lines from ``def`` to the last line of the body (decorators not counted)."""
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def _says_why(node: _Function) -> bool:
    return bool(MARKER.search(ast.get_docstring(node) or ""))


def too_long(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of each function of ``source`` over the limit whose
    docstring does not say why; nested functions and methods included."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                if _length(child) > MAX_LINES and not _says_why(child):
                    found.append((name, child.lineno, _length(child)))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _body(lines: int) -> str:
    return "".join(f"    x{i} = {i}\n" for i in range(lines))


def test_the_rule_counts_lines_and_reads_the_marker() -> None:
    fits = "def fits():\n" + _body(MAX_LINES - 1)  # def line + 79 = 80 lines
    over = "def over():\n" + _body(MAX_LINES)
    explained = 'def explained():\n    """Does a lot. Long because a table is spelled out."""\n' + _body(MAX_LINES)
    vague = 'def vague():\n    """Long, because."""\n' + _body(MAX_LINES)
    nested = (
        "class Holder:\n    def method(self):\n        def inner():\n"
        + "    " * 2
        + _body(MAX_LINES).replace("\n    ", "\n            ")
    )
    assert too_long(fits) == []
    assert too_long(over) == [("over", 1, MAX_LINES + 1)]
    assert too_long(explained) == []
    assert too_long(vague) == [("vague", 1, MAX_LINES + 2)]
    assert [name for name, _, _ in too_long(nested)] == ["Holder.method", "Holder.method.inner"]


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_function_over_80_lines_without_a_reason(path: Path) -> None:
    offenders = too_long(path.read_text(encoding="utf-8"))
    assert not offenders, "\n".join(
        f"{path.relative_to(SRC.parent)}:{line}: {name} is {length} lines (at most {MAX_LINES}); split it "
        'along its seams, or start a sentence of its docstring with "Long because"'
        for name, line, length in offenders
    )


MAX_MODULE_LINES = 700


def test_no_module_over_700_lines() -> None:
    """A module of one concern stays short enough to read whole (auditwheel's largest: 646 lines)."""
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in SRC.rglob("*.py")}
    over = {str(path.relative_to(SRC)): n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"split along their seams: {over}"
