"""The layout holds: stages import only earlier stages, no import cycles counting every import
(function-level and ``TYPE_CHECKING`` ones included), lazy imports only where named, every
module is in docs/DESIGN.md, and the public API imports."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
from pathlib import Path

import judge

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "judge"
DESIGN = ROOT / "docs" / "DESIGN.md"
# The package's own entry points sit above every stage.
ENTRY_POINTS = {"judge", "judge.__main__", "judge.pytest_plugin"}
# The modules that import judge modules inside functions, on purpose, and why. Every other
# import of a judge module is at the top of its module, where a reader sees it.
LAZY_IMPORTERS = {
    "judge": "the public API imports each name on first use: `import judge` stays light",
    "judge.cli.main": "a command imports only what it runs: `judge --help` stays fast",
    "judge.__main__": "Ctrl-C while the command's modules load is one line, exit 3",
    "judge.cli.admin": "`judge cache` / `judge model` import the cache or weights on use",
    "judge.cli.batch": "`judge batch` imports the Batch API's wire only when it runs",
    "judge.cli.common": "the dry-run printout imports the estimate only when printing one",
    "judge.cli.reports": "`judge compare` / `report` / `history` import their stage on use",
    "judge.providers": "an adapter (and its SDK) is imported only for the kind in use",
    "judge.providers.embedded.provider": "the OpenAI SDK only once the local server is up",
    "judge.report.blocks": "the charts only for a report that draws one",
    "judge.report.checks": (
        "checked before a run's first request: the summary's reader only for a run with a "
        "baseline, the rest of the report stage loads while the first answers are awaited"
    ),
    "judge.report.history": "the Summary it records is a type only: report.checks reads it",
    "judge.cli.baseline": "`judge baseline` imports the summary's reader only when it runs",
    "judge.pytest_plugin": (
        "pytest loads every installed plugin at start: judge's stages only once a test uses "
        "the fixture, assert_relevant or judge_cases"
    ),
}


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_nodes(path: Path, *, top_level_only: bool) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    return [n for n in nodes if isinstance(n, ast.Import | ast.ImportFrom)]


def _imports(
    name: str, path: Path, *, top_level_only: bool, modules: dict[str, Path] | None = None
) -> set[str]:
    """Modules of judge that ``name`` imports (``from judge.x import y`` counts y when y is a
    module, else judge.x; relative imports resolved), wherever the import statement stands
    (inside functions and ``if TYPE_CHECKING:`` too) unless ``top_level_only``."""
    modules = _modules() if modules is None else modules
    package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _import_nodes(path, top_level_only=top_level_only):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("judge")}
            continue
        module = node.module or ""
        if node.level:
            base = name.split(".")[: len(name.split(".")) - node.level + (1 if package else 0)]
            module = ".".join([*base, module] if module else base)
        if not module.startswith("judge"):
            continue
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            found.add(sub if sub in modules else module)
    return {m for m in found if m != name and m in modules}


def _cycles(package: Path = PACKAGE) -> list[str]:
    """Every import cycle among ``package``'s modules, counting every import statement."""
    modules = _modules(package)
    graph = {
        name: _imports(name, path, top_level_only=False, modules=modules)
        for name, path in modules.items()
    }
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def _stage_order() -> list[list[str]]:
    """The stage order written in DESIGN.md's ``stage order`` block, earliest first."""
    text = DESIGN.read_text(encoding="utf-8")
    block = re.search(r"```text stage-order\n(.*?)```", text, re.S)
    assert block, "docs/DESIGN.md has no ```text stage-order block"
    return [line.split("#")[0].split() for line in block.group(1).splitlines() if line.strip()]


def _stage_of(module: str, order: list[list[str]]) -> int:
    rel = module.removeprefix("judge.")
    for rank, names in enumerate(order):
        if any(rel == n or rel.startswith(n + ".") for n in names):
            return rank
    raise AssertionError(f"{module} belongs to no stage in docs/DESIGN.md's stage order")


def test_no_import_goes_to_a_later_stage() -> None:
    order = _stage_order()
    wrong = []
    for name, path in _modules().items():
        if name in ENTRY_POINTS:
            continue
        mine = _stage_of(name, order)
        for target in _imports(name, path, top_level_only=False):
            if target in ENTRY_POINTS:
                wrong.append(f"{name} imports the package entry point {target}")
            elif _stage_of(target, order) > mine:
                wrong.append(f"{name} (stage {mine}) imports {target} (later)")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    cycles = _cycles()
    assert not cycles, "\n".join(cycles)


def test_a_cycle_hidden_inside_a_function_is_found(tmp_path: Path) -> None:
    """A function-level import planted in a copy of the package, closing a circle within one
    stage (judging/units.py back to judging/judge.py, which imports it), is reported."""
    copy = tmp_path / "judge"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert _cycles(copy) == []
    units = copy / "judging" / "units.py"
    units.write_text(
        units.read_text(encoding="utf-8")
        + "\n\ndef _planted() -> None:\n    from judge.judging.judge import Judge  # noqa\n",
        encoding="utf-8",
    )
    assert any("judge.judging.judge" in c and "judge.judging.units" in c for c in _cycles(copy))


def test_lazy_imports_only_where_named() -> None:
    """Imports of judge modules inside functions or ``if TYPE_CHECKING:`` only in the modules
    :data:`LAZY_IMPORTERS` names, each for its reason."""
    modules = _modules()
    hidden = sorted(
        name
        for name, path in modules.items()
        if _imports(name, path, top_level_only=False, modules=modules)
        - _imports(name, path, top_level_only=True, modules=modules)
        and name not in LAZY_IMPORTERS
    )
    assert not hidden, f"imports inside functions or TYPE_CHECKING blocks: {hidden}"
    stale = sorted(set(LAZY_IMPORTERS) - set(modules))
    assert not stale, f"LAZY_IMPORTERS names modules that are gone: {stale}"


def test_every_module_is_in_the_design_doc() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    missing = [
        str(path.relative_to(PACKAGE))
        for path in _modules().values()
        if str(path.relative_to(PACKAGE)) not in text
    ]
    assert not missing, f"modules missing from docs/DESIGN.md: {missing}"


def test_every_folder_says_what_it_owns_and_may_import() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert len(doc) > 80, f"{init}: the docstring should say what the folder owns"
        if init.parent != PACKAGE:
            assert "import" in doc.lower(), f"{init}: the docstring should say what it imports"


def test_every_public_name_imports() -> None:
    assert judge.__all__, "judge/__init__.py has an empty __all__"
    for name in judge.__all__:
        assert getattr(judge, name, None) is not None, name
    fresh = importlib.import_module("judge")
    assert {"Judge", "load_config", "JudgeError", "MetricPolicy", "Summary"} <= set(fresh.__all__)
    assert set(fresh.__all__) == {*fresh._EXPORTS, "__version__"}


def test_modules_stay_small() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 800
    }
    assert not big, f"modules over 800 lines: {big}"


def test_long_functions_say_why() -> None:
    """A function over 60 lines says in its docstring why it is not split."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if size > 60 and "long because" not in doc.lower():
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size})")
    assert not long, "\n".join(long)


def test_a_run_reaches_its_first_request_without_the_report_stage() -> None:
    """What ``judge run`` imports before it sends (the command, the run's stages, the checks
    the report stage makes before paying) leaves out the summary and the report's renderers
    (and the analyses only they read): those load in a thread while the first answers are
    awaited."""
    import subprocess
    import sys

    probe = (
        "import sys, judge.cli.main, judge.report.checks, judge.run.runner, "
        "judge.run.preflight, judge.run.batch, judge.run.estimate, judge.cli.ray\n"
        "judge.cli.main.build_parser()\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith("
        "('judge.analysis.health', 'judge.analysis.stability', 'judge.report.summary', "
        "'judge.report.document', 'judge.report.finish')))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == ""
