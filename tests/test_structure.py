"""The import structure of ``sdplan/``, read from the source with ``ast``.

No module imports another's private names (``from sdplan.x import _name``),
no two modules import each other by any path (module-level and function-level
imports both count; ``if TYPE_CHECKING:`` imports do not run and are left
out), and no import breaks a layer rule (:data:`LAYER_RULES`: the core never
imports ``cli/``, ``render/``, ``runs/`` or ``measure/``; inside the core,
``inputs/`` sits under ``latency/``, which sits under ``calibration/``,
``fitting/`` and ``planning/``; ``render/`` never imports ``cli/``; only
``sdplan/_vllm/`` imports vLLM; drawn in ``docs/architecture.md#layers``).

Sizes: no function with more than 12 parameters (click commands excepted); today's offenders are listed by
name and may only shrink. Lines are for review, not for a test. Only
``sdplan/_vllm/`` imports vLLM or torch (and ``sdplan/testing/``, the tiny models of the tests and benchmarks,
torch), and only when used.

Beside the package, ``tests/``, ``benchmarks/`` and ``scripts/`` each run on their own against the installed
package: none imports a module of another, and none sets the import path by hand.
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
                        where = path.relative_to(root.parent).as_posix()
                        private.append(f"{where}:{node.lineno} {source}.{alias.name}")
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


#: The folders of ``sdplan/`` at the edges. ``sdplan/__main__.py`` belongs to ``cli``.
EDGES = ("cli", "render", "runs", "metrics", "measure", "_vllm", "derive", "accuracy", "testing")

#: The core's packages, bottom up: what a question starts from, the latency model, calibration files, fitting
#: the model to runs, the questions the commands answer, the simulator. The modules at the top of ``sdplan/``
#: (errors, units, file writes, work budgets, the TOML validator) and the package itself are ``core``.
CORE_PACKAGES = ("inputs", "latency", "calibration", "fitting", "planning", "simulate")


def area(name: str) -> str:
    """The folder a module lies in (``sdplan.runs.screen`` -> ``runs``), else ``core`` (the top of ``sdplan/``)."""
    if name == "sdplan.__main__":
        return "cli"
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in EDGES + CORE_PACKAGES else "core"


#: Who may import whom: (the areas a rule binds, what they must not import (a prefix of the imported module's
#: name), why). Only imports that run count (module level or in a function, not ``if TYPE_CHECKING:``).
#: docs/architecture.md#layers draws these rules; change the two together.
LAYER_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("core", *CORE_PACKAGES), ("sdplan.cli", "sdplan.render", "sdplan.runs", "sdplan.measure"),
     "the model computes and raises: it never parses options, prints, or reads result files"),
    (("core",), tuple(f"sdplan.{package}" for package in CORE_PACKAGES),
     "the modules at the top (errors, units, file writes, budgets, schemas) serve every package and know none"),
    (("inputs",), ("sdplan.latency", "sdplan.calibration", "sdplan.fitting", "sdplan.planning", "sdplan.simulate"),
     "an input is read and checked on its own terms; what it costs is the model's business"),
    (("latency",), ("sdplan.calibration", "sdplan.fitting", "sdplan.planning", "sdplan.simulate"),
     "the model computes from the coefficients it is given: it never reads a file, a fit or a question"),
    (("calibration", "simulate"), ("sdplan.fitting", "sdplan.planning"),
     "a calibration file and the simulator hold and use coefficients; fitting makes them, planning asks of them"),
    (("fitting",), ("sdplan.planning", "sdplan.simulate"),
     "a fit finds coefficients in measured runs; the questions asked of them come after"),
    (("render",), ("sdplan.cli",), "renderers turn results into text; the CLI calls them, not the reverse"),
    (("runs", "metrics", "measure", "_vllm", "derive", "accuracy", "testing"), ("sdplan.cli", "sdplan.render"),
     "readers, measurement and derivation return records; only the CLI shows them"),
    (("runs",), ("sdplan.measure",), "the readers read any results; measuring writes them with the readers"),
    (tuple(sorted({"core", *CORE_PACKAGES, *EDGES} - {"_vllm"})), ("vllm",),
     "vLLM is an optional, heavy extra: sdplan/_vllm/ is its one door"),
)

#: Imports that break a rule today, each with why it is not fixed yet. The test fails while an entry is no
#: longer found, so the list only shrinks.
KNOWN_BREACHES: dict[str, str] = {}


def imports_by_module(known: dict[str, Path], root: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module's imports that run: sdplan modules as :func:`import_graph` resolves them, others by name."""
    edges, _ = import_graph(known, root)
    for name, path in known.items():
        for node in runtime_imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if node.level == 0 and node.module else [])
            edges[name] |= {target for target in names if target.split(".")[0] != "sdplan"}
    return edges


def layer_breaches(imports: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import a rule of :data:`LAYER_RULES` forbids."""
    found = set()
    for name, targets in imports.items():
        for areas, forbidden, _ in LAYER_RULES:
            if area(name) in areas:
                found |= {f"{name} -> {target}" for target in targets
                          if any(target == prefix or target.startswith(prefix + ".") for prefix in forbidden)}
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], list[str]]:
    return import_graph(modules())


def test_no_private_names_are_imported_across_modules(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    assert graph[1] == []


def test_no_modules_import_each_other(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    assert cycles(graph[0]) == []


def test_no_import_breaks_a_layer_rule() -> None:
    assert layer_breaches(imports_by_module(modules())) == sorted(KNOWN_BREACHES)


def test_the_architecture_page_states_the_same_rules() -> None:
    """docs/architecture.md#layers tabulates, row by row, what each area must not import."""
    import re

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = [line.split("|")[2] for line in page.split("## Layers", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith("| who ")]
    assert [tuple(re.findall(r"`([\w.]+)`", cell)) for cell in rows] == [rule[1] for rule in LAYER_RULES]
    assert all(f"`{breach}`" in page for breach in KNOWN_BREACHES)


def test_the_layer_rules_can_fail(tmp_path: Path) -> None:
    """Each kind of area breaks a rule in a crafted tree; imports only for type checking do not count."""
    root = tmp_path / "sdplan"
    for folder in ("cli", "render", "runs", "measure", "_vllm", "inputs", "latency", "fitting", "planning", "simulate"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "__main__.py").write_text("from sdplan.cli import main\n")
    (root / "cli" / "main.py").write_text("from sdplan.render import text\nfrom sdplan.latency import model\n")
    (root / "render" / "text.py").write_text("def show():\n    from sdplan.cli import main\n")
    (root / "runs" / "read.py").write_text("from sdplan.latency import model\n")
    (root / "measure" / "sweep.py").write_text("from sdplan.runs import read\nimport vllm.engine\n")
    (root / "_vllm" / "engine.py").write_text("import vllm\nfrom sdplan.latency import model\n")
    (root / "latency" / "model.py").write_text(
        "from typing import TYPE_CHECKING\n\nfrom sdplan.inputs import workload\n\nif TYPE_CHECKING:\n"
        "    from sdplan.render import text\n    from sdplan.fitting import fit\n\n\ndef solve():\n"
        "    from sdplan.runs.read import x\n    from sdplan.simulate.engine import run\n    from vllm import LLM\n")
    (root / "simulate" / "engine.py").write_text("from sdplan.fitting import fit\n")
    (root / "inputs" / "workload.py").write_text("from sdplan.latency.model import solve\n")
    (root / "fitting" / "fit.py").write_text("from sdplan.latency import model\nfrom sdplan.planning import plan\n")
    (root / "planning" / "plan.py").write_text("from sdplan.fitting import fit\nfrom sdplan import errors\n")
    (root / "errors.py").write_text("def hint():\n    from sdplan.planning import plan\n")
    assert layer_breaches(imports_by_module(modules(root), root)) == [
        "sdplan.errors -> sdplan.planning.plan", "sdplan.fitting.fit -> sdplan.planning.plan",
        "sdplan.inputs.workload -> sdplan.latency.model", "sdplan.latency.model -> sdplan.runs.read",
        "sdplan.latency.model -> sdplan.simulate.engine", "sdplan.latency.model -> vllm",
        "sdplan.measure.sweep -> vllm.engine", "sdplan.render.text -> sdplan.cli.main",
        "sdplan.simulate.engine -> sdplan.fitting.fit"]
    assert [area(name) for name in ("sdplan.__main__", "sdplan.cli.main", "sdplan.calibration.records",
                                    "sdplan.simulate", "sdplan", "sdplan.errors", "sdplan.latency.model",
                                    "sdplan._vllm.engine")] == [
        "cli", "cli", "calibration", "simulate", "core", "core", "latency", "_vllm"]


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


# ----------------------------------------------------------------------------- sizes

# Length is for review, not for a test: module and function line caps shaped code to fit them (two modules at
# exactly 500 lines, functions at 77-80). A cap on parameters stays: a long signature is a missing record.
#: At most this many parameters of a function, ``self`` and ``*args``/``**kwargs`` included; click commands,
#: whose signature is their option list, are excepted.
FUNCTION_PARAMETERS = 12

#: Known offenders, each at most its size today. Split them and remove the entry: the test fails while an entry
#: names something that is gone or back within the limit, so the list only shrinks.
MANY_PARAMETERS: dict[str, int] = {}


def _is_click_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with ``@<something>.command(...)`` or ``@<something>.group(...)``."""
    return any(isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
               and decorator.func.attr in ("command", "group") for decorator in node.decorator_list)


def sizes(root: Path = PACKAGE) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Lines per module, lines per function and parameters per function (click commands left out).

    Keys are ``sdplan/x.py`` and ``sdplan/x.py:Class.method``; nested functions are named ``outer.inner``
    and count on their own as well as inside the function around them.
    """
    module_lines: dict[str, int] = {}
    function_lines: dict[str, int] = {}
    parameters: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        module_lines[where] = len(text.splitlines())

        def visit(node: ast.AST, prefix: str, where: str = where) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{where}:{prefix}{child.name}"
                    function_lines[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                    args = child.args
                    if not _is_click_command(child):
                        parameters[name] = (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
                                            + (args.vararg is not None) + (args.kwarg is not None))
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                else:
                    visit(child, prefix)

        visit(ast.parse(text, filename=str(path)), "")
    return module_lines, function_lines, parameters


def over_limit(measured: dict[str, int], limit: int, allowed: dict[str, int], unit: str) -> list[str]:
    """What breaks a limit: an offender not allowed, one grown past its allowance, an allowance no longer needed."""
    problems = []
    for name, size in sorted(measured.items()):
        if size <= limit:
            continue
        if name not in allowed:
            problems.append(f"{name}: {size} {unit}, over {limit}: split it")
        elif size > allowed[name]:
            problems.append(f"{name}: {size} {unit}, grew past its allowance of {allowed[name]}")
    for name in sorted(allowed):
        if measured.get(name, 0) <= limit:
            problems.append(f"{name}: allowed {allowed[name]} {unit} but now {measured.get(name, 'gone')}, "
                            f"within {limit}: remove its entry")
    return problems


@pytest.fixture(scope="module")
def measured() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    return sizes()


def test_no_function_has_more_than_12_parameters(
        measured: tuple[dict[str, int], dict[str, int], dict[str, int]]) -> None:
    assert over_limit(measured[2], FUNCTION_PARAMETERS, MANY_PARAMETERS, "parameters") == []


def test_the_size_checks_can_fail(tmp_path: Path) -> None:
    """Each kind of breach is reported, and a click command's signature is left out of the parameter count."""
    root = tmp_path / "sdplan"
    (root / "cli").mkdir(parents=True)
    (root / "big.py").write_text("x = 1\n" * 6)
    body = "".join(f"        v{i} = {i}\n" for i in range(4))
    (root / "cli" / "run.py").write_text(
        "import click\n\n\nclass Runner:\n    def step(self, a, b, *rest, c=1, **more):\n" + body
        + "\n\n@click.command()\ndef run(a, b, c, d, e, f):\n    pass\n")
    modules_, functions, parameters = sizes(root)
    assert modules_ == {"sdplan/big.py": 6, "sdplan/cli/run.py": 14}
    assert functions == {"sdplan/cli/run.py:Runner.step": 5, "sdplan/cli/run.py:run": 2}
    assert parameters == {"sdplan/cli/run.py:Runner.step": 6}
    assert over_limit(modules_, 5, {}, "lines") == ["sdplan/big.py: 6 lines, over 5: split it",
                                                    "sdplan/cli/run.py: 14 lines, over 5: split it"]
    assert over_limit(modules_, 5, {"sdplan/big.py": 6, "sdplan/cli/run.py": 13}, "lines") == [
        "sdplan/cli/run.py: 14 lines, grew past its allowance of 13"]
    assert over_limit(modules_, 10, {"sdplan/big.py": 6, "sdplan/cli/run.py": 14, "sdplan/gone.py": 600},
                      "lines") == ["sdplan/big.py: allowed 6 lines but now 6, within 10: remove its entry",
                                   "sdplan/gone.py: allowed 600 lines but now gone, within 10: remove its entry"]


# ----------------------------------------------------------------------------- vLLM

ENGINE_MODULES = ("vllm", "torch")


def engine_imports(path: Path, module_level_only: bool = False) -> list[str]:
    """``line name`` of each import of vLLM or torch in a file (only those that run on import, if asked)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            found.extend(f"{child.lineno} {name}" for name in names if name.split(".")[0] in ENGINE_MODULES)
            visit(child)

    visit(tree)
    return found


def test_only_the_vllm_package_imports_vllm() -> None:
    """vLLM and torch are imported in ``sdplan/_vllm/`` only, and there only when used, never on import.

    ``sdplan/testing/`` builds the tiny models of the real-engine tests and benchmarks: it imports torch, never
    vLLM, and also only when used.
    """
    outside = {path.relative_to(PACKAGE.parent).as_posix(): engine_imports(path)
               for path in sorted(PACKAGE.rglob("*.py")) if "_vllm" not in path.relative_to(PACKAGE).parts}
    testing = {name: [line for line in lines if line.split()[1].split(".")[0] == "torch"]
               for name, lines in outside.items() if name.startswith("sdplan/testing/")}
    assert any(testing.values())  # the check sees the tiny models' torch, inside functions
    assert {name: lines for name, lines in outside.items() if lines and lines != testing.get(name)} == {}
    assert {name: engine_imports(PACKAGE.parent / name, module_level_only=True) for name in testing} == {
        name: [] for name in testing}
    inside = sorted((PACKAGE / "_vllm").glob("*.py"))
    assert [path.name for path in inside] == ["__init__.py", "engine.py", "launch.py"]
    assert all(engine_imports(path) for path in inside[1:])  # the check sees their imports inside functions
    assert {path.name: engine_imports(path, module_level_only=True) for path in inside} == {
        path.name: [] for path in inside}


# ----------------------------------------------------------------------------- tests, benchmarks and scripts

#: The trees beside the package. What two of them share lives in ``sdplan/`` (``sdplan.testing`` for tests and
#: benchmarks); what only the tests share, in ``tests/`` (imported as ``tests.<module>``).
TREES = ("tests", "benchmarks", "scripts")


def _imported(node: ast.AST) -> list[str]:
    """The absolute module names an import statement or an ``importlib.import_module``/``__import__`` call names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""] if node.level == 0 else []
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        if name in ("import_module", "__import__"):
            return [node.args[0].value]
    return []


def _sets_the_path(node: ast.AST) -> str | None:
    """What in ``node`` sets where imports come from by hand: ``sys.path``, or a module loaded by its file path."""
    if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
            and node.value.id == "sys":
        return "uses sys.path"
    if isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location", "SourceFileLoader"):
        return f"loads a module by its path ({node.attr})"
    return None


def tree_problems(root: Path) -> list[str]:
    """``file:line what`` for each import of another tree's module and each import path set by hand.

    A tree's modules are its ``*.py`` files. A test imports the tests' helpers as ``tests.<module>``; a benchmark
    or a script may import a sibling by its bare name (its folder is first on the path when it runs), so a name
    of its own tree is its own even where another tree has a file of that name. Running another tree's program
    (a subprocess, or :func:`runpy.run_path` as ``__main__``, as a test of a benchmark does) is not an import.
    """
    names = {tree: {path.stem for path in (root / tree).rglob("*.py")} for tree in TREES}
    problems = []
    for tree in TREES:
        own = set() if tree == "tests" else names[tree]
        foreign = {name for other in TREES if other != tree for name in names[other] | {other}} - own
        for path in sorted((root / tree).rglob("*.py")):
            found: list[tuple[int, str]] = []
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                found += [(node.lineno, f"imports {name}") for name in _imported(node) if name.split(".")[0] in foreign]
                what = _sets_the_path(node)
                if what:
                    found.append((getattr(node, "lineno", 0), what))
            problems += [f"{path.relative_to(root).as_posix()}:{line} {what}" for line, what in sorted(found)]
    return problems


def test_tests_benchmarks_and_scripts_import_only_the_package_and_their_own() -> None:
    import tomllib

    assert tree_problems(PACKAGE.parent) == []
    pytest_options = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "pythonpath" not in pytest_options  # pytest's own sys.path entries: the same by another name


def test_the_tree_check_sees_imports_across_trees_and_paths_set_by_hand(tmp_path: Path) -> None:
    for tree, files in {"tests": {"helpers.py": "", "test_a.py": "import sys\nsys.path.insert(0, 'benchmarks')\n"
                                  "from floors import x\nfrom tests.helpers import y\nimport sdplan\n"},
                        "benchmarks": {"floors.py": "import importlib\nimportlib.import_module('tests.helpers')\n",
                                       "run.py": "import floors\nfrom tests import helpers\n"},
                        "scripts": {"go.py": "import importlib.util\n"
                                    "importlib.util.spec_from_file_location('floors', 'benchmarks/floors.py')\n",
                                    "floors.py": ""}}.items():
        (tmp_path / tree).mkdir()
        for name, text in files.items():
            (tmp_path / tree / name).write_text(text)
    assert tree_problems(tmp_path) == [
        "tests/test_a.py:2 uses sys.path", "tests/test_a.py:3 imports floors",
        "benchmarks/floors.py:2 imports tests.helpers", "benchmarks/run.py:2 imports tests",
        "scripts/go.py:2 loads a module by its path (spec_from_file_location)"]


# ----------------------------------------------------------------------------- exit statuses

#: Where a process exit may be written in ``sdplan/``. The CLI maps every error and every verdict a command
#: returns to its exit status in one place; ``_vllm/launch.py`` is another program (``python -m
#: sdplan._vllm.launch``, the vLLM launcher sdplan starts as a subprocess), whose exit status its parent reads.
EXIT_ALLOWED = ("sdplan/cli/__init__.py", "sdplan/_vllm/launch.py")


def exits(root: Path = PACKAGE) -> list[str]:
    """``file:line what`` for each ``SystemExit``, ``sys.exit``, ``exit(``/``quit(`` or ``os._exit`` in ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        in_file: list[tuple[int, str]] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            what = None
            if isinstance(node, ast.Name) and node.id in ("SystemExit", "exit", "quit"):
                what = node.id
            elif isinstance(node, ast.Attribute) and node.attr in ("exit", "_exit") \
                    and isinstance(node.value, ast.Name) and node.value.id in ("sys", "os"):
                what = f"{node.value.id}.{node.attr}"
            if what:
                in_file.append((node.lineno, what))
        found += [f"{where}:{line} {what}" for line, what in sorted(in_file)]
    return found


def test_exit_statuses_are_mapped_in_one_place() -> None:
    """A command returns its :class:`~sdplan.errors.ExitStatus` or raises a typed error; it never exits."""
    found = exits()
    assert any(line.startswith("sdplan/cli/__init__.py:") for line in found)  # the check sees the map's own
    assert [line for line in found if line.split(":")[0] not in EXIT_ALLOWED] == []


def test_the_exit_check_can_fail(tmp_path: Path) -> None:
    root = tmp_path / "sdplan"
    root.mkdir()
    (root / "gate.py").write_text("import os\nimport sys\n\n\ndef f(ok):\n    if ok:\n        sys.exit(1)\n"
                                  "    try:\n        raise SystemExit(2)\n    finally:\n        exit(3)\n"
                                  "    os._exit(4)\n")
    assert exits(root) == ["sdplan/gate.py:7 sys.exit", "sdplan/gate.py:9 SystemExit", "sdplan/gate.py:11 exit",
                           "sdplan/gate.py:12 os._exit"]


# ----------------------------------------------------------------------------- options passed explicitly

#: What reads a command's options back from click instead of taking them as arguments.
CONTEXT_READS = ("get_current_context", "pass_context", "get_parameter_source")


def _is_parameter_callback(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Click's parameter-callback signature ``(ctx, param, value)``: the one place a context is handed over."""
    return [arg.arg for arg in node.args.args][:2] == ["ctx", "param"] and len(node.args.args) == 3


def context_reads(root: Path = PACKAGE) -> list[str]:
    """``file:line what`` for each read of click's context outside a parameter callback.

    A command parses its options into one typed request from its own parameters and passes it on
    (``sdplan/cli/_inputs.py``); a parameter callback may ask its ``ctx`` how its own value was given.
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        in_file: list[tuple[int, str]] = []

        def visit(node: ast.AST, in_callback: bool, in_file: list[tuple[int, str]] = in_file) -> None:
            for child in ast.iter_child_nodes(node):
                inside = in_callback
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inside = _is_parameter_callback(child)
                name = child.attr if isinstance(child, ast.Attribute) else getattr(child, "id", None)
                if name in CONTEXT_READS and not in_callback:
                    in_file.append((child.lineno, str(name)))
                visit(child, inside)

        visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
        found += [f"{where}:{line} {what}" for line, what in sorted(in_file)]
    return found


def test_no_command_reads_its_options_back_from_click() -> None:
    assert context_reads() == []


def test_the_context_check_can_fail(tmp_path: Path) -> None:
    root = tmp_path / "sdplan"
    root.mkdir()
    (root / "run.py").write_text(
        "import click\nfrom click import get_current_context\n\n\n"
        "def given(ctx, param, value):\n    return ctx.get_parameter_source(param.name), value\n\n\n"
        "def body():\n    params = click.get_current_context().params\n"
        "    return get_current_context().get_parameter_source('x'), params\n\n\n"
        "@click.pass_context\ndef command(ctx):\n    pass\n")
    assert context_reads(root) == ["sdplan/run.py:10 get_current_context", "sdplan/run.py:11 get_current_context",
                                   "sdplan/run.py:11 get_parameter_source", "sdplan/run.py:14 pass_context"]


# ----------------------------------------------------------------------------- imports at the top

#: Packages a function may import where it needs them: heavy, optional, or needed by one path only.
LAZY_ALLOWED = ("vllm", "torch", "transformers", "tokenizers", "safetensors", "aiconfigurator", "aiconfigurator_core",
                "matplotlib", "plotext", "pandas", "scipy", "prometheus_client", "yaml")


def function_level_share(root: Path = PACKAGE) -> tuple[int, int]:
    """(imports inside functions, outside :data:`LAZY_ALLOWED`; all imports) of the package."""
    total = inside = 0
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        nested = {id(node) for function in functions for node in ast.walk(function)
                  if isinstance(node, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                total += 1
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if id(node) in nested and not any(name.split(".")[0] in LAZY_ALLOWED for name in names):
                    inside += 1
    return inside, total


def test_imports_go_at_the_top_of_modules() -> None:
    """At most 10% of imports sit in functions, beside the optional heavy packages: the CLI's lazy command
    modules keep ``--help`` light, a few readers break an import cycle; everything else imports at the top."""
    inside, total = function_level_share()
    assert inside <= 0.10 * total, f"{inside} of {total} imports are inside functions"


def test_the_import_share_counts_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import os\n\ndef f():\n    import json\n    import scipy\n")
    assert function_level_share(tmp_path) == (1, 3)
