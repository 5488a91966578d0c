"""Assert-style code cases (MBPP's test_list, HumanEval's checks) made hard to pass without the right
answer. A case runs in the program's own process, after it, so a program could otherwise pass every
assert without solving anything: return an object whose __eq__ always says True (the best-known reward
hack of code RL), make its arithmetic or indexing answer whatever it is compared with, or replace a
builtin or a library function the check calls (`isinstance`, `abs`, `math.isclose`).

So the file a case runs as (script()) is: the program's `__future__` imports, a copy of the builtins and
of common modules' namespaces taken before the program runs, the program, those put back, helpers, then
the case rewritten (guard()): every value an assert compares, tests for truth, computes with, indexes,
or passes to a call goes through a helper that refuses an instance of a class the program defined (one
with a function of the program's file in its namespace or its metaclass's, read through `type`'s own
descriptors); lists, tuples, sets and dicts are checked element by element; and the case's builtin
names are read from the builtins module, so a program's own `isinstance` or `list` is not the one the
case calls. Values of the standard library's classes (Counter, OrderedDict, namedtuples, Fraction,
Decimal) compare as they always do.

What this does not stop (no same-process check can): a program that finds the saved namespaces or the
helpers among its globals, or the mark among its code's constants, and tampers with them or prints the
mark and ends the process itself; a class whose methods it compiled under another file's name. The
peers' sandboxes share the limit: only a comparison outside the program's process closes it (the call
cases do that: their results cross as JSON and are compared on the host).
"""

from __future__ import annotations

import ast
import builtins

# the modules whose functions cases call most; their namespaces are put back after the program
MODULES = ("math", "cmath", "re", "collections", "itertools", "functools", "operator", "heapq", "bisect", "string")
BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))
PRELUDE = """import builtins as _{tag}_b
_{tag}_saved = dict(_{tag}_b.__dict__)
_{tag}_mods = [(_m, dict(_m.__dict__)) for _m in map(_{tag}_b.__import__, {modules!r})]
"""
HELPERS = """
_{tag}_b.__dict__.clear()
_{tag}_b.__dict__.update(_{tag}_saved)
for _{tag}_m, _{tag}_d in _{tag}_mods:
    _{tag}_m.__dict__.clear()
    _{tag}_m.__dict__.update(_{tag}_d)
_{tag}_FILE = _{tag}_b.__import__("sys")._getframe().f_code.co_filename
_{tag}_NS = _{tag}_b.type.__dict__["__dict__"].__get__
_{tag}_MRO = _{tag}_b.type.__dict__["__mro__"].__get__
_{tag}_SEQS = (_{tag}_b.list, _{tag}_b.tuple, _{tag}_b.set, _{tag}_b.frozenset)
_{tag}_OPS = {{
    "Eq": lambda a, b: a == b, "NotEq": lambda a, b: a != b, "Lt": lambda a, b: a < b,
    "LtE": lambda a, b: a <= b, "Gt": lambda a, b: a > b, "GtE": lambda a, b: a >= b,
    "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
    "Is": lambda a, b: a is b, "IsNot": lambda a, b: a is not b,
}}


def _{tag}_made(t):
    for c in _{tag}_MRO(t) + _{tag}_MRO(_{tag}_b.type(t)):
        for v in _{tag}_NS(c).values():
            for f in (v, _{tag}_b.getattr(v, "__func__", None), _{tag}_b.getattr(v, "fget", None)):
                code = _{tag}_b.getattr(f, "__code__", None)
                if code is not None and _{tag}_b.getattr(code, "co_filename", None) == _{tag}_FILE:
                    return True
    return False


def _{tag}_value(v):
    if _{tag}_made(_{tag}_b.type(v)):
        raise _{tag}_b.AssertionError("a value of a class the program defined")
    if _{tag}_b.isinstance(v, _{tag}_SEQS):
        for x in v:
            _{tag}_value(x)
    elif _{tag}_b.isinstance(v, _{tag}_b.dict):
        for k in v:
            _{tag}_value(k)
            _{tag}_value(v[k])
    return v


def _{tag}_compare(values, ops):
    result = True
    for i, op in _{tag}_b.enumerate(ops):
        a, b = values[i], values[i + 1]
        if op not in ("Is", "IsNot"):
            _{tag}_value(a)
            _{tag}_value(b)
        result = _{tag}_OPS[op](a, b)
        if _{tag}_b.len(ops) > 1 and not result:
            return result
    return result
"""


# the fields, by node type, whose values go through _value: what an assert tests, truth tests, operands,
# a call's arguments, what is indexed (compare's operands go through _compare, builtin names to builtins)
CHECKED: dict[type, tuple[str, ...]] = {
    ast.Assert: ("test",),
    ast.BoolOp: ("values",),
    ast.UnaryOp: ("operand",),
    ast.BinOp: ("left", "right"),
    ast.IfExp: ("test",),
    ast.comprehension: ("ifs",),
    ast.Call: ("args",),
    ast.keyword: ("value",),
    ast.Subscript: ("value",),
}


class Guard(ast.NodeTransformer):
    """The case's values through _value, its comparisons through _compare, its builtins from builtins."""

    def __init__(self, tag: str):
        self.tag = tag

    def helper(self, name: str, *args: ast.expr) -> ast.Call:
        return ast.Call(ast.Name(f"_{self.tag}_{name}", ast.Load()), list(args), [])

    def value(self, node: ast.expr) -> ast.expr:
        return node if isinstance(node, ast.Starred) else self.helper("value", node)

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in BUILTINS:
            return ast.Attribute(ast.Name(f"_{self.tag}_b", ast.Load()), node.id, ast.Load())
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        """Children first, then the fields of `node` that hold values the case uses (CHECKED)."""
        node = super().generic_visit(node)
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
            return node  # a target (x[i] = ...), not a value read
        for field in CHECKED.get(type(node), ()):
            held = getattr(node, field)
            setattr(node, field, [self.value(v) for v in held] if isinstance(held, list) else self.value(held))
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        ops: list[ast.expr] = [ast.Constant(type(op).__name__) for op in node.ops]
        # the operands are evaluated once each, in order, all of them (a chain's short cut aside)
        values = ast.Tuple([node.left, *node.comparators], ast.Load())
        return self.helper("compare", values, ast.Tuple(ops, ast.Load()))


def guard(case: str, tag: str) -> str:
    """The case rewritten (the class's docstring); a case that is not Python is returned as it is (it then
    fails as written)."""
    try:
        tree = ast.parse(case)
    except SyntaxError:
        return case
    return ast.unparse(ast.fix_missing_locations(Guard(tag).visit(tree)))


def future(code: str) -> tuple[str, str]:
    """(the program's `from __future__` imports, the program without them): they must come first."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return "", code
    lines = code.splitlines(keepends=True)
    hoisted = [n for n in body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    for n in hoisted:
        for i in range(n.lineno - 1, n.end_lineno or n.lineno):
            lines[i] = "\n"  # the program's other lines keep their numbers
    return "".join(ast.unparse(n) + "\n" for n in hoisted), "".join(lines)


def script(code: str, case: str, tag: str, mark: str) -> str:
    """The file one assert case runs as: the program, then the guarded case, then the mark."""
    first, rest = future(code)
    prelude = PRELUDE.format(tag=tag, modules=MODULES)
    return f"{first}{prelude}{rest}\n\n{HELPERS.format(tag=tag)}\n{guard(case, tag)}\nprint({mark!r})\n"
