"""A shell script's syntax, as bash parses it: quotes, escapes, line continuations, comments,
here-documents, `if`/`case`/loops, functions, `{ }` and `( )`, `&&`/`||`, pipes and redirections. Nothing
is expanded here (orchestrator/shell_words.py) and nothing runs (orchestrator/shell.py).

    commands = Parser(text).commands(set())   # [[(op, negated, [Node, ...]), ...], ...]

A simple command's words come back as written (quotes and expansions in them), a compound command as a
Node with its parts; a here-document's body is skipped, a redirection's target left out.
"""

import dataclasses
import re

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^]]*\])?(\+?=)")

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


def words_of(text: str) -> list[str]:
    """The words of an array's ( ... ) as written: blanks, newlines and comments between them."""
    parser, out = Parser(text), []
    while (t := parser.token()) is not None:
        if t[0] == "word":
            out.append(t[1])
    return out
