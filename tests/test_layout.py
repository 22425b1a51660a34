"""The package's layout is its data path: no module imports one that imports it back, and the
measuring leaves import nothing above them."""

import ast
import json
import re
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
    """attnbench.run.worker -> run; attnbench.cli -> cli; attnbench (the package) -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def room_arrows() -> dict[tuple[str, str], list[str]]:
    """(room, room it imports) -> the modules whose imports draw that arrow."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, deps in imports().items():
        for dep in deps:
            if room(dep) != room(module) and dep != "attnbench":
                arrows.setdefault((room(module), room(dep)), []).append(f"{module} -> {dep}")
    return arrows


def test_every_room_is_on_a_floor():
    floors = [r for floor in FLOORS for r in floor]
    assert len(floors) == len(set(floors)), "a room is declared on two floors"
    rooms = {room(m) for m in imports()}
    assert rooms == set(floors), f"undeclared: {rooms - set(floors)}, gone: {set(floors) - rooms}"


def test_no_arrow_goes_up_or_sideways():
    """Every import between rooms goes down the declared floors; a failure names the arrow,
    the modules that draw it, and the floors the imports give each room (one above the
    highest room it imports), from which the fix is read."""
    floor_of = {r: n for n, floor in enumerate(FLOORS) for r in floor}
    arrows = room_arrows()
    computed: dict[str, int] = {}

    def height(r: str, path: tuple = ()) -> int:
        assert r not in path, f"a circle of rooms: {' -> '.join([*path, r])}"
        if r not in computed:
            computed[r] = 1 + max((height(b, (*path, r)) for a, b in arrows if a == r), default=-1)
        return computed[r]

    wrong = [
        f"{a} (floor {floor_of[a]}) imports {b} (floor {floor_of[b]}): {sorted(arrows[a, b])[:3]}"
        for a, b in sorted(arrows)
        if floor_of[b] >= floor_of[a]
    ]
    assert not wrong, "\n".join(
        [*wrong, f"floors by imports: {[(r, height(r)) for r in floor_of]}"]
    )


def test_store_only_stores():
    """store/ holds files and formats: it imports the rooms below it and itself, nothing that
    measures, probes the machine, loads code or builds a command line."""
    store = next(n for n, floor in enumerate(FLOORS) if "store" in floor)
    below = {r for floor in FLOORS[:store] for r in floor}
    for module, deps in imports().items():
        if room(module) == "store":
            out = [d for d in deps if room(d) not in below | {"store"}]
            assert not out, f"{module} imports {out}"


def test_no_module_is_named_after_a_library_its_folder_imports():
    """A module named like a library (impls/xformers.py beside ``import xformers``) is a trap:
    a reader, or a tool, takes the library's import for the sibling."""
    for folder in {p.parent for p in PACKAGE.rglob("*.py")}:
        names = {p.stem for p in folder.glob("*.py")}
        libraries = set()
        for path in folder.glob("*.py"):
            found = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
                elif isinstance(node, ast.Import):
                    found.update(a.name.split(".")[0] for a in node.names)
            libraries |= found - {path.stem}  # a module may import its namesake, not a sibling's
        assert not names & libraries, f"{folder.relative_to(PACKAGE)}: {names & libraries}"


def test_measure_modules_import_nothing_above_them():
    allowed = ("attnbench.measure", "attnbench.case", "attnbench.errors", "attnbench.masks")
    allowed += ("attnbench.store.env",)  # env.json's GPU-state field names (clocks fills them)
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


def test_the_worker_reads_as_the_loop():
    lines = functions(PACKAGE / "run" / "worker.py")["Worker.run_case"]
    assert lines <= 45, f"run/worker.py::Worker.run_case is {lines} lines (at most 45)"


def test_one_driver_runs_the_steps():
    """A row's steps (check, time_round, finish) are driven by the worker alone, and the test
    API measures through it: no second loop over the steps for one impl."""
    steps = {"time_round", "finish"}
    for path in PACKAGE.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            called = {
                getattr(n.func, "attr", getattr(n.func, "id", None))
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
            }
            where = f"{path.relative_to(PACKAGE).as_posix()}::{fn.name}"
            assert not (called >= steps), f"{where} times and finishes a row itself"
    assert "attnbench.run.worker" in imports()["attnbench.testing"]


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
    """One worker (run/worker.py) for every transport: one class runs a case's steps
    (``run_case``), transports raise WorkerFailed and only the worker handles it (the Ray
    transport's actor, beside it, turns one into a message back to it; the pool leaves out
    an executor lost while it describes its device, before any row)."""
    runners, raisers, handlers = set(), set(), set()
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                runners |= {f"{where}::{node.name}"} if "run_case" in methods else set()
            elif isinstance(node, ast.Raise) and "WorkerFailed" in ast.unparse(node.exc or node):
                raisers.add(where)
            elif isinstance(node, ast.ExceptHandler) and node.type is not None:
                if "WorkerFailed" in ast.unparse(node.type):
                    handlers.add(where)
    assert runners == {"run/worker.py::Worker"}, runners
    assert raisers <= {"run/local.py", "run/ray_executor.py", "run/worker.py"}, raisers
    assert handlers <= {"run/worker.py", "run/ray_executor.py", "run/executors.py"}, handlers


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


# who may import the interval geometry: the mask kinds, the impls that draw it, case.py (which
# re-exports its pair counts) and measure/diagnose.py (which shifts a window by one)
INTERVAL_IMPORTERS = ("attnbench.masks", "attnbench.impls", "attnbench.case")
INTERVAL_IMPORTERS += ("attnbench.measure.diagnose",)


def test_mask_kinds_follow_one_protocol():
    """Every mask kind is a layout passed as one Mask: outside masks/ and impls/ no module
    reads a mask's layout views (``kv_lens``, ``window``), and the interval geometry is
    imported only where it is drawn."""
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
    made it is only handed to a ``from_options`` of run/plan.py or run/target.py, and those
    hand it on to nothing but another ``from_options`` there."""
    readers = {"run/plan.py", "run/target.py"}
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


# the columns a sweep adds to a row after the worker gives it: what ran it, the run, the speed
SWEEP_COLUMNS = {"host", "device_name", "node", "actor", "gpu_index", "gpu_uuid", "run_id", "seed"}
SWEEP_COLUMNS |= {"speed_compute", "speed_memory"}


def _is_row(node: ast.AST) -> bool:
    """``row`` or ``<something>.row``: how run/ names a row dict."""
    return getattr(node, "id", None) == "row" or getattr(node, "attr", None) == "row"


def _columns_set(tree: ast.AST) -> set[str]:
    """The constant columns a module sets on a row: ``row["x"] = ...``, ``row.update(x=...)``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            out.update(
                t.slice.value
                for t in node.targets
                if isinstance(t, ast.Subscript)
                and _is_row(t.value)
                and isinstance(t.slice, ast.Constant)
            )
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update":
            if _is_row(node.func.value):
                out.update(k.arg for k in node.keywords if k.arg)
    return out


def test_a_row_is_completed_in_one_place():
    """After the worker, a row's columns are filled in run/complete.py alone: the sweep loop
    hands it over and the writer only writes (no room of run/ or store/ stamps it)."""
    setters = {
        path.relative_to(PACKAGE).as_posix(): found
        for folder in ("run", "store")
        for path in (PACKAGE / folder).glob("*.py")
        if (found := _columns_set(ast.parse(path.read_text())) & SWEEP_COLUMNS)
    }
    assert set(setters) == {"run/complete.py"}, setters
    measure = [d for d in imports()["attnbench.run.writer"] if d.startswith("attnbench.measure")]
    assert not measure, f"run/writer.py imports {measure}"


def test_the_transport_protocol_is_whole():
    """``where`` and ``replace`` are part of the transport protocol: every transport has them,
    and no module asks with getattr whether a transport or an executor has them."""
    from attnbench.run.worker import Transport

    assert "where" in Transport.__annotations__ and "replace" in vars(Transport)
    transports = []
    for path in (PACKAGE / "run").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                name = node.args[1] if len(node.args) > 1 else None
                assert not (
                    isinstance(name, ast.Constant) and name.value in ("where", "replace")
                ), f"run/{path.name}:{node.lineno} asks getattr for {name.value!r}"
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            if "call" in methods and "host" in _attributes_set(cls):  # a transport
                transports.append(cls.name)
                assert "replace" in methods, f"run/{path.name}::{cls.name} has no replace()"
                assert "where" in _attributes_set(cls), f"run/{path.name}::{cls.name}: no where"
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


def test_impl_reasons_is_a_tuple_of_small_checks():
    """Impl.reasons asks each capability's check in turn (registry.CHECKS), each a few lines,
    and plugin loading and discovery live in plugins.py, not in the registry."""
    from attnbench import registry

    sizes = functions(PACKAGE / "registry.py")
    assert sizes["Impl.reasons"] <= 12, sizes["Impl.reasons"]
    long = {c.__name__: sizes[c.__name__] for c in registry.CHECKS if sizes[c.__name__] > 10}
    assert not long, f"checks over 10 lines: {long}"
    loading = {"importlib.metadata", "pkgutil"} & {
        a.name
        for n in ast.walk(ast.parse((PACKAGE / "registry.py").read_text()))
        if isinstance(n, ast.Import)
        for a in n.names
    }
    assert not loading, f"registry.py imports {loading}: discovery belongs in plugins.py"


LAYOUT_MAP = PACKAGE.parent / "docs" / "layout.md"
SUBFOLDERS = ("run", "store", "measure", "report", "masks", "impls")  # each has its heading


def test_the_layout_map_names_every_module():
    """docs/layout.md names every module (and kernel folder) of each folder of attnbench/
    under that folder's heading, and nothing that is not there; its floors are FLOORS."""
    text = LAYOUT_MAP.read_text()
    sections = re.split(r"^### `attnbench/(\w*)/?`$", text, flags=re.M)
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
    tree = ast.parse((PACKAGE / "spec.py").read_text())
    spelled = [
        f"spec.py:{n.lineno} Case({', '.join(k.arg for k in n.keywords if k.arg)})"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "Case"
        and any(k.arg for k in n.keywords)
    ]
    assert not spelled, spelled


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
