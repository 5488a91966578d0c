"""The import rule the README states, checked on every module's imports (read with ast, nothing runs):

- cli/ (the `meshrl` command) sits above everything and may import anything;
- services/ and orchestrator/ import the shared `meshrl` package, never cli/;
- `meshrl` imports none of them, not even by name through importlib;
- a service never imports another service or the orchestrator;
- the orchestrator's modules import each other without a circle, its rooms (lifecycle, sampling, loops,
  run, output) too, and only at the top of a file: an import hidden in a function is how a circle hides.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = ("cli", "meshrl", "services", "orchestrator")
# module -> packages it may still import against the rule, and why (none: the services' settings live in
# meshrl/config, which both sides read)
ALLOWED: dict[str, set[str]] = {}


def sources(top: str) -> list[pathlib.Path]:
    return [p for p in (ROOT / top).rglob("*.py") if "v1" not in p.relative_to(ROOT).parts]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST) -> list[tuple[str, str | None]]:
    """(module, name imported from it or None) for an import statement; [] for anything else."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [(node.module, a.name) for a in node.names]
    return []


def imports(path: pathlib.Path) -> set[str]:
    """Every module a file imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(), str(path))
    return {module for node in ast.walk(tree) for module, _ in imported(node)}


def named_imports(path: pathlib.Path) -> set[str]:
    """Modules a file imports by a string: importlib.import_module("x.y"), __import__("x"), f"x.{name}"."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        if name not in ("import_module", "__import__"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            arg = arg.values[0]  # the f-string's fixed start names the package
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
    return out


def package_of(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if parts[0] != "services" else f"services.{parts[1]}"


def test_imports_go_one_way():
    broken = []
    for top in TOPS:
        for path in sources(top):
            own = package_of(path)
            for name in imports(path) | named_imports(path):
                head = name.split(".")[0]
                if head not in TOPS:
                    continue
                ok = (
                    own == "cli"
                    or head == "meshrl"
                    or name.startswith(own + ".")
                    or name == own
                    or (own == "orchestrator" and head == "orchestrator")
                    or name in ALLOWED.get(own.split(".")[0], set())
                )
                if not ok:
                    broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not broken, "\n".join(broken)


def test_the_rule_catches_a_string_import(tmp_path):
    """The shared package once reached the services and the orchestrator through importlib strings."""
    code = 'import importlib\nimportlib.import_module(f"services.{x}.main")\n__import__("orchestrator.main")'
    (tmp_path / "m.py").write_text(code)
    assert named_imports(tmp_path / "m.py") == {"services.", "orchestrator.main"}


# ---- the orchestrator: a graph of modules without a circle -----------------------------------------


def top_level(tree: ast.Module):
    """The statements of a module outside its functions and classes (inside `if TYPE_CHECKING:` too: an
    import for type hints is an arrow all the same)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def orchestrator_graph() -> dict[str, set[str]]:
    """orchestrator module -> the orchestrator modules its top-level imports name (`from package import
    module` names the module)."""
    modules = {module_name(p): p for p in sources("orchestrator")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in top_level(ast.parse(path.read_text(), str(path))):
            for module, what in imported(node):
                target = f"{module}.{what}" if f"{module}.{what}" in modules else module
                if target in modules and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle in the graph as the path around it, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def room(module: str) -> str:
    """orchestrator.sampling.chunks -> orchestrator.sampling; a file at the top is a room of its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_orchestrator_modules_import_each_other_without_a_circle():
    graph = orchestrator_graph()
    assert "orchestrator.run.trainer" in graph and graph["orchestrator.run.trainer"]  # the graph is read
    found = cycle(graph)
    assert found is None, " -> ".join(found)


def test_the_orchestrator_rooms_import_each_other_without_a_circle():
    """Arrows run one way between the rooms too: lifecycle <- sampling <- loops <- run <- main."""
    rooms: dict[str, set[str]] = {}
    for module, edges in orchestrator_graph().items():
        rooms.setdefault(room(module), set()).update(room(e) for e in edges if room(e) != room(module))
    found = cycle(rooms)
    assert found is None, " -> ".join(found)


def test_a_circle_is_found():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_orchestrator_imports_its_own_modules_at_the_top():
    hidden = []
    for path in sources("orchestrator"):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(fn):
                for module, _ in imported(node):
                    if module.split(".")[0] == "orchestrator":
                        hidden.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module} in {fn.name}")
    assert not hidden, "\n".join(hidden)
