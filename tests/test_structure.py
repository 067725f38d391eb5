"""The import structure of ``sdplan/``, read from the source with ``ast``.

No module imports another's private names (``from sdplan.x import _name``),
no two modules import each other by any path (module-level and function-level
imports both count; ``if TYPE_CHECKING:`` imports do not run and are left
out), and no arrow runs up the layers (``cli/`` over ``render/`` over the
core; the core, measured runs included, under the measurement code).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sdplan"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at module level or in a function, not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(known: dict[str, Path], root: Path = PACKAGE) -> tuple[dict[str, set[str]], list[str]]:
    """Edges between sdplan modules, and the private names imported across modules (``file:line name``)."""
    edges: dict[str, set[str]] = {name: set() for name in known}
    private: list[str] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _absolute(node, name, path.name == "__init__.py")
                targets = []
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in known:
                        targets.append(submodule)
                        continue
                    targets.append(source)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and source in known:
                        private.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno} {source}.{alias.name}")
            for target in targets:
                while target and target not in known:  # ``import sdplan.x.y`` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def layer(name: str) -> int:
    """Lower layers never import higher ones: the core 0, measurement 1, render 2, cli 3."""
    if name.startswith("sdplan.cli") or name == "sdplan.__main__":
        return 3
    if name.startswith("sdplan.render"):
        return 2
    if name.startswith("sdplan.measure"):
        return 1
    return 0


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], list[str]]:
    return import_graph(modules())


def test_no_private_names_are_imported_across_modules(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    assert graph[1] == []


def test_no_modules_import_each_other(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    assert cycles(graph[0]) == []


def test_no_import_runs_up_the_layers(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    upward = sorted(f"{name} -> {target}" for name, targets in graph[0].items() for target in targets
                    if target != "sdplan" and layer(target) > layer(name))
    assert upward == []


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path: Path) -> None:
    """The checks can fail: a private import inside a function and a cycle closed at module level."""
    root = tmp_path / "sdplan"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from sdplan.b import helper\n\n_hidden = 1\n")
    (root / "b.py").write_text("def helper():\n    from sdplan.a import _hidden\n    return _hidden\n")
    edges, private = import_graph(modules(root), root)
    assert private == ["sdplan/b.py:2 sdplan.a._hidden"]
    assert cycles(edges) == [["sdplan.a", "sdplan.b"]]
