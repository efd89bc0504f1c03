"""Libraries a Python package opens itself through ctypes, read from its source (parsed, never run).

pytorch issue 186516 (formats.md 8.3): the amdsmi package opens its own ``libamd_smi.so`` with
``ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libamd_smi.so"))``. A request holding a
``/`` never matches a loaded library by SONAME, only by name or by file (formats.md 4), so that
open maps a second build beside the one torch reached through DT_NEEDED.

Recognised calls: ``ctypes.CDLL``, ``ctypes.PyDLL``, ``ctypes.cdll.LoadLibrary``,
``ctypes.pydll.LoadLibrary`` (and the same names imported from ctypes). Recognised arguments: a
path built from the module's own directory (``os.path.dirname(__file__)``, with ``abspath`` or
``realpath`` inside, ``pathlib.Path(__file__).parent`` with ``resolve()``/``absolute()``, joined
with ``os.path.join``, ``/``, ``joinpath`` or an f-string, through ``str()``), an absolute string
constant, and a local or module-level name assigned once to one of those. A bare name (a string
without ``/``, or what ``ctypes.util.find_library`` returns) is a request by name: glibc resolves it
to a library already loaded under that SONAME, so it never maps a second build.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Literal

# A package's modules are a few hundred kB each; a generated one of many MB is not read.
MAX_MODULE_BYTES = 2 << 20
MAX_MODULES = 4000  # .py files read per distribution

_LOADERS = {"CDLL", "PyDLL"}
_LOADER_OBJECTS = {"cdll", "pydll"}


@dataclass(frozen=True, slots=True)
class PythonLoad:
    """One ctypes load in a module: by ``path`` (absolute), by ``name`` (no ``/``), or ``unknown``."""

    module: str  # the .py file
    line: int
    kind: Literal["path", "name", "unknown"]
    target: str = ""  # the absolute path, or the bare name


def loads_in_source(source: bytes, module_path: str) -> list[PythonLoad]:
    """Every recognised ctypes load in one module's source; [] when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    module_file = os.path.abspath(module_path)
    found: list[PythonLoad] = []
    module_names = _assignments(tree.body)
    scopes: list[tuple[list[ast.stmt], dict[str, ast.expr]]] = [(tree.body, module_names)]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local = dict(module_names)
            local.update(_assignments(list(ast.walk(node))))
            scopes.append(([node], local))
    seen: set[int] = set()
    # Function scopes come after the module: a call inside a function is judged with its locals.
    for body, names in reversed(scopes):
        for statement in body:
            for node in ast.walk(statement):
                if not isinstance(node, ast.Call) or id(node) in seen or not _is_loader(node.func):
                    continue
                seen.add(id(node))
                argument = node.args[0] if node.args else _keyword(node, "name")
                found.append(_classify(argument, names, module_file, module_path, node.lineno))
    return sorted(found, key=lambda load: (load.module, load.line))


def _assignments(statements: list[ast.stmt] | list[ast.AST]) -> dict[str, ast.expr]:
    """Names assigned exactly once among these nodes (a second assignment makes a name unknown)."""
    counted: dict[str, list[ast.expr]] = {}
    for node in statements:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            counted.setdefault(node.targets[0].id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            counted.setdefault(node.target.id, []).append(node.value)
    return {name: values[0] for name, values in counted.items() if len(values) == 1}


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` of a chain of names, else "" (iterative: a hostile module may nest thousands)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def _is_loader(func: ast.expr) -> bool:
    name = _dotted(func)
    parts = name.split(".")
    if parts[-1] in _LOADERS and (len(parts) == 1 or parts[-2] == "ctypes"):
        return True
    return len(parts) >= 2 and parts[-1] == "LoadLibrary" and parts[-2] in _LOADER_OBJECTS


def _classify(
    argument: ast.expr | None, names: dict[str, ast.expr], module_file: str, module_path: str, line: int
) -> PythonLoad:
    if argument is not None and _is_find_library(argument, names):
        return PythonLoad(module_path, line, "name", "find_library")
    value = _evaluate(argument, names, module_file, depth=0) if argument is not None else None
    if value is None:
        return PythonLoad(module_path, line, "unknown")
    if "/" not in value:
        return PythonLoad(module_path, line, "name", value)
    if not os.path.isabs(value):
        return PythonLoad(module_path, line, "unknown")  # relative to the working directory
    return PythonLoad(module_path, line, "path", os.path.normpath(value))


def _is_find_library(node: ast.expr, names: dict[str, ast.expr]) -> bool:
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    return isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "find_library"


def _evaluate(node: ast.expr, names: dict[str, ast.expr], module_file: str, depth: int) -> str | None:
    """The string a path expression builds (``__file__`` is the module's own path), else None."""
    if depth > 12:
        return None
    again = depth + 1
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name) and node.id == "__file__":
        return module_file
    if isinstance(node, ast.Name):
        return _evaluate(names[node.id], names, module_file, again) if node.id in names else None
    if isinstance(node, ast.JoinedStr):
        pieces: list[str] = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                if value.format_spec is not None or value.conversion not in (-1, ord("s")):
                    return None
                piece = _evaluate(value.value, names, module_file, again)
            else:
                piece = _evaluate(value, names, module_file, again)
            if piece is None:
                return None
            pieces.append(piece)
        return "".join(pieces)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.Add):
        left = _evaluate(node.left, names, module_file, again)
        right = _evaluate(node.right, names, module_file, again)
        if left is None or right is None:
            return None
        return os.path.join(left, right) if isinstance(node.op, ast.Div) else left + right
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _evaluate(node.value, names, module_file, again)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.Call):
        return _evaluate_call(node, names, module_file, again)
    return None


def _evaluate_call(node: ast.Call, names: dict[str, ast.expr], module_file: str, depth: int) -> str | None:
    function = _dotted(node.func)
    last = node.func.attr if isinstance(node.func, ast.Attribute) else function
    if node.keywords:
        return None
    if last == "dirname" and len(node.args) == 1:
        inner = _evaluate(node.args[0], names, module_file, depth)
        return os.path.dirname(inner) if inner is not None else None
    if last == "join" and function.endswith("path.join") and node.args:
        parts = [_evaluate(a, names, module_file, depth) for a in node.args]
        return None if any(p is None for p in parts) else os.path.join(*[p for p in parts if p is not None])
    if last in ("str", "fspath", "abspath", "realpath", "normpath", "Path", "PurePath", "PosixPath") and (
        function == last or function.startswith(("os.", "pathlib.", "path."))
    ):
        if len(node.args) == 1:
            return _evaluate(node.args[0], names, module_file, depth)
        if last in ("Path", "PurePath", "PosixPath") and node.args:
            parts = [_evaluate(a, names, module_file, depth) for a in node.args]
            return None if any(p is None for p in parts) else os.path.join(*[p for p in parts if p is not None])
        return None
    if isinstance(node.func, ast.Attribute):
        receiver = _evaluate(node.func.value, names, module_file, depth)
        if receiver is None:
            return None
        if last in ("resolve", "absolute", "expanduser", "__str__", "as_posix") and not node.args:
            return receiver
        if last == "joinpath":
            parts = [_evaluate(a, names, module_file, depth) for a in node.args]
            return None if any(p is None for p in parts) else os.path.join(receiver, *[p for p in parts if p])
    return None
