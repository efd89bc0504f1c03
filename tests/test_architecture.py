"""The package's shape: imports flow one way, capabilities do not import each other, no cycles.

Every import is counted, the ones inside functions too (a function-level import is still a
dependency; it only moves its cost). The code map in docs/development.md describes the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "rocm_audit"

# Lower layers first. A module may import its own layer's modules of the same folder and any lower layer.
LAYERS: list[tuple[str, ...]] = [
    (
        "rocm_audit",
        "rocm_audit.errors",
        "rocm_audit.hashing",
        "rocm_audit.severity",
        "rocm_audit.units",
        "rocm_audit.progress",
        "rocm_audit.report_types",
    ),
    ("rocm_audit.rulebook.catalogue",),
    ("rocm_audit.findings",),
    ("rocm_audit.outcome",),
    ("rocm_audit.rulebook",),
    ("rocm_audit.formats",),
    ("rocm_audit.elf",),
    ("rocm_audit.tree",),
    ("rocm_audit.dedup", "rocm_audit.gpu", "rocm_audit.llvm", "rocm_audit.postbuild", "rocm_audit.prune"),
    ("rocm_audit.audit",),
    ("rocm_audit.image",),
    ("rocm_audit.output",),
    ("rocm_audit.cli",),
    ("rocm_audit.__main__",),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every rocm_audit module this file imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from rocm_audit.x import y` imports rocm_audit.x.y when y is a module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t == "rocm_audit" or t.startswith("rocm_audit."))
    found.discard(name)
    return {t for t in found if t in known}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _layer_of(module: str) -> tuple[int, str]:
    """(layer index, the layer entry the module falls under): the longest entry that prefixes it."""
    best: tuple[int, str] | None = None
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > len(best[1])):
                best = (index, entry)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and to the code map in docs/development.md"
    return best


def test_no_import_cycles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_flow_downward_and_capabilities_stay_apart():
    wrong = []
    for module, imported in sorted(_graph().items()):
        layer, entry = _layer_of(module)
        for target in sorted(imported):
            target_layer, target_entry = _layer_of(target)
            if target_layer > layer:
                wrong.append(f"{module} (layer {layer}) imports {target} (layer {target_layer})")
            elif target_layer == layer and target_entry != entry and len(LAYERS[layer]) > 1 and layer > 0:
                wrong.append(f"{module} imports {target}: {entry} and {target_entry} are side by side")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_function_level_imports(tmp_path):
    """The walk must count an import inside a function (the kind that hid the old cycles)."""
    fake = tmp_path / "rocm_audit"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("def f():\n    from rocm_audit.b import g\n    return g\n")
    (fake / "b.py").write_text("from rocm_audit import a\n")
    known = {"rocm_audit", "rocm_audit.a", "rocm_audit.b"}
    global PACKAGE
    saved, PACKAGE = PACKAGE, fake
    try:
        assert _imports(fake / "a.py", "rocm_audit.a", known) == {"rocm_audit.b"}
        assert _imports(fake / "b.py", "rocm_audit.b", known) == {"rocm_audit.a"}
    finally:
        PACKAGE = saved
