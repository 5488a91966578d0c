"""The bundled tool environment: a calculator for arithmetic problems.

Each turn the policy either calls the tool, writing <calc>EXPR</calc> (integers, + - * // % and
parentheses), and gets <result>VALUE</result> back, or answers: a turn without a call is its final
answer, scored 1.0 if its last integer equals the task's ground truth, else 0.0, and the episode ends.
A call the calculator cannot evaluate gets <result>error: ...</result>, so the policy can learn from it.
A run stops generation at "</calc>" (the rollout's stop string) so that each call is its own turn.

In the model's own tool format (a run with rollout.tool_parser, e.g. Qwen's Hermes-style <tool_call>),
the run lists TOOLS through the chat template, parses the policy's calls and sends them here:
call("calculator", {"expression": "12*7"}) answers "84" (or "error: ..."); a turn without a call is
the final answer, scored as above.
"""

import ast
import operator
import re

from meshrl.tiny.arithmetic import CALCULATOR

CALL = re.compile(r"<calc>(.*?)(?:</calc>|$)", re.DOTALL)
INTEGER = re.compile(r"-?\d+")
OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_CHARS = 200  # an expression longer than this is refused
MAX_DIGITS = 60  # and so is any value wider than this


def evaluate(expression: str) -> int:
    """The value of an integer expression; ValueError naming what is wrong otherwise."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression.strip()!r}") from None

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            out = -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            out = OPS[type(node.op)](left, right)
        else:
            raise ValueError(f"only integers and + - * // % are allowed, got {ast.unparse(node)!r}")
        if len(str(abs(out))) > MAX_DIGITS:
            raise ValueError(f"a value wider than {MAX_DIGITS} digits")
        return out

    return value(tree.body)


class Calculator:
    """One episode: the task's ground truth, and how many calls the policy made."""

    STOP = ["</calc>"]  # a run stops each turn there (the service's Describe tells it)
    TOOLS = [CALCULATOR]  # the same tool, for a run in the model's own tool format

    def reset(self, task: dict, seed: int | None = None) -> str:
        truth = task.get("ground_truth")
        if truth is None:
            truth = (task.get("reward_model") or {}).get("ground_truth")
        self.truth, self.calls, self.errors = None if truth is None else str(truth).strip(), 0, 0
        return ""

    def call(self, name: str, arguments: dict) -> str:
        """One tool call in the model's own format: the value, or "error: ..." (the policy can learn from it)."""
        expression = arguments.get("expression")
        if name != "calculator" or not isinstance(expression, str):
            self.calls, self.errors = self.calls + 1, self.errors + 1
            return f'error: the tool is calculator and takes {{"expression": "..."}}, got {name!r} {arguments!r:.60}'
        return self.result(expression)

    def result(self, expression: str) -> str:
        self.calls += 1
        try:
            return str(evaluate(expression))
        except ValueError as e:
            self.errors += 1
            return f"error: {e}"

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        call = CALL.search(action)
        if call is not None:
            result = self.result(call.group(1))
            return f"<result>{result}</result>", 0.0, False, {"tool": "calc", "result": result}
        numbers = INTEGER.findall(action)
        pred = numbers[-1] if numbers else None
        correct = pred is not None and self.truth is not None and pred == self.truth
        return (
            "",
            float(correct),
            True,
            {"acc": correct, "pred": pred, "tool_calls": self.calls, "tool_errors": self.errors},
        )
