"""What tests/test_layout.py's guards read of the package: its code as data (``sources``, or a
copy with one violation ``planted``), the modules each module imports in any form, who refers
to a given object by whatever name it is imported as, and where a row mapping is made or
changed. Every reader works on structure (the AST, the objects themselves), never on the
spelling of a local name, so that renaming a variable or an import alias cannot hide what a
guard looks for. Each module's reading is cached by its text: a planted copy reads again only
the module it changed."""

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "attnbench"

Code = dict[str, str]  # a module's path under attnbench/ ("run/executing/worker.py") -> its source


def sources() -> Code:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def planted(where: str, old: str, new: str, code: Code | None = None) -> Code:
    """The package's code with a violation planted in ``where``: ``old`` replaced by ``new``
    (``old`` must be there once: a plant that misses tests nothing), or, with ``old`` empty,
    ``new`` added at the end of ``where`` (a new module where there is none)."""
    code = dict(code or sources())
    if not old:
        code[where] = code.get(where, "") + new
        return code
    assert code[where].count(old) == 1, f"{where}: {old!r} is not there once"
    code[where] = code[where].replace(old, new)
    return code


@functools.cache
def parse(text: str) -> ast.Module:
    return ast.parse(text)


def module_name(where: str) -> str:
    """run/executing/worker.py -> attnbench.run.executing.worker; run/__init__.py ->
    attnbench.run."""
    parts = ["attnbench", *Path(where).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(node: ast.ImportFrom, where: str) -> str:
    """The module an ``ImportFrom`` names, a relative one (``from ..store import x``) resolved
    against the package of ``where``."""
    if not node.level:
        return node.module or ""
    package = module_name(where).split(".")
    package = package if where.endswith("__init__.py") else package[:-1]
    return ".".join([*package[: len(package) - node.level + 1], *filter(None, [node.module])])


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name or an Attribute chain over one, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def refers(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` (a Name or a dotted Attribute) is one of ``names``."""
    return dotted(node) in names


@functools.cache
def _import_nodes(text: str) -> list[ast.AST]:
    return [n for n in ast.walk(parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))]


@functools.cache
def imported(where: str, text: str) -> frozenset[str]:
    """Every module (and every ``module.name``) that the module ``where`` imports, in any form
    and at any depth: ``import a.b``, ``from a import b`` (a and a.b), relative imports, and
    ``importlib.import_module("a")`` / ``__import__("a")`` with a constant name."""
    found = set()
    for node in _import_nodes(text):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        else:
            module = absolute(node, where)
            found |= {module, *(f"{module}.{a.name}" for a in node.names)}
    for node in ast.walk(parse(text)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            if dotted(node.func) in ("importlib.import_module", "import_module", "__import__"):
                found.add(str(node.args[0].value))
    for name in list(found):  # a.b.c imports a.b and a too
        while "." in name:
            name = name.rpartition(".")[0]
            found.add(name)
    return frozenset(found)


def graph(code: Code | None = None) -> dict[str, set[str]]:
    """module -> the attnbench modules it imports (at any depth of the file, in any form)."""
    code = code or sources()
    names = {module_name(w): w for w in code}
    out = {}
    for module, where in names.items():
        deps = {d for d in imported(where, code[where]) if d in names and d != module}
        out[module] = {d for d in deps if d != "attnbench"}
    return out


@functools.cache
def aliases(where: str, text: str, module: str, name: str | None = None) -> frozenset[str]:
    """The dotted names by which the module ``where`` refers to ``module`` (name None) or to
    ``module.name``: the names it imports them as, dotted paths through an imported module,
    and, inside ``module`` itself, ``name`` bare."""
    target = module if name is None else f"{module}.{name}"
    out = {name} if name is not None and module_name(where) == module else set()
    parent, _, last = target.rpartition(".")
    for node in _import_nodes(text):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name == target:
                    out.add(a.asname)
                elif not a.asname and (target == a.name or target.startswith(f"{a.name}.")):
                    out.add(target)  # import a.b: a.b.c, through the package
        elif absolute(node, where) == parent:
            out.update(a.asname or a.name for a in node.names if a.name == last)
    if name is not None:  # through the module: row.finish, r.finish, attnbench.run.row.finish
        out |= {f"{m}.{name}" for m in aliases(where, text, module)}
    return frozenset(out)


@functools.cache
def calls(where: str, text: str) -> list[tuple[str, str]]:
    """(the function it is made in, "" at module level; the dotted name called) of every
    call of a dotted name; a call inside a nested function counts for each enclosing one."""
    out = []

    def visit(node, stack):
        if isinstance(node, ast.Call) and (name := dotted(node.func)) is not None:
            out.extend((fn, name) for fn in stack or [""])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack = [*stack, node.name]
        for child in ast.iter_child_nodes(node):
            visit(child, stack)

    visit(parse(text), [])
    return out


# -- row mappings ------------------------------------------------------------------------

MUTATORS = ("update", "setdefault", "pop", "popitem", "clear", "copy", "__setitem__", "__ior__")


def row_changes(code: Code, row_field: str, makers: tuple[str, ...]) -> list[str]:
    """Where a row mapping is made from another or changed: ``{**row, ...}``, ``dict(row,
    ...)``, ``row | {...}``, ``row[k] = ...``, ``row |= ...``, ``del row[k]``, ``row.update``
    and the other mutators. A row is found by where it comes from, not by what it is called:
    ``<anything>.<row_field>`` (the field of the record a row travels in), a call of a
    function that makes one (``makers``: qualified "module.function"), and, within a module,
    every name given one: assigned one (tuple unpacking included), or a parameter of a
    function of the module that is passed one. Each as "path:line what"."""
    return [f for w, text in code.items() for f in _module_changes(w, text, row_field, makers)]


@functools.cache
def _module_changes(where: str, text: str, row_field: str, makers: tuple[str, ...]) -> list[str]:
    made = set().union(*(aliases(where, text, *m.rsplit(".", 1)) for m in makers))
    rows = _Rows(parse(text), row_field, made)
    found = []
    for node, parent in rows.nodes:
        if isinstance(node, ast.Dict):
            if any(k is None and rows.held(v) for k, v in zip(node.keys, node.values)):
                found.append(node)  # {**row, ...}
        elif isinstance(node, ast.Call) and dotted(node.func) in ("dict", "copy.copy"):
            if any(rows.held(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                found.append(node)  # dict(row, ...), dict(**row), copy.copy(row)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            if rows.held(node.left) or rows.held(node.right):
                found.append(node)  # row | {...}
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if rows.held(node.value):
                found.append(parent)  # row[k] = ..., del row[k]
        elif isinstance(node, ast.AugAssign) and rows.held(node.target):
            found.append(node)  # row |= ...
        elif isinstance(node, ast.Attribute) and node.attr in MUTATORS and rows.held(node.value):
            found.append(parent)  # row.update(...), row.copy()
    return [f"{where}:{n.lineno} {ast.unparse(n)[:80]}" for n in found]


class _Rows:
    """The expressions of one module that hold a row: ``<x>.<row_field>``, a call of a maker,
    and the names given one in a scope (a function, or the module), to a fixed point:
    assignments from a row (tuples unpacked element by element) and the parameters of the
    module's functions that a row is passed to (by position or keyword, bare or as
    ``self.method``)."""

    def __init__(self, tree: ast.Module, row_field: str, made: set[str]):
        self.row_field, self.made = row_field, made
        self.nodes: list[tuple[ast.AST, ast.AST | None]] = []  # (node, its parent)
        self.scope: dict[ast.AST, tuple] = {}  # node -> the scopes it is in, innermost last
        self._index(tree, None, (tree,))
        functions = {n.name: n for n, _ in self.nodes if isinstance(n, ast.FunctionDef)}
        self.names: set[tuple[ast.AST, str]] = set()
        while True:
            before = len(self.names)
            for node, _ in self.nodes:
                for target, value in _bindings(node):
                    if isinstance(target, ast.Name) and self.held(value):
                        self.names.add((self.scope[node][-1], target.id))
                if isinstance(node, ast.Call):
                    self.names |= self._params(node, functions)
            if len(self.names) == before:
                return

    def _index(self, node: ast.AST, parent, scopes: tuple) -> None:
        self.nodes.append((node, parent))
        self.scope[node] = scopes
        inner = (*scopes, node) if isinstance(node, ast.FunctionDef) else scopes
        for child in ast.iter_child_nodes(node):
            self._index(child, node, inner)

    def held(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == self.row_field:
            return True
        if isinstance(node, ast.Call) and refers(node.func, self.made):
            return True
        if isinstance(node, ast.Name):
            return any((s, node.id) in self.names for s in self.scope.get(node, ()))
        return False

    def _params(self, call: ast.Call, functions: dict) -> set:
        name = getattr(call.func, "id", None)
        if isinstance(call.func, ast.Attribute) and dotted(call.func.value) == "self":
            name = call.func.attr
        fn = functions.get(name)
        if fn is None:
            return set()
        params = [a.arg for a in fn.args.args]
        params = params[1:] if params[:1] == ["self"] else params
        out = {(fn, p) for p, a in zip(params, call.args) if self.held(a)}
        return out | {(fn, k.arg) for k in call.keywords if k.arg and self.held(k.value)}


def _bindings(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(target, value) pairs a statement binds, tuples unpacked element by element."""
    if isinstance(node, ast.Assign):
        pairs = [(t, node.value) for t in node.targets]
    elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        pairs = [(node.target, node.value)]
    else:
        return []
    out = []
    for target, value in pairs:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            out += list(zip(target.elts, value.elts))
        else:
            out.append((target, value))
    return out
