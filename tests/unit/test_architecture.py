"""The package import order and the absence of module cycles, checked on the source (AST).

dataloader -> embeddings -> sharding -> trainer -> tools: each package imports only those before
it, including imports inside functions. trainer's subpackages import one another only as their
`__init__` docstrings declare ("May import: ..."), in one order that the README's layout table
lists. Inside one package no two modules import each other, directly or around a longer loop.
"""

from __future__ import annotations

import ast
import re
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
            found.update(
                a.name[len("shardrec.") :] for a in node.names if a.name.startswith("shardrec.")
            )
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in ORDER for p in (ROOT / pkg).rglob("*.py")}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def test_packages_import_in_order():
    wrong = []
    for module, deps in _graph().items():
        rank = ORDER.index(module.split(".")[0])
        wrong += [
            f"{module} imports {dep}" for dep in deps if ORDER.index(dep.split(".")[0]) > rank
        ]
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


TRAINER = ROOT / "trainer"
MAX_MODULES = 10  # a folder of more than ~10 modules is a concept without a name yet (STYLE.md)


def _subpackages() -> list[str]:
    return sorted(p.parent.name for p in TRAINER.glob("*/__init__.py"))


def _declared(sub: str) -> set[str]:
    """The trainer subpackages that trainer/<sub>/__init__.py says it may import."""
    doc = ast.get_docstring(ast.parse((TRAINER / sub / "__init__.py").read_text())) or ""
    match = re.search(r"^May import: (.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    assert match, f"trainer/{sub}/__init__.py: no 'May import:' line in its docstring"
    return set(re.findall(r"shardrec\.trainer\.(\w+)", match.group(1)))


def test_trainer_subpackages_import_only_what_they_declare():
    subs = _subpackages()
    wrong = []
    for module, deps in _graph().items():
        parts = module.split(".")
        if parts[0] != "trainer" or len(parts) < 3 or parts[1] not in subs:
            continue  # trainer's own __init__ and __main__ may import every subpackage
        allowed = _declared(parts[1]) | {parts[1]}
        for dep in deps:
            dep_parts = dep.split(".")
            if dep_parts[0] == "trainer" and len(dep_parts) > 1 and dep_parts[1] in subs:
                if dep_parts[1] not in allowed:
                    wrong.append(f"{module} imports {dep}")
    assert wrong == []


def test_trainer_subpackages_declare_one_order_without_cycles():
    subs = _subpackages()
    declared = {sub: _declared(sub) for sub in subs}
    for sub, deps in declared.items():
        assert deps <= set(subs), (
            f"trainer/{sub} declares unknown subpackages {sorted(deps - set(subs))}"
        )
    assert (
        _cycle({f"trainer.{s}": {f"trainer.{d}" for d in deps} for s, deps in declared.items()})
        is None
    )
    # The README lists them in that order: each row may import only the rows above it.
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| `trainer/(\w+)/` \|", readme, re.M)
    assert sorted(listed) == subs, f"README's layout table lists {listed}, trainer/ has {subs}"
    for i, sub in enumerate(listed):
        assert declared[sub] <= set(listed[:i]), (
            f"trainer/{sub} may import {sorted(declared[sub] - set(listed[:i]))}"
        )


def test_every_package_says_what_it_owns_and_no_trainer_folder_is_crowded():
    for init in [*ROOT.glob("*/__init__.py"), *ROOT.glob("*/*/__init__.py")]:
        rel = init.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests", "runs"):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 10, f"{rel}: no docstring saying what the package owns"
    for sub in ["", *_subpackages()]:
        modules = [
            p for p in (TRAINER / sub).glob("*.py") if p.name not in ("__init__.py", "__main__.py")
        ]
        assert len(modules) <= MAX_MODULES, f"trainer/{sub}: {len(modules)} modules"


def test_run_directory_file_names_are_spelled_in_one_module():
    from shardrec.trainer.rundir import names

    spelled = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    found = []
    for path in [*TRAINER.rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        if path == TRAINER / "rundir" / "names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in spelled:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_every_shardrec_command_is_defined_under_tools_cli():
    """The benchmarks expose functions; tools/cli registers the commands (rank programs are
    trainer's)."""
    outside = []
    for path in (ROOT / "tools").rglob("*.py"):
        if "cli" not in path.relative_to(ROOT / "tools").parts[:1]:
            modules = {
                a.name
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.Import)
                for a in n.names
            }
            modules |= {
                n.module
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom)
            }
            if any(m and (m == "typer" or m.startswith("typer.")) for m in modules):
                outside.append(str(path.relative_to(ROOT)))
    assert outside == []


def test_one_module_name_means_one_thing_across_the_library():
    """dataloader/format/torchrec_npy.py reads torchrec's layout,
    tools/preprocess/derived/npy_import_export.py converts it: a module name names one concept. The
    CLI's and the benchmarks' modules are named after their commands, so they are left out."""
    seen: dict[str, list[str]] = {}
    for pkg in ("dataloader", "embeddings", "sharding", "trainer", "tools/preprocess"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name not in ("__init__.py", "__main__.py"):
                seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
