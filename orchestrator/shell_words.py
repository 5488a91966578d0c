"""The words of a shell script as the shell expands them, without running a program: its variables (scalars,
arrays, unset, or not known here and why), parameter expansions, integer arithmetic and tests. The reader of
scripts (orchestrator/shell.py) runs commands over this; the syntax is orchestrator/shell_syntax.py's.

    words = Words()
    words.assign('ARGS="a.n=${N:-5} a.lr=1e-6"')   # N unset: the default taken, N listed in words.defaulted
    words.expand("$ARGS")      # [Field("a.n=5"), Field("a.lr=1e-6")]: unquoted, split at blanks
    words.expand('"$HOME"')    # [Field("$HOME", lacks=[(0, 5, "$HOME, the environment's: ...")])]

Each word comes back as a Field: its text, and the spans of it that stand for a value not known here (a
command's output, a variable only the environment gives), each with the reason, so that a caller can tell
a word known to its end from one that needs the shell. A variable the script does not set is the
environment's (ENVIRONMENT): `${X:-default}` takes the default (and the name is listed in `defaulted`),
`$X` alone is not known; `${X:?message}` where the script leaves X empty stops it (ValueError, with the
message), where only the environment would give X it is not known.
"""

import ast
import dataclasses
import fnmatch
import operator
import re
from collections.abc import Callable

from orchestrator.shell_syntax import ASSIGNMENT, NAME, find, matching, short, words_of

EVERY = re.compile(r'"(\$\{[A-Za-z_][A-Za-z0-9_]*\[@\]\}|\$@|\$\{@\})"')  # "${ARR[@]}", "$@"
SIMPLE_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")  # $NAME, $1, $@ ...
PARAMETER = re.compile(r"(#?)([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(\[[^]]*\])?(.*)", re.S)
FILE_TESTS = set("-e -f -d -r -w -x -s -L -h -S -p -b -c -g -u -k -O -G -N -t".split())
INTEGER_TESTS = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le}
INTEGER_TESTS |= {"-gt": operator.gt, "-ge": operator.ge}
ARITHMETIC: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: lambda a, b: int(a / b),  # the shell's division truncates
    ast.FloorDiv: operator.floordiv,
    ast.Mod: lambda a, b: a - b * int(a / b),  # and so does its remainder
    ast.Pow: operator.pow,
}
COMPARISONS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le}
COMPARISONS |= {ast.Gt: operator.gt, ast.GtE: operator.ge}
Status = bool | str  # a command's success: True, False, or why it is not known here


@dataclasses.dataclass
class Field:
    """A word as expanded: its text, with the spans standing for values not known here (as written)."""

    text: str = ""
    lacks: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)  # (start, end, why)
    quoted: bool = False  # quotes in it: an empty field is still a word

    def add(self, other: "Field") -> None:
        n = len(self.text)
        self.text += other.text
        self.lacks += [(a + n, b + n, why) for a, b, why in other.lacks]

    def cut(self, start: int, end: int) -> "Field":
        return Field(self.text[start:end], [(a - start, b - start, w) for a, b, w in self.lacks if start <= a < end])

    def pieces(self) -> list["Field"]:
        """Split at blanks outside the unknown spans, as re.split splits (empty ends where blanks are)."""
        out, start = [], 0
        for m in re.finditer(r"[ \t\n]+", self.text):
            if not any(a < m.end() and m.start() < b for a, b, _ in self.lacks):
                out.append(self.cut(start, m.start()))
                start = m.end()
        return [*out, self.cut(start, len(self.text))]

    def why(self) -> str:
        return "; ".join(dict.fromkeys(why for _, _, why in self.lacks))


def lack(text: str, why: str) -> Field:
    return Field(text, [(0, len(text), why)])


@dataclasses.dataclass(eq=False)
class Unknown:
    """A variable whose value (an array's length too) is not known here, and why."""

    why: str


ENVIRONMENT = Unknown("")  # a variable the script does not set: the environment's
Value = Field | list[Field] | Unknown | None  # None: unset by the script


class Words:
    """A script's variables as far as they are known, and what its words expand to under them."""

    def __init__(self) -> None:
        self.vars: dict[str, Value] = {}
        self.args: list[Field] = []  # $1 ...: none at the top
        self.depth = 0  # function calls in progress
        self.scopes: list[dict[str, Value]] = []  # per call: its locals' values before it
        self.maybe = ""  # where the commands now run may not run, and on what that depends
        self.line = 0
        self.defaulted: dict[str, None] = {}  # names the environment could set: the script's default taken
        self.assumed: dict[str, None] = {}

    # variables -------------------------------------------------------------------------------------------

    def set(self, name: str, value: Value) -> None:
        self.vars[name] = Unknown(f"{name}, set under {self.maybe}") if self.maybe else value

    def assign(self, raw: str) -> None:
        """NAME=word, NAME+=word, NAME=(words), NAME+=(words); NAME[i]=word makes NAME unknown."""
        m = ASSIGNMENT.match(raw)
        assert m is not None
        name, index, op = m.groups()
        rest = raw[m.end() :]
        value: Value
        if rest.startswith("(") and rest.endswith(")"):
            value = [f for w in words_of(rest[1:-1]) for f in self.expand(w)]
        else:
            value = self.word(rest)
        for field in value if isinstance(value, list) else [value]:  # an expression's unknown: named by the variable
            field.lacks = [
                (a, b, f"{name} (line {self.line}: {w})" if w.startswith("`") else w) for a, b, w in field.lacks
            ]
        old = self.vars.get(name, ENVIRONMENT)
        if index:
            value = Unknown(f"`{short(raw)}` (line {self.line}), not read here")
        elif op == "+=" and isinstance(value, list):
            old = [] if old is None or old is ENVIRONMENT else old  # arrays do not come from the environment
            value = old if isinstance(old, Unknown) else [*([old] if isinstance(old, Field) else old), *value]
        elif op == "+=" and isinstance(value, Field):
            if isinstance(old, Unknown):
                value = Unknown(old.why or f"{name}, the environment's: the script does not set it")
            else:
                first = Field() if old is None else old if isinstance(old, Field) else old[0] if old else Field()
                joined = Field(first.text, list(first.lacks))
                joined.add(value)
                value = joined if not isinstance(old, list) else [joined, *old[1:]]
        self.set(name, value)

    def value(self, name: str, index: str) -> Value:
        """A variable's value: a list for [@] and [*] (and $@); ENVIRONMENT where the script does not set it."""
        if name in ("@", "*") or name.isdigit() and name != "0":
            if not self.depth:
                self.assumed["read as run with no arguments: $@, $1, ... are empty"] = None
            if not name.isdigit():
                return list(self.args)
            return self.args[int(name) - 1] if int(name) <= len(self.args) else None
        if name == "#":
            return Field(str(len(self.args)))
        if not NAME.fullmatch(name):
            return Unknown(f"${name}, known only when the script runs")
        v = self.vars.get(name, ENVIRONMENT)
        if isinstance(v, Unknown) or v is None:
            return v
        elements = v if isinstance(v, list) else [v]
        if index in ("[@]", "[*]"):
            return elements
        k = self.arithmetic(index[1:-1]) if index else 0
        if not isinstance(k, int):
            return Unknown(k)
        return elements[k] if -len(elements) <= k < len(elements) else None

    def parameter(self, inner: str, text: str) -> Field | list[Field]:
        """${inner} (text: as written) expanded."""
        m = PARAMETER.fullmatch(inner)
        if not m or inner.startswith("!"):
            return lack(text, f"`{short(text)}`, not read here")
        length, name, index, rest = m.groups()
        index = index or ""
        v = self.value(name, index)
        op = next((o for o in (":-", ":=", ":+", ":?", "//", "##", "%%", "^^", ",,") if rest.startswith(o)), rest[:1])
        arg = rest[len(op) :]
        if op in (":-", ":=", ":+", ":?", "-", "=", "+", "?"):
            return self.default(name, v, op, arg, text)
        if v is ENVIRONMENT:
            return lack(text, f"${name}, the environment's: the script does not set it")
        if isinstance(v, Unknown):
            return lack(text, v.why)
        elements = [] if v is None else v if isinstance(v, list) else [v]
        if any(e.lacks for e in elements):
            if op or length:
                return lack(text, "; ".join(e.why() for e in elements if e.lacks))
            return elements if isinstance(v, list) else elements[0]
        if length:
            return Field(str(len(elements) if index in ("[@]", "[*]") else len(elements[0].text if elements else "")))
        done = [self.transform(e.text, op, arg) for e in elements]
        if any(d is None for d in done):
            return lack(text, f"`{short(text)}`, not read here")
        out = [Field(d) for d in done if d is not None]
        return out if index in ("[@]", "[*]") else out[0] if out else Field()

    def default(self, name: str, v: Value, op: str, arg: str, text: str) -> Field:
        """${NAME:-word}, ${NAME:=word}, ${NAME:+word}, ${NAME:?word} and their forms without the colon."""
        if v is ENVIRONMENT:
            if op.endswith("?"):
                return lack(text, f"{name}, which the environment must give (`{short(text)}`)")
            self.defaulted[name] = None
            v = None
        if isinstance(v, Unknown):
            return lack(text, v.why)
        value = (v[0] if v else Field()) if isinstance(v, list) else v
        if value is not None and value.lacks:
            return lack(text, value.why())
        unset = value is None or op.startswith(":") and not value.text
        if op.endswith("+"):
            return Field() if unset else self.word(arg)
        if value is not None and not unset:
            return value
        if op.endswith("?"):
            if self.maybe:
                return lack(text, f"{name}, unset here (`{short(text)}` would stop the script)")
            raise ValueError(f"line {self.line}: the script stops without {name}: {short(self.word(arg).text, 80)}")
        given = self.word(arg)
        if op.endswith("="):
            self.set(name, given)
        return given

    @staticmethod
    def transform(value: str, op: str, arg: str) -> str | None:
        """${NAME//pattern/string}, ${NAME#pattern}, ${NAME^^} ... on a known value; None for the others."""
        if op in ("/", "//"):
            split = re.fullmatch(r"((?:\\.|[^/\\])*)/?(.*)", arg, re.S)  # pattern/string, \/ a slash
            assert split is not None
            pattern, replacement = (part.replace("\\/", "/") for part in split.groups())
            if re.search(r"[*?\[\\\"'$]", pattern + replacement) or not pattern:
                return None
            return value.replace(pattern, replacement, -1 if op == "//" else 1)
        if op in ("#", "##", "%", "%%") and not re.search(r"[\"'$\\]", arg):
            cuts = range(len(value) + 1) if op in ("#", "%") else range(len(value), -1, -1)
            for k in cuts:
                part = value[:k] if op.startswith("#") else value[len(value) - k :]
                if fnmatch.fnmatchcase(part, arg):
                    return value[k:] if op.startswith("#") else value[: len(value) - k]
            return value
        return {"": value, "^^": value.upper(), ",,": value.lower()}.get(op)

    # words -----------------------------------------------------------------------------------------------

    def word(self, raw: str) -> Field:
        """raw expanded as one word (an assignment's value, a case subject): not split."""
        return self.expand(raw, split=False)[0]

    def expand(self, raw: str, split: bool = True) -> list[Field]:
        """The words raw gives: expansions made, split at blanks where unquoted (split), quotes removed."""
        out: list[Field] = []
        cur, i, dq = Field(), 0, False
        while i < len(raw):
            c = raw[i]
            every = EVERY.match(raw, i) if c == '"' and not dq else None
            if every:  # "${ARR[@]}", "$@": each element one word, none for none
                value = self.parameter(every.group(1).strip("${}"), every.group(1))
                elements = value if isinstance(value, list) else [value] if value.lacks or value.text else []
                for k, element in enumerate(elements):
                    if k:
                        out.append(cur)
                        cur = Field(quoted=True)
                    cur.add(element)
                    cur.quoted = True
                i = every.end()
            elif c == "'" and not dq:
                j = find(raw, "'", i + 1)
                cur.add(Field(raw[i + 1 : j]))
                cur.quoted, i = True, j + 1
            elif c == '"':
                dq, cur.quoted, i = not dq, True, i + 1
            elif c == "\\":
                escaped = raw[i + 1 : i + 2]
                cur.add(Field(("\\" if dq and escaped not in '$`"\\\n' else "") + escaped.replace("\n", "")))
                i += 2
            elif c in "$`":
                value, i = self.dollar(raw, i)
                fields = value if isinstance(value, list) else [value]
                scalar = Field()
                for k, element in enumerate(fields):
                    scalar.add(Field(" ") if k else Field())
                    scalar.add(element)
                pieces = scalar.pieces() if split and not dq else [scalar]
                cur.add(pieces[0])
                for piece in pieces[1:]:
                    if cur.text or cur.quoted or cur.lacks:
                        out.append(cur)
                    cur = piece
            else:
                cur.add(Field(c))
                i += 1
        if cur.text or cur.quoted or cur.lacks or not split:
            out.append(cur)
        return out

    def dollar(self, raw: str, i: int) -> tuple[Field | list[Field], int]:
        """The expansion at raw[i] ($ or a backtick) and the index past it."""
        if raw.startswith("$((", i):
            end = matching(raw, i + 1)
            value = self.arithmetic(raw[i + 3 : end - 2])
            return (Field(str(value)) if isinstance(value, int) else lack(raw[i:end], value)), end
        if raw.startswith("$(", i) or raw[i] == "`":
            end = matching(raw, i + 1) if raw[i] == "$" else find(raw, "`", i + 1) + 1
            return lack(raw[i:end], f"`{short(raw[i:end])}`, a command's output"), end
        if raw.startswith("${", i):
            end = matching(raw, i + 1)
            return self.parameter(raw[i + 2 : end - 1], raw[i:end]), end
        if raw.startswith("$'", i):
            end = find(raw, "'", i + 2) + 1
            return lack(raw[i:end], f"`{short(raw[i:end])}`, not read here"), end
        m = SIMPLE_PARAMETER.match(raw, i + 1)
        if not m:
            return Field("$"), i + 1
        return self.parameter(m.group(0), raw[i : m.end()]), m.end()

    # arithmetic and tests --------------------------------------------------------------------------------

    def arithmetic(self, expression: str) -> int | str:
        """$(( )) and (( )) over integers and the script's variables; why not, where it needs anything else."""
        field = self.word(expression.replace('"', ""))
        for target in assigned(field.text):  # x = 1, x += 2, x++: not evaluated here
            self.set(target, Unknown(f"{target}, set by `(({short(expression)}))` (line {self.line}), not read here"))
        if field.lacks:
            return field.why()
        missing: list[str] = []

        def name(m: re.Match) -> str:
            v = self.value(m.group(0), "")
            if v is None:
                return "0"  # the shell's unset variable
            if isinstance(v, Unknown):
                missing.append(v.why or f"{m.group(0)}, the environment's: the script does not set it")
            elif isinstance(v, Field) and v.lacks:
                missing.append(v.why())
            elif isinstance(v, Field) and re.fullmatch(r"\s*-?\d+\s*", v.text):
                return v.text.strip()
            else:
                missing.append(f"{m.group(0)}={short(v.text if isinstance(v, Field) else '')}, not an integer")
            return "0"

        text = NAME.sub(name, field.text)
        if missing:
            return missing[0]
        text = re.sub(r"&&", " and ", re.sub(r"\|\|", " or ", re.sub(r"!(?!=)", " not ", text)))
        try:
            return integer(ast.parse(text.strip(), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError):
            return f"`$(({short(expression)}))`, not read here"

    def test(self, args: list[tuple[Field, str]], double: bool) -> Status:
        """[ ] and [[ ]] over their words (expanded, as written): -n, -z, -v, =, ==, !=, -eq ..., =~, !, -a/&&,
        -o/||, ( ); a file test is not known here."""
        k = 0

        def peek() -> str:
            return args[k][1] if k < len(args) else ""

        def disjunction() -> Status:
            nonlocal k
            result = conjunction()
            while peek() in ("-o", "||"):
                k += 1
                result = combine(result, conjunction(), conjunction=False)
            return result

        def conjunction() -> Status:
            nonlocal k
            result = negation()
            while peek() in ("-a", "&&"):
                k += 1
                result = combine(result, negation(), conjunction=True)
            return result

        def negation() -> Status:
            nonlocal k
            if peek() == "!":
                k += 1
                result = negation()
                return not result if isinstance(result, bool) else result
            if peek() == "(":
                k += 1
                result = disjunction()
                k += peek() == ")"
                return result
            return primary()

        def primary() -> Status:
            nonlocal k
            if k + 2 < len(args) and args[k + 1][1] in BINARY_TESTS:
                (a, _), (_, op), (b, raw) = args[k : k + 3]
                k += 3
                return compare(a, op, b, glob=double and not re.search("[\"']", raw))
            if peek() in FILE_TESTS | {"-n", "-z", "-v"} and k + 1 < len(args):
                op, operand = args[k][1], args[k + 1][0]
                k += 2
                if operand.lacks:
                    return operand.why()
                if op in FILE_TESTS:
                    return f"a file test (`{op} {short(operand.text)}`)"
                return (operand.text == "") == (op == "-z") if op != "-v" else self.is_set(operand.text)
            k += 1
            return args[k - 1][0].why() if args[k - 1][0].lacks else args[k - 1][0].text != ""

        return disjunction() if args else False

    def is_set(self, name: str) -> Status:
        v = self.vars.get(name, ENVIRONMENT)
        if isinstance(v, Unknown):
            return v.why or f"{name}, the environment's: the script does not set it"
        return v is not None


ARITHMETIC_ASSIGNED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:[-+*/%]?=(?!=)|\+\+|--)|(?:\+\+|--)\s*([A-Za-z_]\w*)")
BINARY_TESTS = {"=", "==", "!=", "<", ">", "=~", "-nt", "-ot", "-ef", *INTEGER_TESTS}


def assigned(expression: str) -> list[str]:
    """The variables an arithmetic expression assigns (x = 1, x += 2, x++, --x)."""
    return [m.group(1) or m.group(2) for m in ARITHMETIC_ASSIGNED.finditer(expression)]


def combine(a: Status, b: Status, conjunction: bool) -> Status:
    """a and b (conjunction) or a or b, where either may be unknown (a reason)."""
    decisive = not conjunction  # False decides an and, True an or
    if a is decisive or b is decisive:
        return decisive
    return a if not isinstance(a, bool) else b


def compare(a: Field, op: str, b: Field, glob: bool) -> Status:
    if a.lacks or b.lacks:
        return a.why() if a.lacks else b.why()
    if op in INTEGER_TESTS:
        if not (re.fullmatch(r"\s*-?\d+\s*", a.text) and re.fullmatch(r"\s*-?\d+\s*", b.text)):
            return f"`{a.text} {op} {b.text}`, not integers"
        return INTEGER_TESTS[op](int(a.text), int(b.text))
    if op in ("=", "==", "!="):
        same = fnmatch.fnmatchcase(a.text, b.text) if glob else a.text == b.text
        return same == (op != "!=")
    if op == "=~":
        return re.search(b.text, a.text) is not None
    if op in ("<", ">"):
        return a.text < b.text if op == "<" else a.text > b.text
    return f"a file test (`{op}`)"


def integer(node: ast.AST) -> int:
    """An integer expression's value (ValueError for anything else)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp):
        value = integer(node.operand)
        ops = {ast.USub: -value, ast.UAdd: value, ast.Not: int(not value), ast.Invert: ~value}
        if type(node.op) in ops:
            return ops[type(node.op)]
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](integer(node.left), integer(node.right))
    if isinstance(node, ast.Compare) and all(type(op) in COMPARISONS for op in node.ops):
        values = [integer(node.left), *(integer(c) for c in node.comparators)]
        return int(all(COMPARISONS[type(op)](x, y) for op, x, y in zip(node.ops, values, values[1:])))
    if isinstance(node, ast.BoolOp):
        values = [bool(integer(v)) for v in node.values]
        return int(all(values) if isinstance(node.op, ast.And) else any(values))
    raise ValueError(ast.dump(node))
