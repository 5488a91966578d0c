"""User code named by a spec: "package.module:name" or "path/to/file.py:name" (a reward function, an
environment class, an agent). Shared by the services that run it, which never import each other, and by
the agent worker, which loads this file by path in any interpreter: standard library only, Python >= 3.9."""

import importlib
import importlib.util
import pathlib
import sys
from collections.abc import Callable


def load_named(spec: str, kind: str) -> Callable:
    """The callable `name` of spec "package.module:name" or "path/to/file.py:name"; ValueError naming
    what is wrong otherwise (`kind` says what it is, for the message)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{kind} spec {spec!r} must look like path/to/file.py:name or package.module:name")
    if path.endswith(".py"):
        return from_file(spec, kind)
    try:
        obj = getattr(importlib.import_module(path), name)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - said in one line: user code may raise anything
        raise ValueError(f"{kind} {spec!r} cannot be loaded with {interpreter()}: {type(e).__name__}: {e}") from e
    if not callable(obj):
        raise ValueError(f"{kind} {spec!r} is not callable")
    return obj


def from_file(spec: str, kind: str = "reward function") -> Callable:
    """Import path/to/file.py and return its function (or class) `name` (spec "path/to/file.py:name")."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{kind} spec {spec!r} must look like path/to/file.py:name")
    file = pathlib.Path(path).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"{kind} file {str(file)!r} does not exist")
    module_name = f"meshrl_user_{abs(hash(str(file)))}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    if module_spec is None or module_spec.loader is None:  # not a suffix Python imports (.py, .so, ...)
        raise ValueError(f"{kind} file {str(file)!r} is not a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling-free helpers in user code need it
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - said in one line: user code may raise anything
        raise ValueError(f"could not import {file} with {interpreter()}: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{file} has no {kind.split()[-1]} {name!r}")
    return fn


def interpreter() -> str:
    """This interpreter, as a load error names it (an agent's may be another venv's)."""
    return f"Python {sys.version.split()[0]} ({sys.executable})"
