"""A shell script read as bash would run it, up to a command sought (for `meshrl config from-verl`, the
verl command: orchestrator/verl_script.py), without running any program.

    shell = Shell({"verl.trainer.main_ppo"}, "its verl command")
    fields, line = shell.reach(text)   # the words after the target, as the shell would give them
    shell.taken()                      # what the reading took: the script's defaults for the environment's

Its commands (orchestrator/shell_syntax.py) are run in order: assignments (scalars, arrays, `+=`,
`export`/`declare`/`local`, `unset`), functions and their calls, `&&`/`||`, `if`/`case` on what is known,
tests and arithmetic; each word is expanded and split as bash splits it (orchestrator/shell_words.py: an
unquoted expansion at blanks, a quoted one not; no globbing: no file is taken to match a pattern).

It is read as run with no arguments and with none of the variables it does not set in the environment:
`${MODEL_PATH:-Qwen/Qwen3-8B}` takes the script's default, and the names so read are listed in `taken()`.
What only running something would tell is not guessed: a command's output (`$(...)`), a variable only the
environment gives (`$HOME`, `${X:?...}`), a file test, what a branch on one of those sets, a loop's body.
A word whose value needs one carries the reason (Field.lacks); where the command sought runs only under
such a branch, or the script ends before it, the reading is refused (ValueError) in one line.
"""

import contextlib
import fnmatch
from collections.abc import Collection, Iterator

from orchestrator.shell_syntax import ASSIGNMENT, NAME, Commands, Node, Parser, Step
from orchestrator.shell_words import ENVIRONMENT, Field, Status, Unknown, Words, assigned

SETTERS = {"export", "declare", "typeset", "local", "readonly", "unset", "read", "mapfile", "readarray", "getopts"}
SETTERS |= {"let", "printf"}


class Stop(Exception):
    """exit or return: the rest of the script (or function) does not run."""


class Reached(Exception):
    """The command sought, reached: the words after its target, expanded, and its line."""

    def __init__(self, fields: list[Field], line: int) -> None:
        self.fields, self.line = fields, line


class Shell(Words):
    """A script run up to the first command naming one of `targets`, with no program run."""

    def __init__(self, targets: Collection[str], goal: str) -> None:
        super().__init__()
        self.targets = targets
        self.goal = goal  # the command sought, as messages name it ("its verl command")
        self.functions: dict[str, Node] = {}

    def reach(self, text: str) -> tuple[list[Field], int] | None:
        """The words after the target of the script's first command that names one, and its line; None
        where no command does. ValueError where the script ends before it, or runs it only under a branch
        not known here."""
        try:
            self.run(Parser(text).commands(set()))
        except Reached as reached:
            return reached.fields, reached.line
        except Stop:
            raise ValueError(f"the script ends before {self.goal}") from None
        return None

    def taken(self) -> list[str]:
        """What the reading took: the script's defaults for what the environment would set, and the like."""
        assumed = list(self.assumed)
        if self.defaulted:
            names = ", ".join(self.defaulted)
            assumed.insert(0, f"its own defaults, as if the environment set none of: {names}")
        return assumed

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
        except Stop:  # a branch that exits does not lead to the command sought
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
        entry = next((i for i, f in enumerate(fields) if f.text in self.targets and not f.lacks), None)
        if entry is not None:
            if self.maybe:
                raise ValueError(f"line {node.line}: {self.goal} runs only under {self.maybe}")
            raise Reached(fields[entry + 1 :], node.line)
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
                raise ValueError(f"line {node.line}: the script ends (`{node.text}`) before {self.goal}")
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
