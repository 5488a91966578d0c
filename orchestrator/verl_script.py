"""A verl launch script read as the shell would run it, for `meshrl config from-verl`: the settings its verl
command (`python3 -m verl.trainer.main_ppo key=value ...`) is given, in the forms verl ships its examples in
(examples/*/run_*.sh: settings in variables and arrays, `${VAR:-default}`, `if`/`case` on a variable).

    overrides, unread, assumed = read_script(text)   # {"actor_rollout_ref.rollout.n": 16, ...},
                                                      # {key: (as written, why)}, [what the reading took]

The script is parsed (quotes, escapes, line continuations, comments, here-documents, `if`/`case`/loops,
functions, `&&`/`||`, pipes) and run up to its first verl command without running any program: assignments
(scalars, arrays, `+=`, `export`/`declare`/`local`, `unset`), parameter expansions (`${VAR:-default}`,
`${VAR//a/b}`, `"${ARR[@]}"`, ...), integer arithmetic and tests (`[ "$X" = a ]`, `[[ ]]`, `(( ))`) are
evaluated, and each word is expanded and split as the shell splits it (an unquoted expansion at blanks, a
quoted one not; no globbing: no file is taken to match a pattern).

It is read as run with no arguments and with none of the variables it does not set in the environment:
`${MODEL_PATH:-Qwen/Qwen3-8B}` takes the script's default, and the names so read are listed in `assumed`.
What only running something would tell is not guessed: a command's output (`$(...)`), a variable only the
environment gives (`$HOME`, `${X:?...}`), a file test, what a branch on one of those sets, a loop's body.
A setting whose value needs one comes back in `unread` with the reason (orchestrator/from_verl.py leaves
out a path, refuses a training setting); where it is not known which settings a word gives (`$ARGS`
unknown, `"${EXTRA[@]}"` changed under such a branch), or the verl command runs only under one, the script
is refused here (ValueError) in one line naming what could not be read.
"""

import ast
import contextlib
import dataclasses
import fnmatch
import operator
import re
from collections.abc import Callable, Iterator

import yaml

from orchestrator.config import read_yaml
from orchestrator.verl_keys import ENTRY_POINTS

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^]]*\])?(\+?=)")
EVERY = re.compile(r'"(\$\{[A-Za-z_][A-Za-z0-9_]*\[@\]\}|\$@|\$\{@\})"')  # "${ARR[@]}", "$@"
SIMPLE_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")  # $NAME, $1, $@ ...
PARAMETER = re.compile(r"(#?)([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(\[[^]]*\])?(.*)", re.S)
META = " \t\n;&|<>()"  # unquoted, they end a word
OPERATORS: tuple[str, ...] = (
    "&&",
    "||",
    ";;&",
    ";;",
    ";&",
    "|&",
    "<<<",
    "<<-",
    "<<",
    "&>>",
    "&>",
    ">>",
    ">&",
    "<&",
    ">|",
    "<>",
)
OPERATORS += (";", "&", "|", "<", ">", "(", ")", "\n")
REDIRECTIONS = {"<<<", "<<-", "<<", "&>>", "&>", ">>", ">&", "<&", ">|", "<>", "<", ">"}
IN_TESTS = {"&&", "||", "(", ")", "<", ">"}  # words, not operators, inside [[ ]]
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


def is_script(text: str) -> bool:
    return any(entry in text for entry in ENTRY_POINTS)


def short(text: str, width: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def find(s: str, what: str, i: int) -> int:
    j = s.find(what, i)
    if j < 0:
        raise ValueError(f"line {s.count(chr(10), 0, i) + 1}: an unclosed {what}")
    return j


def quoted_end(s: str, i: int) -> int:
    """The index past the `"` closing a double-quoted string whose text starts at i."""
    while i < len(s) and s[i] != '"':
        if s[i] == "\\":
            i += 2
        elif s.startswith(("$(", "${"), i):
            i = matching(s, i + 1)
        elif s[i] == "`":
            i = find(s, "`", i + 1) + 1
        else:
            i += 1
    return find(s, '"', i) + 1


def matching(s: str, i: int) -> int:
    """The index past the bracket that closes the one at s[i], quoted text skipped."""
    opening = s[i]
    closing = {"(": ")", "{": "}"}[opening]
    depth = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c in "'`" or c == '"':
            i = find(s, c, i + 1) + 1 if c != '"' else quoted_end(s, i + 1)
            continue
        if c == "#" and opening == "(" and s[i - 1] in " \t\n(":  # a comment, to the end of its line
            i = s.find("\n", i) if "\n" in s[i:] else len(s)
            continue
        depth += (c == opening) - (c == closing)
        i += 1
        if depth == 0:
            return i
    raise ValueError(f"line {s.count(chr(10), 0, i) + 1}: an unclosed {opening}")


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


@dataclasses.dataclass
class Node:
    """One command: "simple" (words as written), "if" (arms: [(condition or None for else, body)]), "case"
    (words: [subject]; arms: [(patterns, body)]), "loop" (arms: [(condition, body)]), "function" (words:
    [name]; body), "group" and "subshell" (body), "arith" (words: [expression])."""

    kind: str
    line: int
    text: str  # its first line, for messages
    words: list[str] = dataclasses.field(default_factory=list)
    arms: list[tuple] = dataclasses.field(default_factory=list)
    body: list = dataclasses.field(default_factory=list)


Step = tuple[str, bool, list[Node]]  # (the operator before it: "", "&&" or "||"; negated by !; a pipeline)
Commands = list[list[Step]]


class Parser:
    """The script's commands, as the shell parses them."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0
        self.heredocs: list[tuple[str, bool]] = []  # (delimiter, tabs stripped) to skip at the next newline

    def line(self, i: int) -> int:
        return self.s.count("\n", 0, i) + 1

    def blank(self) -> None:
        while self.i < len(self.s):
            if self.s[self.i] in " \t":
                self.i += 1
            elif self.s.startswith("\\\n", self.i):
                self.i += 2
            elif self.s[self.i] == "#":  # a comment, to the end of the line
                j = self.s.find("\n", self.i)
                self.i = len(self.s) if j < 0 else j
            else:
                return

    def token(self, in_test: bool = False) -> tuple[str, str] | None:
        """The next ("op", operator) or ("word", as written); None at the end."""
        self.blank()
        if self.i >= len(self.s):
            return None
        op = next((op for op in OPERATORS if self.s.startswith(op, self.i)), "")
        if op and not (in_test and op in IN_TESTS):
            self.i += len(op)
            if op == "\n":
                self.skip_heredocs()
            return "op", op
        start = self.i
        self.i = self.word_end(start) if not op else start + len(op)
        word = self.s[start : self.i]
        if word.isdigit() and self.s[self.i : self.i + 1] in ("<", ">"):  # 2>&1: a descriptor, not a word
            return self.token(in_test)
        return "word", word

    def peek(self, in_test: bool = False) -> tuple[str, str] | None:
        i, heredocs = self.i, list(self.heredocs)
        t = self.token(in_test)
        self.i, self.heredocs = i, heredocs
        return t

    def word_end(self, start: int) -> int:
        s, i = self.s, start
        while i < len(s) and s[i] not in META:
            if s[i] == "\\":
                i += 2
            elif s[i] in "'`":
                i = find(s, s[i], i + 1) + 1
            elif s[i] == '"':
                i = quoted_end(s, i + 1)
            elif s.startswith(("$(", "${"), i):
                i = matching(s, i + 1)
            elif s.startswith("=(", i) and ASSIGNMENT.fullmatch(s[start : i + 1]):  # an array: NAME=(...)
                i = matching(s, i + 1)
            else:
                i += 1
        return i

    def skip_heredocs(self) -> None:
        for delimiter, tabs in self.heredocs:
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                body_line = self.s[self.i : end]
                self.i = end + 1
                if (body_line.lstrip("\t") if tabs else body_line) == delimiter:
                    break
        self.heredocs = []

    def word(self) -> str:
        t = self.token()
        if t is None or t[0] != "word":
            raise ValueError(f"line {self.line(self.i)}: a word expected, not {t[1] if t else 'the end'!r}")
        return t[1]

    def expect(self, word: str) -> None:
        t = self.token()
        if t is None or t[1] != word:
            raise ValueError(f"line {self.line(self.i)}: `{word}` expected, not {t[1] if t else 'the end'!r}")

    def newlines(self) -> None:
        while self.peek() == ("op", "\n"):
            self.token()

    def commands(self, stop: set[str]) -> Commands:
        """The commands up to a word or operator in stop (not taken), or the end."""
        out: Commands = []
        while (t := self.peek()) is not None and t[1] not in stop:
            if t[0] == "op" and t[1] in ("\n", ";", "&"):
                self.token()
            else:
                out.append(self.and_or())
        return out

    def and_or(self) -> list[Step]:
        steps = [("", *self.pipeline())]
        while (t := self.peek()) is not None and t[1] in ("&&", "||"):
            self.token()
            self.newlines()
            steps.append((t[1], *self.pipeline()))
        return steps

    def pipeline(self) -> tuple[bool, list[Node]]:
        negated = self.peek() == ("word", "!")
        if negated:
            self.token()
        nodes = [self.command()]
        while (t := self.peek()) is not None and t[1] in ("|", "|&"):
            self.token()
            self.newlines()
            nodes.append(self.command())
        return negated, nodes

    def command(self) -> Node:
        self.blank()
        start = self.i
        end = self.s.find("\n", start)
        node = Node("", self.line(start), short(self.s[start : len(self.s) if end < 0 else end]))
        t = self.peek()
        word = t[1] if t and t[0] == "word" else ""
        if word in ("if", "case", "for", "while", "until", "select", "{", "function"):
            self.compound(node, word)
        elif self.s.startswith("((", start):
            self.i = matching(self.s, start)
            node.kind, node.words = "arith", [self.s[start + 2 : self.i - 2]]
        elif t == ("op", "("):
            self.token()
            node.kind, node.body = "subshell", self.commands({")"})
            self.expect(")")
        elif NAME.fullmatch(word) and (parens := re.compile(r"\s*\(\s*\)").match(self.s, start + len(word))):
            self.i = parens.end()
            self.newlines()
            node.kind, node.words, node.body = "function", [word], [[("", False, [self.command()])]]
        else:
            node.kind, node.words = "simple", self.simple()
        if node.kind != "simple":
            self.simple(required=False)  # a compound command's redirections
        return node

    def compound(self, node: Node, word: str) -> None:
        self.token()
        if word == "if":
            node.kind = "if"
            while True:
                condition = self.commands({"then"})
                self.expect("then")
                node.arms.append((condition, self.commands({"elif", "else", "fi"})))
                t = self.token()
                if t == ("word", "else"):
                    node.arms.append((None, self.commands({"fi"})))
                    self.expect("fi")
                if t not in (("word", "elif"), ("word", "else"), ("word", "fi")):
                    raise ValueError(f"line {node.line}: an if without its fi")
                if t != ("word", "elif"):
                    return
        elif word == "case":
            node.kind, node.words = "case", [self.word()]
            self.newlines()
            self.expect("in")
            node.arms = self.case_arms()
        elif word == "{":
            node.kind, node.body = "group", self.commands({"}"})
            self.expect("}")
        elif word == "function":
            node.kind, node.words = "function", [self.word()]
            self.blank()
            if self.s.startswith("(", self.i):
                self.i = matching(self.s, self.i)
            self.newlines()
            node.body = [[("", False, [self.command()])]]
        else:  # for, while, until, select: their body runs a number of times not known here
            self.blank()
            if self.s.startswith("((", self.i):
                self.i = matching(self.s, self.i)
            condition = self.commands({"do"})
            self.expect("do")
            node.kind, node.words = "loop", [word]
            node.arms = [(condition if word in ("while", "until") else None, self.commands({"done"}))]
            self.expect("done")

    def case_arms(self) -> list[tuple]:
        arms: list[tuple] = []
        while True:
            self.newlines()
            t = self.token()
            if t is None or t == ("word", "esac"):
                return arms
            t = self.token() if t == ("op", "(") else t
            patterns = []
            while t is not None and t[0] == "word":
                patterns.append(t[1])
                t = self.token()
                t = self.token() if t == ("op", "|") else t
            if t != ("op", ")"):
                raise ValueError(f"line {self.line(self.i)}: a case pattern without its )")
            arms.append((patterns, self.commands({";;", ";&", ";;&", "esac"})))
            if (t := self.peek()) is not None and t[1] in (";;", ";&", ";;&"):
                self.token()

    def simple(self, required: bool = True) -> list[str]:
        """A simple command's words as written (redirections and here-documents left out)."""
        words: list[str] = []
        start = self.i
        while True:
            in_test = words[:1] == ["[["] and "]]" not in words
            if (t := self.peek(in_test)) is None:
                break
            if t[0] == "word":
                words.append(t[1])
                self.token(in_test)
            elif t[1] in REDIRECTIONS:
                self.token()
                target = self.token()
                if target is None or target[0] != "word":
                    raise ValueError(f"line {self.line(self.i)}: a redirection without its target")
                if t[1] in ("<<", "<<-"):
                    self.heredocs.append((re.sub(r"[\"'\\]", "", target[1]), t[1] == "<<-"))
            else:
                break
        if required and self.i == start and t is not None:  # nothing read: it would stay where it is
            raise ValueError(f"line {self.line(self.i)}: unexpected {t[1]!r}")
        return words


class Found(Exception):
    """The verl command, reached: its settings."""

    def __init__(self, overrides: dict[str, object], unread: dict[str, tuple[str, str]]) -> None:
        self.overrides, self.unread = overrides, unread


class Stop(Exception):
    """exit or return: the rest of the script (or function) does not run."""


class Shell:
    """The script run up to its verl command, with no program run: variables, expansions and tests."""

    def __init__(self) -> None:
        self.vars: dict[str, Value] = {}
        self.functions: dict[str, Node] = {}
        self.args: list[Field] = []  # $1 ...: none at the top
        self.depth = 0  # function calls in progress
        self.scopes: list[dict[str, Value]] = []  # per call: its locals' values before it
        self.maybe = ""  # where the commands now run may not run, and on what that depends
        self.line = 0
        self.defaulted: dict[str, None] = {}  # names the environment could set: the script's default taken
        self.assumed: dict[str, None] = {}

    # running ---------------------------------------------------------------------------------------------

    def run(self, commands: Commands) -> Status:
        status: Status = True
        for steps in commands:
            status = self.chain(steps)
        return status

    def chain(self, steps: list[Step]) -> Status:
        status: Status = True
        for k, (op, negated, nodes) in enumerate(steps):
            if op == "&&" and status is False or op == "||" and status is True:
                continue
            if op and not isinstance(status, bool):  # the one before may have failed or not
                first = steps[k - 1][2][0]
                with self.under(f"`{first.text}` (line {first.line}), which depends on {status}"):
                    self.pipeline(negated, nodes)
                continue
            status = self.pipeline(negated, nodes)
        return status

    def pipeline(self, negated: bool, nodes: list[Node]) -> Status:
        if len(nodes) == 1:
            status = self.node(nodes[0])
        else:  # each command of a pipe runs in a subshell
            status = True
            for node in nodes:
                status = self.isolated([[("", False, [node])]])
        return (not status if isinstance(status, bool) else status) if negated else status

    def isolated(self, commands: Commands) -> Status:
        saved = dict(self.vars), dict(self.functions), list(self.args)
        try:
            return self.run(commands)
        finally:
            self.vars, self.functions, self.args = saved[0], saved[1], saved[2]

    @contextlib.contextmanager
    def under(self, where: str) -> Iterator[None]:
        """Commands that may or may not run: what they set is not known after them."""
        saved = self.maybe
        self.maybe = saved or where
        try:
            yield
        except Stop:  # a branch that exits does not lead to the verl command
            pass
        finally:
            self.maybe = saved

    def node(self, node: Node) -> Status:
        self.line = node.line  # for what expansions say
        if node.kind == "simple":
            return self.simple(node)
        if node.kind in ("if", "case"):
            return self.branch(node)
        if node.kind == "loop":
            condition, body = node.arms[0]
            status = self.run(condition) if condition else "how many times it runs"
            if status is False and node.words[0] == "while" or status is True and node.words[0] == "until":
                return True  # the test stops it at once: no iteration
            with self.under(f"the loop `{node.text}` (line {node.line}), run a number of times not known here"):
                self.run(body)
            return True
        if node.kind == "function":
            self.functions[node.words[0]] = node
            return True
        if node.kind == "subshell":
            return self.isolated(node.body)
        if node.kind == "arith":
            value = self.arithmetic(node.words[0])
            return value != 0 if isinstance(value, int) else value
        return self.run(node.body)  # a { } group

    def branch(self, node: Node) -> Status:
        """if/elif/else or case: the arm taken; where it is not known which, all of them, as may-run."""
        subject = self.word(node.words[0]) if node.kind == "case" else Field()
        for k, (test, body) in enumerate(node.arms):
            status = self.matches(subject, test) if node.kind == "case" else True if test is None else self.run(test)
            if status is True:
                return self.run(body)
            if status is not False:
                where = f"`{node.text}` (line {node.line}), which depends on {status}"
                for test, body in node.arms[k:]:
                    with self.under(where):
                        if node.kind == "if" and test is not None:
                            self.run(test)
                        self.run(body)
                return status
        return True

    def matches(self, subject: Field, patterns: list[str]) -> Status:
        """Whether a case arm's patterns match its subject."""
        if subject.lacks:
            return subject.why()
        for raw in patterns:
            pattern = self.word(raw)
            if pattern.lacks:
                return pattern.why()
            quoted = "'" in raw or '"' in raw
            if subject.text == pattern.text or not quoted and fnmatch.fnmatchcase(subject.text, pattern.text):
                return True
        return False

    def simple(self, node: Node) -> Status:
        k = 0
        while k < len(node.words) and ASSIGNMENT.match(node.words[k]):
            k += 1
        assignments, words = node.words[:k], node.words[k:]
        if words[:1] == ["[["]:  # no splitting inside [[ ]]
            return self.test([(self.word(w), w) for w in words[1:-1]], double=True)
        fields = [f for w in words for f in self.expand(w)]
        if not fields:
            for raw in assignments:
                self.assign(raw)
            return True
        entry = next((i for i, f in enumerate(fields) if f.text in ENTRY_POINTS and not f.lacks), None)
        if entry is not None:
            if self.maybe:
                raise ValueError(f"line {node.line}: its verl command runs only under {self.maybe}")
            raise Found(*settings(fields[entry + 1 :], node.line))
        return self.builtin(fields, words, node)

    def builtin(self, fields: list[Field], words: list[str], node: Node) -> Status:
        name = "" if fields[0].lacks else fields[0].text
        if name in ("true", ":", "false"):
            return name != "false"
        if name in ("[", "test"):
            args = fields[1:-1] if name == "[" else fields[1:]
            return self.test([(f, f.text if not f.quoted else "") for f in args], double=False)
        if name in SETTERS:
            return self.setter(name, fields, words, node)
        if name in ("eval", "source", "."):
            self.assumed[f"`{node.text}` (line {node.line}) is taken to set none of the script's variables"] = None
        if name == "set" and len(fields) > 1 and fields[1].text == "--":
            self.args = fields[2:]
        if name == "shift":
            self.args = self.args[1:]
        if name in ("exit", "return"):
            if not self.maybe and not (name == "return" and self.depth):
                raise ValueError(f"line {node.line}: the script ends (`{node.text}`) before its verl command")
            raise Stop
        if name in self.functions:
            return self.call(self.functions[name], fields[1:])
        return f"whether `{node.text}` (line {node.line}) succeeds"

    def setter(self, name: str, fields: list[Field], words: list[str], node: Node) -> Status:
        """export/declare/local (assignments), unset, and read and the like (what they set is not known)."""
        names = [f.text for f in fields[1:] if NAME.fullmatch(f.text)]
        if name in ("local", "declare", "typeset") and self.scopes:  # in a function: until it returns
            for n in names + [m.group(1) for w in words[1:] if (m := ASSIGNMENT.match(w))]:
                self.scopes[-1].setdefault(n, self.vars.get(n, ENVIRONMENT))
        if name == "unset":
            for n in names:
                self.set(n, None)
        elif name in ("read", "mapfile", "readarray", "getopts", "let", "printf"):
            names += [n for f in fields[1:] for n in assigned(f.text)] if name == "let" else []
            for n in names:
                self.vars[n] = Unknown(f"{n}, set by `{node.text}` (line {node.line})")
            return f"whether `{node.text}` (line {node.line}) succeeds"
        for raw in words[1:]:
            if ASSIGNMENT.match(raw):
                self.assign(raw)
        return True

    def call(self, function: Node, args: list[Field]) -> Status:
        if self.depth > 16:
            raise ValueError(f"line {function.line}: {function.words[0]} calls itself too deep to read")
        saved, self.args = self.args, args
        self.depth += 1
        self.scopes.append({})
        try:
            return self.run(function.body)
        except Stop:
            return True
        finally:
            self.args = saved
            self.depth -= 1
            for name, value in self.scopes.pop().items():  # its locals: the values before the call again
                if value is ENVIRONMENT:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = value

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
SETTERS = {"export", "declare", "typeset", "local", "readonly", "unset", "read", "mapfile", "readarray", "getopts"}
SETTERS |= {"let", "printf"}
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


def words_of(text: str) -> list[str]:
    """The words of an array's ( ... ) as written: blanks, newlines and comments between them."""
    parser, out = Parser(text), []
    while (t := parser.token()) is not None:
        if t[0] == "word":
            out.append(t[1])
    return out


def hydra_value(text: str) -> object:
    """A command-line value as Hydra reads it: YAML's scalars and flow lists (True, 1e-6 a float, null,
    ["console","wandb"]); '' for an empty value."""
    if not text:
        return ""
    if text.lower() in ("yes", "no", "on", "off", "y", "n"):  # YAML 1.1's booleans, Hydra's strings
        return text
    try:
        return read_yaml(text)
    except yaml.YAMLError:
        return text


def settings(fields: list[Field], line: int) -> tuple[dict[str, object], dict[str, tuple[str, str]]]:
    """({verl key: value}, {key: (as written, why it is not read)}) of the verl command's words after its
    module; ValueError where which keys a word sets is not known here."""
    overrides: dict[str, object] = {}
    unread: dict[str, tuple[str, str]] = {}
    for f in fields:
        eq = next((k for k, c in enumerate(f.text) if c == "=" and not any(a <= k < b for a, b, _ in f.lacks)), -1)
        if any(eq < 0 or a < eq for a, _, _ in f.lacks):
            why = "; ".join(dict.fromkeys(w for a, _, w in f.lacks if eq < 0 or a < eq))
            raise ValueError(f"line {line}: which verl settings `{short(f.text)}` gives needs {why}")
        key, value = (f.text[:eq], f.text[eq + 1 :]) if eq >= 0 else (f.text, "")
        key = key.lstrip("+")
        if key.startswith("-"):
            unread[key] = (value, "a Hydra option: verl's ppo_trainer config is assumed underneath")
        elif eq < 0 or key.startswith("~"):
            unread[f.text] = (f.text, "not a key=value setting: give it to meshrl as section.key=value")
        elif f.lacks:
            unread[key] = (value, f"needs the shell ({f.why()})")
            overrides.pop(key, None)
        else:
            overrides[key] = hydra_value(value)
            unread.pop(key, None)
    return overrides, unread


def read_script(text: str) -> tuple[dict[str, object], dict[str, tuple[str, str]], list[str]]:
    """({verl key: value} as the script's first verl command sets them, {key: (as written, why it is not
    read)}, [what the reading took: the script's defaults for what the environment would set, ...])."""
    shell = Shell()
    try:
        shell.run(Parser(text).commands(set()))
    except Found as found:
        assumed = list(shell.assumed)
        if shell.defaulted:
            names = ", ".join(shell.defaulted)
            assumed.insert(0, f"its own defaults, as if the environment set none of: {names}")
        return found.overrides, found.unread, assumed
    except Stop:
        raise ValueError("the script ends before its verl command") from None
    raise ValueError(f"no verl command ({' or '.join(ENTRY_POINTS)}) in the script")
