"""The package's layout is its data path: no module imports one that imports it back, the
measuring leaves import nothing above them, one worker drives a row's steps and a row is
filled only where its columns are known.

Every guard is a function from the package's code to its violations (tests/structure.py reads
the code), so each is run twice: on the package, where it finds none, and on copies with
violations planted (``PLANTED``), each of which it must catch. The guards read structure
(imports in every form, the objects they are about, where a value comes from), never a local
name a rename could change; a guard whose subject is gone fails rather than passes."""

import ast
import inspect
import json
import re
import typing
from pathlib import Path

import pytest
from structure import (
    PACKAGE,
    Code,
    aliases,
    calls,
    graph,
    imported,
    parse,
    planted,
    refers,
    row_changes,
    sources,
)


def imports(code: Code | None = None) -> dict[str, set[str]]:
    """module -> the attnbench modules it imports (any form, any depth: structure.graph)."""
    return graph(code)


def path_of(module: str) -> str:
    """attnbench.run.executing.worker -> run/executing/worker.py (a package: its __init__.py)."""
    rel = module.removeprefix("attnbench").lstrip(".").replace(".", "/")
    return f"{rel}/__init__.py" if (PACKAGE / rel / "__init__.py").is_file() else f"{rel}.py"


def cycles(code: Code | None = None) -> list[str]:
    """Import circles between modules (a package importing its own submodule aside)."""
    deps, state, found = imports(code), {}, []

    def visit(module, path):
        state[module] = 1
        for dep in sorted(deps[module]):
            if dep.startswith(module + "."):
                continue
            if state.get(dep) == 1:
                found.append(" -> ".join([*path, dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(deps):
        if module not in state:
            visit(module, [module])
    return found


def test_no_import_cycles():
    assert not cycles()


# The house's floors, ground first, declared once: a room (a top-level module or a folder of
# attnbench/) imports only rooms on floors below its own, so no arrow goes up or sideways and
# the rooms cannot form a circle. A new room is placed here before it can be imported.
FLOORS = (
    ("errors", "seeds", "heads", "checkout"),
    ("masks", "module_layout"),
    ("dims",),
    ("case",),
    ("store", "declarations"),  # files and formats; what an impl declares
    ("measure", "models", "registry"),
    ("impls", "plugins"),
    ("spec",),
    ("options",),
    ("run", "report", "repro"),
    ("cli", "testing"),
    ("__main__", "__init__"),
)


def room(module: str) -> str:
    """attnbench.run.sweep -> run; attnbench.cli -> cli; attnbench (the package) -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def room_arrows(code: Code | None = None) -> dict[tuple[str, str], list[str]]:
    """(room, room it imports) -> the modules whose imports draw that arrow."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, deps in imports(code).items():
        for dep in deps:
            if room(dep) != room(module) and dep != "attnbench":
                arrows.setdefault((room(module), room(dep)), []).append(f"{module} -> {dep}")
    return arrows


def test_every_room_is_on_a_floor():
    floors = [r for floor in FLOORS for r in floor]
    assert len(floors) == len(set(floors)), "a room is declared on two floors"
    rooms = {room(m) for m in imports()}
    assert rooms == set(floors), f"undeclared: {rooms - set(floors)}, gone: {set(floors) - rooms}"


def arrows_up(code: Code | None = None) -> list[str]:
    """Every import between rooms that does not go down the declared floors: the arrow, the
    modules that draw it."""
    floor_of = {r: n for n, floor in enumerate(FLOORS) for r in floor}
    arrows = room_arrows(code)
    return [
        f"{a} (floor {floor_of[a]}) imports {b} (floor {floor_of[b]}): {sorted(arrows[a, b])[:3]}"
        for a, b in sorted(arrows)
        if floor_of[b] >= floor_of[a]
    ]


def test_no_arrow_goes_up_or_sideways():
    """Every import between rooms goes down the declared floors; a failure names the arrow,
    the modules that draw it, and the floors the imports give each room (one above the
    highest room it imports), from which the fix is read."""
    arrows, computed = room_arrows(), {}

    def height(r: str, path: tuple = ()) -> int:
        assert r not in path, f"a circle of rooms: {' -> '.join([*path, r])}"
        if r not in computed:
            computed[r] = 1 + max((height(b, (*path, r)) for a, b in arrows if a == r), default=-1)
        return computed[r]

    wrong = arrows_up()
    floors = [r for floor in FLOORS for r in floor]
    assert not wrong, "\n".join([*wrong, f"floors by imports: {[(r, height(r)) for r in floors]}"])


def store_imports_out(code: Code | None = None) -> list[str]:
    """store/ holds files and formats: it imports the rooms below it and itself, nothing that
    measures, probes the machine, loads code or builds a command line."""
    store = next(n for n, floor in enumerate(FLOORS) if "store" in floor)
    below = {r for floor in FLOORS[:store] for r in floor} | {"store"}
    return [
        f"{module} imports {dep}"
        for module, deps in imports(code).items()
        if room(module) == "store"
        for dep in deps
        if room(dep) not in below
    ]


def test_store_only_stores():
    assert not store_imports_out()


def library_names(code: Code | None = None) -> list[str]:
    """A module named like a library (impls/xformers.py beside ``import xformers``) is a trap:
    a reader, or a tool, takes the library's import for the sibling."""
    code, folders = code or sources(), {}
    for where, text in code.items():
        folders.setdefault(str(Path(where).parent), {})[Path(where).stem] = text
    out = []
    for folder, modules in folders.items():
        libraries = set()
        for stem, text in modules.items():
            found = {m.split(".")[0] for m in imported(f"{folder}/{stem}.py", text)}
            libraries |= found - {stem, "attnbench"}  # a module may import its namesake
        out += [f"{folder}: {name}" for name in sorted(set(modules) & libraries)]
    return out


def test_no_module_is_named_after_a_library_its_folder_imports():
    assert not library_names()


MEASURE_MAY_IMPORT = ("attnbench.measure", "attnbench.case", "attnbench.errors", "attnbench.masks")
MEASURE_MAY_IMPORT += ("attnbench.store.env",)  # env.json's GPU-state field names (clocks)


def imports_out(code: Code | None = None) -> list[str]:
    """The imports that leave a room's bounds: the measuring leaves import nothing above them;
    an impl needs the plugin API, never run/ (the harness imports the impls, not the other
    way round); an impl module registers impls when imported, and the report reads rows,
    not impls."""
    out = []
    for module, deps in imports(code).items():
        for dep in deps:
            if module.startswith("attnbench.measure") and not dep.startswith(MEASURE_MAY_IMPORT):
                out.append(f"{module} imports {dep}: measure/ is a leaf")
            if module.startswith("attnbench.impls") and dep.startswith("attnbench.run"):
                out.append(f"{module} imports {dep}: an impl never imports its harness")
            if module.startswith("attnbench.report") and dep.startswith("attnbench.impls"):
                out.append(f"{module} imports {dep}: the report reads rows, not impls")
    return out


def test_measure_impls_and_report_import_within_their_bounds():
    assert not imports_out()


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


def test_the_worker_reads_as_the_loop():
    from attnbench.run.executing.worker import Worker

    lines = functions(PACKAGE / path_of(Worker.__module__))["Worker.run_case"]
    assert lines <= 45, f"run/executing/worker.py::Worker.run_case is {lines} lines (at most 45)"


def _mentions(hint, cls) -> bool:
    return hint is cls or any(_mentions(a, cls) for a in typing.get_args(hint))


def step_functions() -> list:
    """What the one driver drives: the functions that take or give a checked impl (the state
    of one impl between its steps: run/measuring/row.py's ``Checked``), found from their
    signatures."""
    from attnbench.run.measuring import row

    module = inspect.getmodule(row.Checked)
    return [
        fn
        for fn in vars(module).values()
        if inspect.isfunction(fn)
        and fn.__module__ == module.__name__
        and any(_mentions(h, row.Checked) for h in typing.get_type_hints(fn).values())
    ]


def second_drivers(code: Code | None = None) -> list[str]:
    """A row's steps are driven by the worker alone, through the server: the step functions
    are called only in the server's module (steps.Steps), one step per handler; anything
    else that calls one, or a handler that calls two, is a second driver."""
    from attnbench.run.executing.steps import Steps

    steps, server = step_functions(), path_of(Steps.__module__)
    assert len(steps) >= 3, f"the step functions are gone: {steps}"
    out = []
    for where, text in (code or sources()).items():
        names = {
            n: f.__name__ for f in steps for n in aliases(where, text, f.__module__, f.__name__)
        }
        called: dict[str, set[str]] = {}
        for fn, name in calls(where, text):
            if name in names:
                called.setdefault(fn, set()).add(names[name])
        for fn, which in sorted(called.items()):
            if where != server:
                out.append(f"{where}::{fn} calls {sorted(which)}")
            elif len(which) > 1:
                out.append(f"{where}::{fn} drives {sorted(which)} in one handler")
    return out


def test_one_driver_runs_the_steps():
    """No second loop over the steps of one impl, and the test API measures through the
    worker."""
    from attnbench.run.executing.worker import Worker

    assert not second_drivers()
    assert Worker.__module__ in imports()["attnbench.testing"]


# who may raise the worker's failure (the transports, and the worker itself) and handle it
# (the worker; the Ray actor, which turns one into a message back to it; the pool, which
# leaves out an executor lost while it describes its device, before any row)
FAILURE_RAISERS = {
    "run/executing/local.py",
    "run/executing/ray_executor.py",
    "run/executing/worker.py",
}
FAILURE_HANDLERS = {
    "run/executing/worker.py",
    "run/executing/ray_executor.py",
    "run/executing/executors.py",
}


def worker_written_twice(code: Code | None = None) -> list[str]:
    """One worker for every transport: one class runs a case's steps; the transports raise
    the worker's failure and only the worker handles it. The failure and the runner's
    method are the objects themselves, by whatever name a module imports them: a rename
    follows, and a guard that finds no raiser or no handler fails instead of passing."""
    from attnbench.run.executing.worker import Worker, WorkerFailed

    runners, raisers, handlers = set(), set(), set()
    for where, text in (code or sources()).items():
        names = aliases(where, text, WorkerFailed.__module__, WorkerFailed.__name__)
        for node in ast.walk(parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if Worker.run_case.__name__ in methods:
                    runners.add(f"{where}::{node.name}")
            elif isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                raisers |= {where} if refers(exc, names) else set()
            elif isinstance(node, ast.ExceptHandler) and node.type is not None:
                types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                handlers |= {where} if any(refers(t, names) for t in types) else set()
    out = [] if runners == {f"{path_of(Worker.__module__)}::Worker"} else [f"runners {runners}"]
    out += [f"{w} raises {WorkerFailed.__name__}" for w in sorted(raisers - FAILURE_RAISERS)]
    out += [f"{w} handles {WorkerFailed.__name__}" for w in sorted(handlers - FAILURE_HANDLERS)]
    if not raisers or not handlers:
        out.append(f"nothing raises or handles {WorkerFailed.__name__}: the rule reads nothing")
    return out


def test_the_worker_state_machine_is_written_once():
    assert not worker_written_twice()


def _row_makers() -> tuple[str, tuple[str, ...], set[str]]:
    """(the field of the record a row travels in, the functions that make a row, the modules
    allowed to fill one), from the objects themselves: the row maker (failed.base_row), the
    measuring steps (row.py), the completer (complete.py), and the store's lines of the files
    a row is copied into (samples.csv, kernels.csv)."""
    from attnbench.case import Case
    from attnbench.registry import Impl
    from attnbench.run.complete import Completer
    from attnbench.run.measuring.failed import base_row, failed_row
    from attnbench.run.measuring.row import finish
    from attnbench.store.results import sample_lines
    from attnbench.store.schema import COLUMNS

    case = Case(batch=1, heads=1, kv_heads=1, seq_q=8, seq_kv=8, head_dim=8)
    made = failed_row(Impl("x", None), case, "error", "a reason")
    field = next(f for f in made._fields if list(getattr(made, f) or ()) == list(COLUMNS))
    fillers = {base_row, finish, Completer, sample_lines}
    return (
        field,
        (f"{base_row.__module__}.{base_row.__name__}",),
        {path_of(f.__module__) for f in fillers},
    )


def rows_filled_elsewhere(code: Code | None = None) -> list[str]:
    """A row's columns are filled where they are known and nowhere else: a row is made in
    run/measuring/failed.py, measured in run/measuring/row.py's steps (the speedup too: the worker
    hands the finish step the baseline's rounds), completed in run/complete.py (what ran it, the
    run, the machine's speed), and copied into the lines of samples.csv and kernels.csv by the
    store; any other module that makes a row mapping from one or changes one, in any form
    (structure.row_changes), fills it behind their back."""
    field, makers, fillers = _row_makers()
    changes = row_changes(code or sources(), field, makers)
    return [c for c in changes if c.split(":")[0] not in fillers]


def test_a_row_is_filled_where_its_columns_are_known():
    """And the writer only writes: it asks no impl anything and measures nothing."""
    assert not rows_filled_elsewhere()
    from attnbench.run.writer import Writer

    deps = imports()[Writer.__module__]
    asks = [d for d in deps if d.startswith(("attnbench.measure", "attnbench.registry"))]
    assert not asks, f"{path_of(Writer.__module__)} imports {asks}"


REGISTRY_MUST_NOT_IMPORT = ("importlib.metadata", "pkgutil")  # discovery is plugins.py's


def registry_loads(code: Code | None = None) -> list[str]:
    """The registry registers; finding and loading plugins is plugins.py's: registry.py
    imports no discovery machinery, in any form."""
    text = (code or sources())["registry.py"]
    found = imported("registry.py", text)
    return sorted(m for m in found if m.startswith(REGISTRY_MUST_NOT_IMPORT))


def test_impl_reasons_is_a_tuple_of_small_checks():
    """Impl.reasons asks each capability's check in turn (registry.CHECKS), each a few lines
    and each its own rule (none an adapter to a private method of Impl), and plugin loading
    and discovery live in plugins.py, not in the registry."""
    from attnbench import registry

    sizes = functions(PACKAGE / "registry.py")
    assert sizes["Impl.reasons"] <= 12, sizes["Impl.reasons"]
    long = {c.__name__: sizes[c.__name__] for c in registry.CHECKS if sizes[c.__name__] > 10}
    assert not long, f"checks over 10 lines: {long}"
    private = {n for n in vars(registry.Impl) if n.startswith("_") and not n.startswith("__")}
    assert not private - {"_abc_impl"}, f"Impl's private methods: {private}"
    assert not registry_loads(), f"registry.py imports {registry_loads()}"


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


# run/'s own rooms, ground first: a row measured, the worker that executes its steps, the
# sweep loop (run/ itself, ""), and the plan that starts it; each imports only those below
RUN_FLOORS = ("measuring", "executing", "", "planning")


def run_arrows_up(code: Code | None = None) -> list[str]:
    """run/'s folders import one another only downward (RUN_FLOORS)."""

    def inner(module: str) -> str:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 else ""

    out = []
    for module, deps in imports(code).items():
        if room(module) != "run":
            continue
        for dep in deps:
            if room(dep) == "run" and RUN_FLOORS.index(inner(dep)) > RUN_FLOORS.index(
                inner(module)
            ):
                out.append(f"{module} imports {dep}: run/{inner(dep)} is above run/{inner(module)}")
    return out


def test_run_folders_import_downward():
    from attnbench.run import sweep

    folders = {p.parent.name for p in (PACKAGE / "run").rglob("*.py") if p.parent.name != "run"}
    assert folders == set(RUN_FLOORS) - {""}, folders
    assert sweep.__name__.count(".") == 2, "the sweep loop moved out of run/"
    assert not run_arrows_up()


# report/'s steps, as the data flows: rows read into an analysis, decisions from it, then
# rendered as text or drawn; report/ itself ("") assembles one analysis and writes a report;
# compare/ sets two runs side by side. Each step imports only the steps below it.
REPORT_FLOORS = (("analyse",), ("decide",), ("render", "plot"), ("",), ("compare",))


def report_step(module: str) -> int:
    """attnbench.report.plot.plots (or .plot) -> the floor of plot/ in REPORT_FLOORS; a module
    of report/ itself (attnbench.report.analysis) -> the floor of ""."""
    step = (module.split(".") + [""])[2]
    floors = [i for i, floor in enumerate(REPORT_FLOORS) if step in floor]
    return floors[0] if floors else REPORT_FLOORS.index(("",))


def report_arrows_up(code: Code | None = None) -> list[str]:
    """report/'s steps import one another only downward (REPORT_FLOORS)."""
    return [  # (a step's own package, attnbench.report.plot, is the step itself)
        f"{module} imports {dep}: a later step of the report"
        for module, deps in imports(code).items()
        if room(module) == "report"
        for dep in deps
        if room(dep) == "report" and report_step(dep) > report_step(module)
    ]


def test_report_steps_import_downward():
    folders = {p.parent.name for p in (PACKAGE / "report").rglob("*.py")} - {"report"}
    assert folders == {s for floor in REPORT_FLOORS for s in floor} - {""}, folders
    assert not report_arrows_up()


# what derives a table from a frame: grouping, filtering, joining, ranking (render/ and plot/
# show what the analysis derived, they derive nothing themselves)
FRAME_VERBS = frozenset(
    "groupby query filter where mask drop_duplicates pivot pivot_table value_counts merge "
    "dropna nlargest nsmallest idxmax idxmin".split()
)
MASK_VERBS = frozenset("isin eq ne gt lt ge le between notna isna notnull isnull".split())
ROW_READERS = ("ok_rows", "is_ok", "agreeing", "noisy", "contended", "with_series")
SHOWING = ("report/render/", "report/plot/")


def _a_mask(node: ast.AST) -> bool:
    """Whether an index expression selects rows by a condition (x[a > b], x[~m], x[m1 & m2],
    x[s.isin(...)], x.loc[s.eq(...), "c"])."""
    if isinstance(node, ast.Tuple):
        return any(_a_mask(e) for e in node.elts)
    if isinstance(node, (ast.Compare, ast.BoolOp)):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not)):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MASK_VERBS
    )


def _annotations(tree: ast.Module) -> list[ast.AST]:
    """Every type annotation of a module (arguments, returns, annotated assignments)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation:
            out.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            out.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            out.append(node.annotation)
    return out


def frames_derived_when_shown(code: Code | None = None) -> list[str]:
    """Where render/ or plot/ groups, filters, joins or ranks a frame, or reads rows by
    derived's rules (ok rows, series, contended, ...): that belongs in the analysis."""
    code = code or sources()
    out = []
    for where, text in code.items():
        if not where.startswith(SHOWING):
            continue
        readers = {
            a
            for n in ROW_READERS
            for a in aliases(where, text, "attnbench.report.analyse.derived", n)
        }
        tree = parse(text)
        hints = {id(n) for a in _annotations(tree) for n in ast.walk(a)}
        for node in ast.walk(tree):
            if id(node) in hints:  # dict[str, str | None] is a type, not a mask
                continue
            line = f"{where}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in FRAME_VERBS:
                    out.append(f"{line} .{node.func.attr}()")
            if isinstance(node, ast.Call) and refers(node.func, readers):
                out.append(f"{line} {ast.unparse(node.func)}()")
            if isinstance(node, ast.Subscript) and _a_mask(node.slice):
                out.append(f"{line} [{ast.unparse(node.slice)[:40]}]")
    return out


def test_render_and_plot_derive_nothing():
    assert not frames_derived_when_shown(), "\n".join(frames_derived_when_shown())


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
    stays a dispatcher (the work is in run/planning/plan.py, run/executing/executors.py,
    store/rundir.py)."""
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


# who may import the interval geometry: the mask kinds, the impls that draw it, case.py (which
# re-exports its pair counts) and measure/diagnose.py (which shifts a window by one)
INTERVAL_IMPORTERS = ("attnbench.masks", "attnbench.impls", "attnbench.case")
INTERVAL_IMPORTERS += ("attnbench.measure.diagnose",)


def test_mask_kinds_follow_one_protocol():
    """Every mask kind is a layout passed as one Mask: outside masks/ and impls/ no module
    reads a mask's layout views (``kv_lens``, ``window``), and the interval geometry is
    imported only where it is drawn."""
    from attnbench.masks import Mask

    assert all(hasattr(Mask, view) for view in ("kv_lens", "window")), "the views are gone"
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith(("masks/", "impls/")):
            continue
        views = [
            f"{where}:{n.lineno} .{n.attr}"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and n.attr in ("kv_lens", "window")
        ]
        assert not views, views
    for module, deps in imports().items():
        if "attnbench.masks.interval" in deps:
            assert module.startswith(INTERVAL_IMPORTERS), f"{module} imports masks.interval"


def test_only_the_plan_reads_the_raw_options():
    """The options dict (cli's ``resolve_options``) is read once, by the plan: wherever it is
    made it is only handed to a ``from_options`` of run/planning/plan.py or run/planning/target.py,
    and those hand it on to nothing but another ``from_options`` there."""
    readers, tracked = {"run/planning/plan.py", "run/planning/target.py"}, set()
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and "resolve_options" in ast.unparse(node.value):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if where in readers and isinstance(node, ast.FunctionDef):
                if node.name == "from_options":
                    names |= {a.arg for a in node.args.args[1:2]}
        tracked |= names
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Name) and node.id in names):
                continue
            if isinstance(node.ctx, ast.Store):
                continue
            up = parents[node]
            if isinstance(up, ast.Call) and node in up.args:
                assert getattr(up.func, "attr", None) == "from_options", (
                    f"{where}:{node.lineno} hands the options to {ast.unparse(up.func)}"
                )
            else:
                assert where in readers, f"{where}:{node.lineno} reads the options"
    assert tracked, "no options dict is made or read: the rule reads nothing"


def test_the_transport_protocol_is_whole():
    """``where`` and ``replace`` are part of the transport protocol: every transport has them,
    and no module asks with getattr whether a transport or an executor has them."""
    from attnbench.run.executing.worker import Transport

    assert "where" in Transport.__annotations__ and "replace" in vars(Transport)
    transports = []
    for path in (PACKAGE / "run").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                name = node.args[1] if len(node.args) > 1 else None
                assert not (
                    isinstance(name, ast.Constant) and name.value in ("where", "replace")
                ), f"{path.relative_to(PACKAGE)}:{node.lineno} asks getattr for {name.value!r}"
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            if "call" in methods and "host" in _attributes_set(cls):  # a transport
                transports.append(cls.name)
                assert "replace" in methods, (
                    f"{path.relative_to(PACKAGE)}::{cls.name} has no replace()"
                )
                assert "where" in _attributes_set(cls), (
                    f"{path.relative_to(PACKAGE)}::{cls.name}: no where"
                )
    assert {"InProcess", "Subprocess", "RayActor"} <= set(transports), transports


def _attributes_set(cls: ast.ClassDef) -> set[str]:
    """The attributes a class's code assigns (``self.x = ...``, ``self.x, self.y = ...``)."""
    return {
        t.attr
        for node in ast.walk(cls)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for t in ast.walk(target)
        if isinstance(t, ast.Attribute)
    }


LAYOUT_MAP = PACKAGE.parent / "docs" / "layout.md"
SUBFOLDERS = ("run", "store", "measure", "report", "masks", "impls")  # each has its heading
SUBFOLDERS += tuple(f"run/{f}" for f in ("planning", "executing", "measuring"))
SUBFOLDERS += tuple(f"report/{f}" for f in ("analyse", "decide", "render", "plot", "compare"))


def test_the_layout_map_names_every_module():
    """docs/layout.md names every module (and kernel folder) of each folder of attnbench/
    under that folder's heading, and nothing that is not there; its floors are FLOORS."""
    text = LAYOUT_MAP.read_text()
    sections = re.split(r"^### `attnbench/([\w/]*?)/?`$", text, flags=re.M)
    named = {
        folder: set(re.findall(r"`(\w+\.py|\w+/)`", body))
        for folder, body in zip(sections[1::2], sections[2::2])
    }
    assert set(named) == {"", *SUBFOLDERS}, sorted(named)
    for key in named:
        folder = PACKAGE / key
        there = {p.name for p in folder.glob("*.py")}
        there |= {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
        there -= {f"{f}/" for f in SUBFOLDERS}
        assert named[key] == there, (key or "attnbench/", named[key] ^ there)
    floors = re.search(r"^## Floors$(.*?)^## ", text, flags=re.M | re.S).group(1)
    lines = re.findall(r"^\d+\. .*$", floors, flags=re.M)
    assert [tuple(re.findall(r"`(\w+)`", line)) for line in lines] == list(FLOORS)


def test_the_grid_builds_cases_from_the_dimensions():
    """spec.py makes each case from its point in the grid, one value per dimension of DIMS
    (``Case(**{name: point[name] ...})``), never by spelling the dimensions as keywords: a
    dimension the grid does not set is a KeyError, not a silent default."""
    from attnbench.case import Case

    tree = ast.parse((PACKAGE / "spec.py").read_text())
    spelled = [
        f"spec.py:{n.lineno} Case({', '.join(k.arg for k in n.keywords if k.arg)})"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == Case.__name__
        and any(k.arg for k in n.keywords)
    ]
    assert not spelled, spelled
    made = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and refers(n.func, {Case.__name__})
    ]
    assert made, "spec.py makes no Case: the rule reads nothing"


def test_the_test_order_comes_from_measured_durations():
    """tests/conftest.py hands out the longest test files first by their measured seconds
    (durations.json, or the last run's), not by a list of names kept by hand; durations.json
    names only test files that exist."""
    tests = PACKAGE.parent / "tests"
    spelled = [
        n.value
        for n in ast.walk(ast.parse((tests / "conftest.py").read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(".py")
    ]
    assert not spelled, f"tests/conftest.py names test files: {spelled}"
    recorded = json.loads((tests / "durations.json").read_text())
    assert recorded and all((tests.parent / name).is_file() for name in recorded), sorted(recorded)


# -- each guard catches what it guards against ---------------------------------------------

_WRITE = "            self._out.write(row)\n"
_DRIVER = """

def _planted_driver(checked, group):
    {time}(group, 0)
    return {finish}(checked, [], FAST)
"""

# (guard, its violation planted: module, text replaced, its replacement); a plant may be a
# list of them, for a violation in two places. The review's three (G1, G2, G4) first.
PLANTED = {
    "G1 ImportFrom of discovery in registry.py": (
        registry_loads,
        (
            "registry.py",
            "import functools\n",
            "import functools\nfrom importlib.metadata import entry_points\n",
        ),
    ),
    "G2 a row copied with a column changed in the writer": (
        rows_filled_elsewhere,
        (
            "run/writer.py",
            _WRITE,
            _WRITE.replace("(row)", '({**row, "host": row.get("host") or "planted"})'),
        ),
    ),
    "G4 a second driver of time_together and finish in testing.py": (
        second_drivers,
        [
            (
                "testing.py",
                "from attnbench.run.executing.local import InProcess\n",
                "from attnbench.run.measuring import row\n"
                "from attnbench.run.executing.local import InProcess\n",
            ),
            ("testing.py", "", _DRIVER.format(time="row.time_together", finish="row.finish")),
        ],
    ),
    "discovery imported as a module alias": (
        registry_loads,
        (
            "registry.py",
            "import functools\n",
            "import functools\nimport importlib.metadata as md\n",
        ),
    ),
    "discovery imported from its parent": (
        registry_loads,
        ("registry.py", "import functools\n", "import functools\nfrom importlib import metadata\n"),
    ),
    "discovery imported by importlib.import_module": (
        registry_loads,
        ("registry.py", "", '\n\ndef _planted():\n    return importlib.import_module("pkgutil")\n'),
    ),
    "G3 a lazy import of measure/ in store/": (
        store_imports_out,
        (
            "store/results.py",
            "",
            "\n\ndef _planted():\n    from attnbench.measure import anchor  # noqa\n",
        ),
    ),
    "a relative import going up from store/": (
        arrows_up,
        ("store/results.py", "import csv\n", "import csv\nfrom ..measure import anchor\n"),
    ),
    "an impl importing run/ relatively": (
        imports_out,
        ("impls/naive.py", "", "\nfrom ..run.measuring import row\n"),
    ),
    "measure/ importing run/ as an alias": (
        imports_out,
        ("measure/timing.py", "", "\nimport attnbench.run.measuring.row as r\n"),
    ),
    "a circle of two modules, one relative": (
        cycles,
        [
            ("run/planted_a.py", "", "from attnbench.run import planted_b\n"),
            ("run/planted_b.py", "", "from .planted_a import x\n"),
        ],
    ),
    "a module named after a library its folder imports": (
        library_names,
        ("run/measuring/torch.py", "", '"""planted"""\n'),
    ),
    "a row's measuring importing the worker that executes it": (
        run_arrows_up,
        ("run/measuring/row.py", "", "\nfrom attnbench.run.executing import worker\n"),
    ),
    "the worker importing the plan": (
        run_arrows_up,
        ("run/executing/worker.py", "", "\nfrom attnbench.run.planning.plan import Plan\n"),
    ),
    "a render module filtering rows by a comparison": (
        frames_derived_when_shown,
        ("report/render/markdown.py", "", '\n\ndef _planted(df):\n    return df[df["x"] == 1]\n'),
    ),
    "a figure grouping the frame": (
        frames_derived_when_shown,
        ("report/plot/drawing.py", "", '\n\ndef _planted(df):\n    return df.groupby("x")\n'),
    ),
    "a figure filtering through .loc and isin": (
        frames_derived_when_shown,
        (
            "report/plot/drawing.py",
            "",
            '\n\ndef _planted(df):\n    return df.loc[df["x"].isin([1]), "y"]\n',
        ),
    ),
    "ok rows read in render under an alias": (
        frames_derived_when_shown,
        (
            "report/render/markdown.py",
            "",
            "\nfrom attnbench.report.analyse.derived import ok_rows as good\n\n\n"
            "def _planted(df):\n    return good(df)\n",
        ),
    ),
    "the analysis importing a render module": (
        report_arrows_up,
        ("report/analyse/derived.py", "", "\nfrom attnbench.report.render import markdown\n"),
    ),
    "a decision importing the report relatively": (
        report_arrows_up,
        ("report/decide/verdicts.py", "", "\nfrom .. import report\n"),
    ),
    "a row changed through dict(row, ...)": (
        rows_filled_elsewhere,
        ("run/writer.py", _WRITE, _WRITE.replace("(row)", '(dict(row, host="planted"))')),
    ),
    "a row changed through row | {...}": (
        rows_filled_elsewhere,
        ("run/writer.py", _WRITE, _WRITE.replace("(row)", '(row | {"host": "planted"})')),
    ),
    "a row renamed, then stamped": (
        rows_filled_elsewhere,
        (
            "run/writer.py",
            _WRITE,
            '            line = row\n            line["host"] = "planted"\n' + _WRITE,
        ),
    ),
    "a row stamped by a helper it is passed to": (
        rows_filled_elsewhere,
        [
            ("run/writer.py", _WRITE, "            self._stamp(row)\n" + _WRITE),
            (
                "run/writer.py",
                "    def note(",
                "    def _stamp(self, r):\n"
                '        r.setdefault("host", "planted")\n\n'
                "    def note(",
            ),
        ],
    ),
    "the worker writing the speedup into a row again": (
        rows_filled_elsewhere,
        (
            "run/executing/worker.py",
            "            yield answer._replace(anchor=anchor)\n",
            "            answer.row.update(speedup=1.0)\n"
            "            yield answer._replace(anchor=anchor)\n",
        ),
    ),
    "the sweep loop stamping a row": (
        rows_filled_elsewhere,
        (
            "run/sweep.py",
            "            row = measured.row\n",
            '            row = measured.row\n            row["seed"] = 0\n',
        ),
    ),
    "a second driver of steps imported under other names": (
        second_drivers,
        [
            (
                "testing.py",
                "from attnbench.run.executing.local import InProcess\n",
                "from attnbench.run.executing.local import InProcess\n"
                "from attnbench.run.measuring.row import finish as done, time_round as tick\n",
            ),
            ("testing.py", "", _DRIVER.format(time="tick", finish="done")),
        ],
    ),
    "a server handler that drives two steps": (
        second_drivers,
        (
            "run/executing/steps.py",
            "    def _anchor(",
            "    def _both(self, checked, index):\n"
            "        row.time_round(checked, index)\n"
            "        return row.finish(checked, [], None)\n\n"
            "    def _anchor(",
        ),
    ),
    "the worker's failure renamed (the rule would read nothing)": (
        worker_written_twice,
        "rename WorkerFailed StepFailed",
    ),
    "the worker's failure raised by the sweep, under an alias": (
        worker_written_twice,
        (
            "run/sweep.py",
            "",
            "\n\ndef _planted():\n"
            "    from attnbench.run.executing.worker import WorkerFailed as Lost\n\n"
            '    raise Lost("crash", "planted")\n',
        ),
    ),
    "the worker's failure handled by the progress bar": (
        worker_written_twice,
        (
            "run/progress.py",
            "",
            "\n\ndef _planted():\n"
            "    from attnbench.run.executing import worker\n\n"
            "    try:\n        pass\n"
            "    except (KeyError, worker.WorkerFailed):\n        pass\n",
        ),
    ),
    "a second runner of a case's steps": (
        worker_written_twice,
        (
            "testing.py",
            "",
            "\n\nclass _Planted:\n    def run_case(self, case, impls):\n        return []\n",
        ),
    ),
}


def _plant(how) -> Code:
    if isinstance(how, str):  # "rename OLD NEW": a name changed in every module
        _, old, new = how.split()
        return {w: text.replace(old, new) for w, text in sources().items()}
    code = None
    for where, old, new in how if isinstance(how, list) else [how]:
        code = planted(where, old, new, code)
    return code


@pytest.mark.parametrize("name", PLANTED)
def test_each_guard_catches_its_planted_violation(name):
    guard, how = PLANTED[name]
    assert not guard(), f"{guard.__name__} finds a violation in the package itself"
    assert guard(_plant(how)), f"{guard.__name__} misses: {name}"
