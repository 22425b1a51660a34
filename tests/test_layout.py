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


def test_report_modules_and_functions_stay_small():
    """The report's modules: none over 600 lines, no function over 80."""
    long_modules, long_functions = [], []
    for path in sorted((PACKAGE / "report").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 600:
            long_modules.append(f"{path.name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long_functions.append(f"{path.name}::{node.name}: {lines} lines")
    assert not long_modules, long_modules
    assert not long_functions, long_functions
