"""The package import order and the absence of module cycles, checked on the source (AST).

dataloader -> embeddings -> sharding -> trainer -> tools: each package imports only those before
it, including imports inside functions. Inside one package no two modules import each other,
directly or around a longer loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["dataloader", "embeddings", "sharding", "trainer", "tools"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """shardrec modules a file imports (names relative to `shardrec.`), at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("shardrec."):
                base = node.module[len("shardrec.") :]
                found.add(base)
                # `from shardrec.pkg import module` names modules too.
                found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name[len("shardrec.") :] for a in node.names if a.name.startswith("shardrec."))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in ORDER for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_packages_import_in_order():
    wrong = []
    for module, deps in _graph().items():
        rank = ORDER.index(module.split(".")[0])
        wrong += [f"{module} imports {dep}" for dep in deps if ORDER.index(dep.split(".")[0]) > rank]
    assert wrong == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_cycle_inside_a_package():
    graph = _graph()
    # A package's __init__ is its namespace, not a module in the loop; edges stay within a package.
    inner = {
        m: {d for d in deps if d.split(".")[0] == m.split(".")[0] and d.count(".") > 0}
        for m, deps in graph.items()
        if m.count(".") > 0
    }
    assert _cycle(inner) is None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x", "a.y", "a.z", "a.x"]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}) is None
