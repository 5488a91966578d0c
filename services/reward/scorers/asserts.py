"""Assert-style code cases (MBPP's test_list, HumanEval's checks) made hard to pass without the right
answer. A case runs in the program's own process, after it, so a program could otherwise pass every
assert without solving anything: return an object whose __eq__ always says True (the best-known reward
hack of code RL), or replace a builtin the check calls (`isinstance`, `len`, `sorted`).

So the file a case runs in (script()) is: a copy of the builtins taken before the program runs, the
program, the builtins put back, helpers that name builtins through the builtins module (a program may
have bound `list` or `type` to something of its own), then the case rewritten (guard()) so that every
comparison and every truth test an assert makes goes through a helper that accepts plain values only: numbers, strings,
bytes, None and lists, tuples, sets and dicts of them, by their real type (type(), not __class__), so a
class the program defined never reaches ==, <, `in` or bool(); `is` and `is not` stay as written. A case
comparing values of its own classes therefore fails; such cases are rare in the code data sets.

What this does not stop (no same-process check can): a program that reads the file it runs from (the
helpers' names and the mark) and tampers with them, or that ends the process itself after printing the
mark. The peers' sandboxes share the limit.
"""

from __future__ import annotations

import ast

PRELUDE = "import builtins as _{tag}_b\n_{tag}_saved = dict(_{tag}_b.__dict__)\n"
HELPERS = """
_{tag}_b.__dict__.clear()
_{tag}_b.__dict__.update(_{tag}_saved)
_{tag}_ATOMS = (_{tag}_b.int, _{tag}_b.float, _{tag}_b.complex, _{tag}_b.str, _{tag}_b.bytes, _{tag}_b.bool)
_{tag}_ATOMS += (_{tag}_b.type(None),)
_{tag}_SEQS = (_{tag}_b.list, _{tag}_b.tuple, _{tag}_b.set, _{tag}_b.frozenset)
_{tag}_OPS = {{
    "Eq": lambda a, b: a == b, "NotEq": lambda a, b: a != b, "Lt": lambda a, b: a < b,
    "LtE": lambda a, b: a <= b, "Gt": lambda a, b: a > b, "GtE": lambda a, b: a >= b,
    "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
    "Is": lambda a, b: a is b, "IsNot": lambda a, b: a is not b,
}}


def _{tag}_plain(v):
    t = _{tag}_b.type(v)
    if t in _{tag}_ATOMS:
        return True
    if t in _{tag}_SEQS:
        for x in v:
            if not _{tag}_plain(x):
                return False
        return True
    if t is _{tag}_b.dict:
        for k in v:
            if not (_{tag}_plain(k) and _{tag}_plain(v[k])):
                return False
        return True
    return False


def _{tag}_truth(v):
    if not _{tag}_plain(v):
        raise _{tag}_b.AssertionError("the value tested is not a plain value")
    return True if v else False


def _{tag}_compare(values, ops):
    for i, op in _{tag}_b.enumerate(ops):
        a, b = values[i], values[i + 1]
        if op not in ("Is", "IsNot") and not (_{tag}_plain(a) and _{tag}_plain(b)):
            raise _{tag}_b.AssertionError("a value compared is not a plain value")
        if not _{tag}_OPS[op](a, b):
            return False
    return True
"""


class Guard(ast.NodeTransformer):
    """Every comparison in an assert's test through _compare, every truth test through _truth."""

    def __init__(self, tag: str):
        self.tag = tag

    def helper(self, name: str, *args: ast.expr) -> ast.Call:
        return ast.Call(ast.Name(f"_{self.tag}_{name}", ast.Load()), list(args), [])

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        self.generic_visit(node)
        node.test = self.helper("truth", node.test)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.BoolOp:
        self.generic_visit(node)
        node.values = [self.helper("truth", v) for v in node.values]
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.UnaryOp:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self.helper("truth", node.operand)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        ops = tuple(type(op).__name__ for op in node.ops)
        if all(op in ("Is", "IsNot") for op in ops):
            return node
        # the operands are evaluated once each, in order, all of them (a chain's short cut aside)
        values = ast.Tuple([node.left, *node.comparators], ast.Load())
        return self.helper("compare", values, ast.Tuple([ast.Constant(op) for op in ops], ast.Load()))


def guard(case: str, tag: str) -> str:
    """The case with its asserts' comparisons and truth tests through the helpers; a case that is not
    Python is returned as it is (it then fails as written)."""
    try:
        tree = ast.parse(case)
    except SyntaxError:
        return case
    return ast.unparse(ast.fix_missing_locations(Guard(tag).visit(tree)))


def script(code: str, case: str, tag: str, mark: str) -> str:
    """The file one assert case runs as: the program, then the guarded case, then the mark."""
    return f"{PRELUDE.format(tag=tag)}{code}\n\n{HELPERS.format(tag=tag)}\n{guard(case, tag)}\nprint({mark!r})\n"
