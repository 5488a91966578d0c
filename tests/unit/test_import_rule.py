"""The import rule the README states, checked on every module's imports (read with ast, nothing runs):
services/ and orchestrator/ import the shared `meshrl` package; `meshrl` imports neither; a service never
imports another service or the orchestrator."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# module -> packages it may still import against the rule, and why (none: the services' settings live in
# meshrl/config, which both sides read)
ALLOWED: dict[str, set[str]] = {}


def imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def package_of(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if parts[0] != "services" else f"services.{parts[1]}"


def test_imports_go_one_way():
    broken = []
    for top in ("meshrl", "services", "orchestrator"):
        for path in (ROOT / top).rglob("*.py"):
            if "v1" in path.relative_to(ROOT).parts:
                continue
            own = package_of(path)
            for name in imports(path):
                head = name.split(".")[0]
                if head not in ("meshrl", "services", "orchestrator"):
                    continue
                ok = (
                    head == "meshrl"
                    or name.startswith(own + ".")
                    or name == own
                    or (own == "orchestrator" and head == "orchestrator")
                    or name in ALLOWED.get(own.split(".")[0], set())
                )
                if not ok:
                    broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not broken, "\n".join(broken)
