"""The layout README's "Layout" section promises, checked on the source: stages that import only
earlier stages (no cycles), a library that knows nothing of the orchestrator, and installable
names that cannot collide with another distribution's."""

from __future__ import annotations

import ast
import itertools
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "src" / "eagle3_datagen"


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute import of a file (lazy ones inside functions too), with its line."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
    return found


def _library_files() -> list[Path]:
    return [p for p in LIBRARY.rglob("*.py") if "assets" not in p.relative_to(LIBRARY).parts]


def _unit(path: Path) -> str:
    """The stage a file belongs to: its subpackage, or the top-level module's name."""
    rel = path.relative_to(LIBRARY)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _stage_graph() -> dict[str, dict[str, str]]:
    """stage -> {imported stage: "file:line" of the first such import}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(_library_files()):
        me = _unit(path)
        for module, line in _imports(path):
            parts = module.split(".")
            if parts[0] != "eagle3_datagen" or len(parts) < 2 or parts[1] == me:
                continue
            graph[me].setdefault(parts[1], f"{path.relative_to(ROOT)}:{line}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "d": {"a": ""}}) is None


def test_library_stages_have_no_import_cycle():
    graph = _stage_graph()
    assert {"generate", "sglang", "write", "validate", "report"} <= set(graph)  # it saw the tree
    cycle = find_cycle(graph)
    where = [graph[a][b] for a, b in itertools.pairwise(cycle)] if cycle else []
    assert cycle is None, f"import cycle {' -> '.join(cycle or [])}: " + ", ".join(where)


# Every package's modules, by the name they import under (flows/ and tasks/ install as
# eagle3_datagen_flows and eagle3_datagen_tasks).
PACKAGES = {
    "eagle3_datagen": LIBRARY,
    "sglang_emulator": ROOT / "src" / "sglang_emulator",
    "eagle3_datagen_cli": ROOT / "src" / "eagle3_datagen_cli",
    "eagle3_datagen_flows": ROOT / "flows",
    "eagle3_datagen_tasks": ROOT / "tasks",
}


def _modules() -> dict[str, Path]:
    """Module name -> file, for every package (a package's ``__init__`` under its own name)."""
    found: dict[str, Path] = {}
    for package, base in PACKAGES.items():
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            if "assets" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_edges(source: str, modules: set[str]) -> list[tuple[str, int]]:
    """The modules of ``modules`` a source imports, with the line: every import, those under
    ``if TYPE_CHECKING:`` and inside functions too (a circle through a type-only import is
    still two modules that each need the other). ``from pkg import mod`` is an edge to the
    module ``pkg.mod``, not to the package."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            subs = [m for m in subs if m in modules]
            targets = subs or ([node.module] if node.module in modules else [])
            found.extend((m, node.lineno) for m in targets)
        elif isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names if a.name in modules)
    return found


def _module_graph() -> dict[str, dict[str, str]]:
    """module -> {imported module: "file:line" of the first such import}, all packages."""
    modules = _modules()
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for name, path in sorted(modules.items()):
        graph[name]  # a module that imports none of ours is in the graph too
        for module, line in module_edges(path.read_text(), set(modules)):
            if module != name:
                graph[name].setdefault(module, f"{path.relative_to(ROOT)}:{line}")
    return graph


def test_module_edges_see_type_checking_and_submodule_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from pkg import mod\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.other import Thing\n"
    )
    edges = module_edges(source, {"pkg", "pkg.mod", "pkg.other"})
    assert edges == [("pkg.mod", 2), ("pkg.other", 4)]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circle_between_modules(package):
    """No two modules of a package need each other, however indirectly: not at run time and
    not for types only (``TYPE_CHECKING``)."""
    graph = {
        module: {m: where for m, where in edges.items() if m.split(".")[0] == package}
        for module, edges in _module_graph().items()
        if module.split(".")[0] == package
    }
    assert len(graph) >= 2, f"saw only {sorted(graph)}"  # it saw the tree
    cycle = find_cycle(graph)
    where = [graph[a][b] for a, b in itertools.pairwise(cycle)] if cycle else []
    assert cycle is None, f"import circle {' -> '.join(cycle or [])}: " + ", ".join(where)


def test_only_the_orchestration_imports_the_batch_runner():
    """generate/batch.py (PartitionRunner) is the top of the generate stage: its steps take the
    partition's context and a sender, so no other module of a package needs it."""
    graph = _module_graph()
    users = sorted(m for m, edges in graph.items() if "eagle3_datagen.generate.batch" in edges)
    assert users and all(
        m.startswith(("eagle3_datagen_flows", "eagle3_datagen_tasks")) for m in users
    ), users


def test_readme_layout_lists_the_stages_in_import_order():
    """Each stage in README's Layout imports only stages listed above it."""
    text = (ROOT / "README.md").read_text()
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    graph = _stage_graph()
    units = {_unit(p) for p in _library_files()} - {"__init__"}
    order: list[str] = []
    for line in layout.splitlines():  # entries of src/eagle3_datagen/ are indented by two
        if line.startswith("  ") and not line.startswith("   "):
            for entry in line.split("  ")[1].split(","):
                name = entry.strip().removesuffix("/").removesuffix(".py")
                if name in units and name not in order:
                    order.append(name)
    assert order and set(order) == units, f"README's Layout lists {order}, the tree has {units}"
    assert {"inputs", "render", "sglang", "generate", "validate", "write", "report"} <= set(order)
    for i, stage in enumerate(order):
        later = [s for s in graph.get(stage, {}) if s in order[i + 1 :]]
        assert not later, f"README lists {stage} before {later}, which it imports"


@pytest.mark.parametrize("package", ["eagle3_datagen", "sglang_emulator"])
def test_nothing_under_src_imports_prefect(package):
    for path in (ROOT / "src" / package).rglob("*.py"):
        for module, line in _imports(path):
            assert module.split(".")[0] != "prefect", f"{path.relative_to(ROOT)}:{line}"
            assert not module.startswith(("eagle3_datagen_flows", "eagle3_datagen_tasks")), (
                f"{path.relative_to(ROOT)}:{line} imports the orchestration layer"
            )


def test_the_emulator_imports_no_torch():
    """torch and speculators are no dependencies: only the transformers backend imports them,
    a package outside the wheel that the emulator loads by name when asked for."""
    for path in (ROOT / "src" / "sglang_emulator").rglob("*.py"):
        for module, line in _imports(path):
            top = module.split(".")[0]
            assert top not in ("torch", "speculators", "sglang_emulator_transformers"), (
                f"{path.relative_to(ROOT)}:{line} imports {module}"
            )


def test_the_library_knows_no_prefect_wording():
    """Prefect's state preambles and resource ids are parsed and built in flows/, not here."""
    for path in _library_files():
        text = path.read_text()
        for wording in ("encountered an exception", "prefect.resource", "prefect.flow-run"):
            assert wording not in text, f"{path.relative_to(ROOT)} knows Prefect's {wording!r}"


def test_installed_names_are_the_projects_own():
    """Every top-level name the wheel installs starts with the project's name (or is the
    emulator's), the checkout's flows/ and tasks/ are the packages that install, and the
    command is the command-line package's."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    names = {Path(p).name for p in packages}
    assert names == {
        "eagle3_datagen",
        "sglang_emulator",
        "eagle3_datagen_flows",
        "eagle3_datagen_tasks",
        "eagle3_datagen_cli",
    }
    assert (ROOT / "src/eagle3_datagen_flows").resolve() == ROOT / "flows"
    assert (ROOT / "src/eagle3_datagen_tasks").resolve() == ROOT / "tasks"
    script = pyproject["project"]["scripts"]["eagle3-datagen"]
    assert script == "eagle3_datagen_cli.main:main"
    assert (ROOT / "src/eagle3_datagen_cli").is_dir()
    assert not (ROOT / "src/eagle3_datagen_cli").is_symlink()


SIZE_RULED = (
    "src/eagle3_datagen",
    "src/sglang_emulator",
    "flows",
    "tasks",
    "src/eagle3_datagen_cli",
)


def _sources() -> list[Path]:
    """The Python files the size rules cover (the command-line package only once it exists)."""
    found: list[Path] = []
    for base in SIZE_RULED:
        if not (ROOT / base).is_dir():
            continue
        found.extend(p for p in sorted((ROOT / base).rglob("*.py")) if "assets" not in p.parts)
    return found


def _functions() -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((path, node))
    return found


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_over_80_lines():
    """A function a reader can hold in one screen; a longer one is split into named steps."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_length(node)} lines)"
        for path, node in _functions()
        if _length(node) > 80
    ]
    assert not long, long


def test_no_module_over_500_lines():
    """One module, one job: past 500 lines a module holds more than one; split it by job."""
    sources = _sources()
    assert any(p.is_relative_to(LIBRARY) for p in sources)  # it saw the tree
    long = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for path in sources
        if (n := len(path.read_text().splitlines())) > 500
    ]
    assert not long, long


def test_flow_functions_stay_short():
    """A flow orchestrates; what it decides lives in the library. At most 60 lines each."""
    flows = [
        (path, node)
        for path, node in _functions()
        if any(ast.unparse(d).split("(")[0] == "flow" for d in node.decorator_list)
    ]
    assert len(flows) >= 3, flows  # it saw datagen, generate_partition, datagen_fanout
    long = [f"{p.relative_to(ROOT)}:{n.name} ({_length(n)})" for p, n in flows if _length(n) > 60]
    assert not long, long


CLI = ROOT / "src" / "eagle3_datagen_cli"
ORCHESTRATION = ("flows", "tasks")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_in_flows_is_over_300_lines():
    """flows/ is thin orchestration: a module that grows past 300 lines holds logic that
    belongs in the library, or two jobs."""
    modules = sorted((ROOT / "flows").rglob("*.py"))
    assert len(modules) >= 3, modules
    long = [f"{p.relative_to(ROOT)} ({_lines(p)} lines)" for p in modules if _lines(p) > 300]
    assert not long, long


def test_the_command_line_is_short_modules_of_short_functions():
    """The command-line package: modules of at most 300 lines, functions of at most 80."""
    modules = sorted(CLI.rglob("*.py"))
    assert {"main.py", "signals.py", "prefect_server.py"} <= {p.name for p in modules}
    long = [f"{p.relative_to(ROOT)} ({_lines(p)} lines)" for p in modules if _lines(p) > 300]
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _length(node) > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long, long


@pytest.mark.parametrize("base", ORCHESTRATION)
def test_the_orchestration_never_imports_the_command_line(base):
    """The command line starts the flows; a flow or task that imported it would run in a
    worker with the command's settings and signal handling."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / base).rglob("*.py"))
        for module, line in _imports(path)
        if module.split(".")[0] == "eagle3_datagen_cli"
    ]
    assert not found, found


# Every import of a private Prefect name (a module or name with a leading underscore under
# ``prefect``) in our code, with the test that fails when an upgrade moves it: "module.name" ->
# "tests/unit/<file>::<test function>". Empty: the code uses Prefect's public names only.
# (``eagle3_datagen_cli.prefect_server.drain`` uses public classes' inherited ``drain_all``:
# tests/unit/test_prefect_server.py guards it.)
PRIVATE_PREFECT: dict[str, str] = {}


def _private_prefect_imports(source: str) -> list[tuple[str, int]]:
    """``prefect._x`` modules and ``from prefect.y import _z`` names a source imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "prefect" and any(p.startswith("_") for p in parts[1:]):
                found.append((name, node.lineno))
    return found


def test_private_prefect_names_are_listed_with_their_guard():
    """A private Prefect name may move in any release: each one our code imports is in
    PRIVATE_PREFECT with the test that checks it is still there, and the list holds no other."""
    used: dict[str, str] = {}
    for base in ("src", *ORCHESTRATION):
        for path in sorted((ROOT / base).rglob("*.py")):
            for name, line in _private_prefect_imports(path.read_text()):
                used.setdefault(name, f"{path.relative_to(ROOT)}:{line}")
    unlisted = {name: where for name, where in used.items() if name not in PRIVATE_PREFECT}
    assert not unlisted, f"private Prefect imports without a guard in PRIVATE_PREFECT: {unlisted}"
    assert set(PRIVATE_PREFECT) <= set(used), "listed but no longer imported: remove them"
    for name, guard in PRIVATE_PREFECT.items():
        file, _, test = guard.partition("::")
        assert f"def {test}(" in (ROOT / file).read_text(), f"{name}: no guard {guard}"


def test_the_private_import_check_sees_one():
    """The check above is not blind: a private module and a private name are both found."""
    source = (
        "from prefect._internal.concurrency.services import QueueService\n"
        "from prefect.utilities import _secret\n"
        "import prefect.flows\n"
        "def f():\n"
        "    import prefect._vendor\n"
    )
    assert [name for name, _ in _private_prefect_imports(source)] == [
        "prefect._internal.concurrency.services.QueueService",
        "prefect.utilities._secret",
        "prefect._vendor",
    ]
