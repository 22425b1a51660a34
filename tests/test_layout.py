"""The package's layout is its data path: no module imports one that imports it back, and the
measuring leaves import nothing above them."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "attnbench"


def imports() -> dict[str, set[str]]:
    """module -> the attnbench modules it imports (at any depth of the file)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("attnbench"):
                    found.add(node.module)
                    found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("attnbench"))
        graph[name] = found
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_no_import_cycles():
    graph = imports()
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for dep in sorted(graph[module]):
            if dep.startswith(module + "."):  # a package importing its own submodule
                continue
            assert state.get(dep) != 1, " -> ".join([*path, dep])
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_measure_modules_import_nothing_above_them():
    allowed = ("attnbench.measure", "attnbench.case", "attnbench.errors", "attnbench.masks")
    for module, deps in imports().items():
        if module.startswith("attnbench.measure"):
            above = [d for d in deps if not d.startswith(allowed)]
            assert not above, f"{module} imports {above}"


def test_no_impl_imports_the_harness_that_runs_it():
    """An impl needs the plugin API (registry, case, masks, module_layout, ...), never run/:
    the harness imports the impls, not the other way round."""
    for module, deps in imports().items():
        if module.startswith("attnbench.impls"):
            run = [d for d in deps if d.startswith("attnbench.run")]
            assert not run, f"{module} imports {run}"


def test_no_report_module_imports_an_impl():
    """An impl module registers impls when imported; the report reads rows, not impls."""
    for module, deps in imports().items():
        if module.startswith("attnbench.report"):
            impls = [d for d in deps if d.startswith("attnbench.impls")]
            assert not impls, f"{module} imports {impls}"


# Size limits: one concern per function and per module, in the whole package but the Triton
# kernels (a kernel is one long function by nature: its loop must stay in one jit body)
KERNEL_FOLDERS = ("impls/triton_flash", "impls/triton_flash_fa2")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def functions(path: Path) -> dict[str, int]:
    """qualified name -> lines (decorators and docstring included) of every function."""
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out[name] = child.end_lineno - start + 1
                visit(child, name + ".")

    visit(ast.parse(path.read_text()), "")
    return out


def sized_modules() -> list[Path]:
    return sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if not p.relative_to(PACKAGE).as_posix().startswith(tuple(f"{k}/" for k in KERNEL_FOLDERS))
    )


def test_row_measure_reads_as_the_loop():
    lines = functions(PACKAGE / "run" / "row.py")["measure"]
    assert lines <= 45, f"run/row.py::measure is {lines} lines (at most 45)"


def test_no_function_over_the_limit():
    long = [
        f"{path.relative_to(PACKAGE)}::{name} ({n} lines)"
        for path in sized_modules()
        for name, n in functions(path).items()
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_module_over_the_limit():
    long = [
        f"{path.relative_to(PACKAGE)} ({n} lines)"
        for path in sized_modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"over {MAX_MODULE_LINES} lines: {long}"


MAX_RUN_MODULE_LINES = 300  # run/: the orchestration reads in small pieces


def test_run_modules_are_small():
    long = [
        f"{path.name} ({n} lines)"
        for path in (PACKAGE / "run").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_RUN_MODULE_LINES
    ]
    assert not long, f"run/ modules over {MAX_RUN_MODULE_LINES} lines: {long}"


def test_the_worker_state_machine_is_written_once():
    """One worker (run/worker.py) for every transport: a case that cannot be prepared is
    named in one place."""
    said = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        for _ in range(path.read_text().count("while preparing the case"))
    ]
    assert said == ["run/worker.py"], said


CLI_MAY_IMPORT = (
    "attnbench.run",
    "attnbench.report",
    "attnbench.store",
    "attnbench.repro",
    "attnbench.plugins",
    "attnbench.options",
    "attnbench.registry",
    "attnbench.errors",
)


def test_cli_only_parses_and_dispatches():
    """cli.py imports only the rooms that plan, run, store and report, and its sweep command
    stays a dispatcher (the work is in run/plan.py, run/executors.py, store/rundir.py)."""
    deps = imports()["attnbench.cli"] - {"attnbench"}  # "from attnbench import registry"
    above = [d for d in deps if not d.startswith(CLI_MAY_IMPORT)]
    assert not above, f"attnbench.cli imports {above}"
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    sweep = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "sweep")
    lines = sweep.end_lineno - sweep.lineno + 1
    assert lines <= 40, f"cli.sweep has {lines} lines (at most 40)"


def test_run_folder_file_names_are_spelled_only_in_rundir():
    """Every file name of a run folder is declared once, in store/rundir.py's RunDir."""
    from attnbench.store.rundir import RunDir

    names = [v for k, v in vars(RunDir).items() if k.isupper() and "{" not in v]
    for path in PACKAGE.rglob("*.py"):
        if path.name == "rundir.py":
            continue
        code = [
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and not node.value.lstrip().startswith(("\n", '"'))
        ]
        for name in names:
            spelled = [c for c in code if c == name or c == f"/{name}"]
            assert not spelled, f"{path.relative_to(PACKAGE)} spells {name!r}: use RunDir"


def _files_saying(word: str) -> set[str]:
    """The package's modules outside masks/ and impls/ whose text has ``word``."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if not path.relative_to(PACKAGE).as_posix().startswith(("masks/", "impls/"))
        and word in path.read_text()
    }


def test_mask_kinds_follow_one_protocol():
    """Every mask kind is a layout passed as one Mask: no module outside masks/ and impls/
    handles key padding's lengths, and a window is named only where it is data: its column
    (dims.py), its --window alias (options.py, and the grid field it fills in spec.py), model
    presets that have one (models.py) and the conformance grid (testing.py)."""
    assert _files_saying("kv_lens") == set()
    allowed = {"dims.py", "options.py", "spec.py", "models.py", "testing.py"}
    assert _files_saying("window") <= allowed, _files_saying("window") - allowed


def test_only_the_plan_reads_the_raw_options():
    """The options dict (cli's resolve_options) is read once, by the plan: cli.py hands it to
    Target and Plan, which turn it into typed fields; nothing below them takes ``opts``."""
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "impls":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg) and node.arg == "opts":
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers == {"run/plan.py", "run/target.py"}, readers
