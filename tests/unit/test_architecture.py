"""The layout's rules, checked on the source (AST): the package import order, the subpackage
order each `__init__` declares, no import cycles, small folders, no private names across modules.

dataloader -> embeddings -> sharding -> trainer -> tools: each package imports only those before
it, including imports inside functions. Inside a package, each subpackage imports of its siblings
(the other subpackages and modules of its parent) only those its `__init__` docstring declares
("May import: ..."); the declared order has no cycle, and the README's layout table lists a
package's subpackages in it. No two modules import each other, directly or around a longer loop,
anywhere in the library.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["dataloader", "embeddings", "sharding", "trainer", "tools"]
MAX_MODULES = 12  # a folder of more modules is a concept without a name yet (STYLE.md)
# tools/cli stays flat: one module per command group is easy to find from the command; beside
# them the app, its helpers and the entry point with its stops (two: the entry imports the app,
# whose helpers import the stops).
MAX_MODULES_OF = {"tools/cli": 18}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@cache
def _imports(path: Path) -> frozenset[str]:
    """shardrec modules a file imports (names relative to `shardrec.`), at any depth."""
    found: set[str] = set()
    for node in ast.walk(_parse(path)):
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
    return frozenset(found)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in ORDER for p in (ROOT / pkg).rglob("*.py")}


@cache
def _packages() -> list[Path]:
    """Every package folder of the library (one with an __init__.py), top-level ones included."""
    return sorted(p.parent for pkg in ORDER for p in (ROOT / pkg).rglob("__init__.py"))


@cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
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


def _unit(module: str, parent: str) -> str | None:
    """The child of package `parent` (a subpackage or a module) that `module` lies in."""
    if not module.startswith(parent + "."):
        return None
    return parent + "." + module[len(parent) + 1 :].split(".")[0]


def _children(package: Path) -> dict[str, bool]:
    """Dotted names of a package's children -> whether the child is a subpackage."""
    parent = _module_name(package / "__init__.py")
    out = {f"{parent}.{p.parent.name}": True for p in package.glob("*/__init__.py")}
    for p in package.glob("*.py"):
        if p.name not in ("__init__.py", "__main__.py"):
            out[f"{parent}.{p.stem}"] = False
    return out


def _declared(package: Path) -> set[str] | None:
    """The siblings a subpackage's __init__ says it may import (None: no 'May import:' line)."""
    doc = ast.get_docstring(_parse(package / "__init__.py")) or ""
    match = re.search(r"^May import: (.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    if match is None:
        return None
    return {"shardrec." + n for n in re.findall(r"shardrec\.([\w.]+\w)", match.group(1))}


def _unit_edges(package: Path) -> dict[str, set[str]]:
    """Imports between the children of one package, from every module inside each child."""
    parent = _module_name(package / "__init__.py")
    edges: dict[str, set[str]] = {c: set() for c in _children(package)}
    for module, deps in _graph().items():
        unit = _unit(module, parent)
        if unit is None:
            continue
        for dep in deps:
            other = _unit(dep, parent)
            if other is not None and other != unit:
                edges.setdefault(unit, set()).add(other)
    return edges


def test_packages_import_in_order():
    wrong = []
    for module, deps in _graph().items():
        rank = ORDER.index(module.split(".")[0])
        wrong += [
            f"{module} imports {dep}" for dep in deps if ORDER.index(dep.split(".")[0]) > rank
        ]
    assert wrong == []


def test_no_module_cycle_anywhere():
    graph = _graph()
    # A package's __init__ is its namespace, not a module in the loop.
    packages = {_module_name(p / "__init__.py") for p in _packages()}
    modules = {m: {d for d in deps if d not in packages} for m, deps in graph.items()}
    assert _cycle({m: deps for m, deps in modules.items() if m not in packages}) is None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == [
        "a.x",
        "a.y",
        "a.z",
        "a.x",
    ]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}) is None


def test_subpackages_import_only_the_siblings_they_declare():
    wrong = []
    for package in _packages():
        if package.parent == ROOT:
            continue  # the top-level packages: test_packages_import_in_order
        name = _module_name(package / "__init__.py")
        declared = _declared(package)
        rel = package.relative_to(ROOT)
        assert declared is not None, f"{rel}/__init__.py: no 'May import:' line in its docstring"
        siblings = set(_children(package.parent))
        unknown = {d for d in declared if d.startswith("shardrec.")} - {
            f"shardrec.{s}" for s in siblings
        }
        parent_name = _module_name(package.parent / "__init__.py")
        unknown = {d for d in unknown if d.startswith(f"shardrec.{parent_name}.")}
        assert not unknown, f"{rel}/__init__.py declares siblings that do not exist: {unknown}"
        for other in sorted(_unit_edges(package.parent)[name]):
            if f"shardrec.{other}" not in declared:
                wrong.append(f"{rel} imports {other}, which its __init__ does not declare")
    assert wrong == []


def test_the_children_of_every_package_import_each_other_without_cycles():
    for package in _packages():
        edges = _unit_edges(package)
        cycle = _cycle(edges)
        assert cycle is None, f"{package.relative_to(ROOT)}: children import in a loop: {cycle}"
        declared = {
            child: {
                d[len("shardrec.") :] for d in (_declared(ROOT / child.replace(".", "/")) or ())
            }
            for child, is_package in _children(package).items()
            if is_package
        }
        assert _cycle(declared) is None, f"{package.relative_to(ROOT)}: declared order has a loop"


def test_every_folder_is_small_and_says_what_it_owns():
    for package in _packages():
        rel = package.relative_to(ROOT)
        doc = ast.get_docstring(_parse(package / "__init__.py"))
        assert doc and len(doc.split()) >= 10, f"{rel}: no docstring saying what it owns"
        modules = [p for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        limit = MAX_MODULES_OF.get(str(rel), MAX_MODULES)
        assert len(modules) <= limit, f"{rel}: {len(modules)} modules flat"


def test_no_private_name_is_used_across_modules():
    """`from shardrec.x import _name` and `module._name` on an imported shardrec module: a name
    one module keeps private is nobody else's to use."""
    found = []
    for module, path in _modules().items():
        tree = _parse(path)
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardrec."):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{module}:{node.lineno} imports {node.module}.{a.name}")
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("shardrec.") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert found == []


def test_one_module_name_means_one_thing_across_the_library():
    """A module name names one concept (dataloader/format/torchrec_npy.py reads torchrec's layout,
    tools/preprocess/derived/npy_import_export.py converts it). The CLI's modules are named
    after their commands, so they are left out."""
    seen: dict[str, list[str]] = {}
    for pkg in ORDER:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if path.name in ("__init__.py", "__main__.py") or rel.parts[:2] == ("tools", "cli"):
                continue
            seen.setdefault(path.name, []).append(str(rel))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_pyproject_installs_every_package_folder():
    """A wheel holds only the packages pyproject names: a folder left out imports from a
    checkout (editable) and fails once installed."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        str(p.relative_to(ROOT)): "shardrec." + _module_name(p / "__init__.py") for p in _packages()
    }
    assert sorted(setuptools["packages"]) == sorted(folders.values())
    assert setuptools["package-dir"] == {name: folder for folder, name in folders.items()}


def test_readme_lists_each_package_s_subpackages_in_their_order():
    """The layout table has a row per second-level folder (`pkg/sub/`), a package's rows in an
    order where each may import only the rows above it."""
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| `(\w+)/(\w+)/` \|", readme, re.M)
    for pkg in ORDER:
        subs = sorted(p.parent.name for p in (ROOT / pkg).glob("*/__init__.py"))
        rows = [sub for top, sub in listed if top == pkg]
        assert sorted(rows) == subs, f"README's layout table lists {pkg}/{rows}, it has {subs}"
        for i, sub in enumerate(rows):
            declared = _declared(ROOT / pkg / sub) or set()
            later = {f"shardrec.{pkg}.{s}" for s in rows[i + 1 :]}
            assert not declared & later, f"{pkg}/{sub} may import rows below it: {declared & later}"


TRAINER = ROOT / "trainer"


def test_run_directory_file_names_are_spelled_in_one_module():
    from shardrec.trainer.rundir import names

    spelled = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    found = []
    for path in [*TRAINER.rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        if path == TRAINER / "rundir" / "names.py":
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Constant) and node.value in spelled:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_every_shardrec_command_is_defined_under_tools_cli():
    """The benchmarks expose functions; tools/cli registers the commands (rank programs are
    trainer's)."""
    outside = []
    for path in (ROOT / "tools").rglob("*.py"):
        if "cli" not in path.relative_to(ROOT / "tools").parts[:1]:
            tree = _parse(path)
            modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            if any(m and (m == "typer" or m.startswith("typer.")) for m in modules):
                outside.append(str(path.relative_to(ROOT)))
    assert outside == []
