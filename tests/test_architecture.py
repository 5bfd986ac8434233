"""The house rules of the layout, read from the source: arrows point down, no cycles.

Every import counts, also those inside functions (imported lazily for speed, they are still
dependencies). The graph is built from the files with ``ast``, without importing anything.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autotune", "api")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for all the rules (each parsing every file again made this
    module 20 s of the suite's CPU)."""
    return ast.parse(path.read_text(), str(path))


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports (anywhere in the file), as dotted names."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from pkg import name``: name is a submodule when there is one, else an attribute.
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                     else node.module for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # ``import a.b.c`` of a module a.b.c, or an attribute
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    """The import graph of the packages (cached: read it, do not change it)."""
    known = modules()
    names = set(known)
    return {name: imports(path, names) - {name} for name, path in known.items()}


def is_cli(name: str) -> bool:
    """The CLI package, and ``python -m autotune`` that runs it."""
    return name in ("autotune.cli", "autotune.__main__") or name.startswith("autotune.cli.")


def is_api(name: str) -> bool:
    return name == "api" or name.startswith("api.")


def test_the_graph_sees_lazy_imports():
    # autotune/backends/__init__.py imports the estimate backend inside make_backend()
    assert "autotune.backends.estimate.backend" in graph()["autotune.backends"]


def test_no_library_module_imports_the_cli():
    offenders = {(m, dep) for m, deps in graph().items() if not is_cli(m) for dep in deps if is_cli(dep)}
    assert offenders == set()


def test_only_the_serve_command_imports_the_service():
    offenders = {(m, dep) for m, deps in graph().items() if not is_api(m) for dep in deps if is_api(dep)}
    assert offenders == {(m, dep) for m, dep in offenders if m == "autotune.cli.serve"}
    assert any(m == "autotune.cli.serve" for m, _ in offenders)  # it does import api, and is the one


def test_the_search_and_the_trace_are_free_of_torch():
    for name in ("autotune/search.py", "autotune/backends/estimate/trace.py"):
        tree = ast.parse((ROOT / name).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"torch", "transformers"}, name
        for dep in imports(ROOT / name, set(modules())):  # nor through the project's modules
            assert dep in ("autotune.defaults", "autotune.errors", "autotune.search"), (name, dep)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    assert find_cycle(graph()) is None


@pytest.mark.parametrize(("edges", "cycle"), [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}, ["b", "b2", "b"]),
])
def test_find_cycle_finds_cycles(edges, cycle):
    assert find_cycle(edges) == cycle


def service_package(name: str) -> str:
    """api.runs for api.runs.queue, api.settings for api.settings: the service's rooms."""
    return ".".join(name.split(".")[:2])


def test_the_service_s_packages_form_no_cycle():
    # Module cycles are caught above; this catches two rooms leaning on each other (api.settings
    # importing a runner's constants, api.runs importing the fleet that is built on it).
    edges: dict[str, set[str]] = {}
    for name, deps in graph().items():
        if is_api(name):
            room = service_package(name)
            edges.setdefault(room, set()).update(
                service_package(dep) for dep in deps if is_api(dep) and service_package(dep) != room)
    assert find_cycle(edges) is None


def test_only_processes_starts_child_processes():
    # Every child process (probe, parallel, run and analysis workers) is a processes.Child: one
    # place that starts, reads, kills and reaps them.
    starters = set()
    for name, path in modules().items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            if roots & {"subprocess", "multiprocessing"}:
                starters.add(name)
    assert starters == {"autotune.processes"}


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


# What the training step's definition sits below: the backends hand it their parts
# (workload/parts.py), the analyses and the interfaces use it.
ABOVE_THE_WORKLOAD = ("autotune.backends", "autotune.analysis", "autotune.tuner", "autotune.public",
                      "autotune.cli", "autotune.__main__", "api")


def test_the_workload_imports_nothing_above_it():
    offenders = {(m, dep) for m, deps in graph().items() if in_package(m, "autotune.workload")
                 for dep in deps if any(in_package(dep, above) for above in ABOVE_THE_WORKLOAD)}
    assert offenders == set()


def test_the_config_readers_import_nothing_that_computes():
    # A config is read into a request: reading a file needs no backend, analysis or interface.
    offenders = {(m, dep) for m, deps in graph().items() if in_package(m, "autotune.configs")
                 for dep in deps if any(in_package(dep, above) for above in ABOVE_THE_WORKLOAD)}
    assert offenders == set()
    assert "autotune.configs" in graph()["autotune.cli.check"]  # it is what --from-config reads


def private_imports(path: Path) -> set[str]:
    """``module.name`` for every ``from autotune... import _name`` in ``path`` (dunders aside)."""
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and in_package(node.module, "autotune"):
            found |= {f"{node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.endswith("__")}
    return found


def test_the_service_imports_no_private_name_of_the_library():
    offenders = {(m, name) for m, path in modules().items() if is_api(m) for name in private_imports(path)}
    assert offenders == set()


def test_the_benchmarks_import_no_private_name_of_the_library():
    offenders = {(path.name, name) for path in sorted((ROOT / "benchmarks").glob("*.py"))
                 for name in private_imports(path)}
    assert offenders == set()


def test_the_benchmarks_reach_nothing_in_the_tests():
    # A benchmark runs what a user runs: the package, the service, the files in docs/; the tests'
    # fakes and helpers are the tests' own (a stand-in GPU for a search is autotune/testing.py).
    helpers = {"tests"} | {path.stem for path in (ROOT / "tests").glob("*.py")}  # fleet, liveserver, ...
    offenders = set()
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source, str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] in helpers for name in names):
                offenders.add(path.name)
        if any("sys.path" in line and "tests" in line for line in source.splitlines()):
            offenders.add(path.name)
    assert offenders == set()


@functools.cache
def classes(path: Path) -> frozenset[str]:
    """The classes ``path`` defines at its top level. Cached: patched_classes asks it of the same
    modules for every name and attribute it reads."""
    return frozenset(node.name for node in parsed(path).body if isinstance(node, ast.ClassDef))


def patched_classes(source: str | ast.Module, known: dict[str, Path]) -> set[str]:
    """``module.Class`` for every class of another project module that ``source`` changes from
    outside: ``setattr`` / ``delattr`` on it, or an assignment to one of its attributes. The class
    is named as imported (``from m import C``) or through its module (``import m``, ``m.C``)."""
    imported: dict[str, str] = {}  # local name -> module.Class
    imported_modules: dict[str, str] = {}  # local name -> module
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{node.module}.{alias.name}" in known:
                    imported_modules[local] = f"{node.module}.{alias.name}"
                elif node.module in known and alias.name in classes(known[node.module]):
                    imported[local] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    imported_modules[alias.asname or alias.name] = alias.name

    def named_class(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return imported.get(node.id)
        if isinstance(node, ast.Attribute):
            module = ast.unparse(node.value)
            module = imported_modules.get(module, module)
            if module in known and node.attr in classes(known[module]):
                return f"{module}.{node.attr}"
        return None

    targets: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr") and node.args:
            targets.append(node.args[0])
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            found = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            targets += [target.value for target in found if isinstance(target, ast.Attribute)]
    return {name for target in targets if (name := named_class(target)) is not None}


def test_no_module_patches_a_class_of_another():
    known = modules()
    paths = [*known.values(), *sorted((ROOT / "benchmarks").glob("*.py"))]
    offenders = {(str(path.relative_to(ROOT)), name) for path in paths
                 for name in patched_classes(parsed(path), known)}
    assert offenders == set()


@pytest.mark.parametrize(("source", "patched"), [
    ("from autotune.backends.estimate.nf4 import _MatMul4Bit\n"
     "setattr(_MatMul4Bit, 'forward', staticmethod(print))", {"autotune.backends.estimate.nf4._MatMul4Bit"}),
    ("import autotune.backends.estimate.nf4 as nf4\nnf4.EmulatedLinear4bit.forward = print",
     {"autotune.backends.estimate.nf4.EmulatedLinear4bit"}),
    ("from autotune.backends.estimate import nf4\ndelattr(nf4.LoraLinear4bit, 'forward')",
     {"autotune.backends.estimate.nf4.LoraLinear4bit"}),
    ("from autotune.workload.adapters import Adapter\nadapter = Adapter('lora')\nsetattr(adapter, 'r', 8)",
     set()),  # an instance: its own business
    ("from autotune.backends.estimate.nf4 import MATMUL_REGION\nsetattr(MATMUL_REGION, 'x', 1)", set()),
])
def test_patched_classes_finds_patches(source, patched):
    assert patched_classes(source, modules()) == patched


# What a refusal says when the job's own libraries stop it: "Axolotl refuses it", "the patch
# asserts", "the run fails as it starts" (errors.py JobFails: its kind is "job fails").
_JOB_FAILS = re.compile(r"\b(refuses?|raises?|asserts?|fails?|stops as)\b", re.IGNORECASE)


def refusals_of_failing_jobs(source: str | ast.Module) -> list[int]:
    """The lines of ``raise InvalidInput(...)`` whose message says that a library refuses, raises,
    asserts or fails: the real job would fail there, which JobFails says."""
    lines = []
    for node in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "InvalidInput":
            text = " ".join(part.value for part in ast.walk(node.exc)
                            if isinstance(part, ast.Constant) and isinstance(part.value, str))
            if _JOB_FAILS.search(text):
                lines.append(node.lineno)
    return lines


def test_a_refusal_of_a_job_its_libraries_stop_is_job_fails():
    offenders = {(name, line) for name, path in modules().items()
                 for line in refusals_of_failing_jobs(parsed(path))}
    assert offenders == set()


@pytest.mark.parametrize(("source", "found"), [
    ('raise InvalidInput(f"x in {f!r}: Axolotl refuses it")', [1]),
    ('raise InvalidInput("the patch asserts " "its code")', [1]),
    ('raise JobFails("Axolotl refuses it")', []),
    ('raise InvalidInput("seq_len must be > 0")', []),
])
def test_refusals_of_failing_jobs_finds_them(source, found):
    assert refusals_of_failing_jobs(source) == found


def test_the_modules_the_suite_starts_with_exist():
    from conftest import HEAVY_FIRST  # tests/ is on the path (pyproject's pythonpath)

    assert [name for name in HEAVY_FIRST if not (ROOT / name).is_file()] == []
