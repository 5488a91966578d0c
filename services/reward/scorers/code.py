"""Code graded by running it: the response's program against the row's test cases, each case a Run in the
sandbox service (services/sandbox), whose address the reward service's `--sandbox` gives (the
MESHRL_SANDBOX variable its workers inherit). The score is the fraction of cases passed.

ground_truth, a JSON string or its object, in the shapes users' code data has:
- stdin/stdout cases (verl's and PRIME's code rows, APPS, CodeContests, TACO): {"inputs": [...],
  "outputs": [...]}; the program reads each input on stdin and passes when its stdout equals the output,
  line by line, ends of lines and of the text ignored;
- call cases (APPS's and TACO's call-based rows): the same with "fn_name"; each input is the function's
  arguments (a JSON list), its result is compared with the output as JSON (an output of one value in a
  list, as APPS writes them, also matches that value). All of a sample's calls run in one sandbox, one
  after another, within one time limit (a sandbox a case would cost its start each time); the results come
  back behind a mark the program cannot know in advance (one that reads its own file could forge them);
- assert-style tests (MBPP's test_list, HumanEval's checks): {"asserts": [...]} or a plain list of
  statements, each run after the program; it passes when the process ends 0 having printed a mark the
  test writes after its assert (a program that exits early does not pass; one that reads the mark from its
  own file could, as in the peers' sandboxes: one process holds both). The asserts take no value of a
  class the program defined, and builtins as they were before it ran (scorers/asserts.py): an object
  whose __eq__ always says True passes nothing.

The program is the last ```python (or plain ```) block of the response, or the whole response without one.
Each sandbox has `extra_info["timeout"]` seconds of wall and CPU time (default CASE_S). A case the sandbox
could not run (unreachable, refusing) raises: the sample fails and the reward service counts it failed
(reward.on_error), never a silent 0.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import secrets

from meshrl.clients import sandbox
from meshrl.clients.sandbox import VAR
from meshrl.v1 import sandbox_pb2
from services.reward.scorers import asserts

CASE_S = 5.0
MOST_AT_ONCE = 8  # a sample's cases run side by side, at most this many
FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.S)
CALLS = """
import json as _json, sys as _sys
_out = []
for _args in _json.loads(_sys.stdin.read()):
    try:
        _out.append([True, {fn}(*_args)])
    except Exception:
        _out.append([False, None])
print({mark!r} + _json.dumps(_out))
"""


def program(response: str) -> str:
    blocks = FENCE.findall(response)
    return blocks[-1] if blocks else response


def cases(ground_truth) -> tuple[str, list]:
    """("stdin" | "call" | "assert", its cases) from any of the shapes above; ValueError otherwise."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(truth, list) and all(isinstance(t, str) for t in truth):
        return "assert", truth
    if isinstance(truth, dict) and isinstance(truth.get("asserts"), list):
        return "assert", list(truth["asserts"])
    if isinstance(truth, dict) and isinstance(truth.get("inputs"), list) and isinstance(truth.get("outputs"), list):
        if len(truth["inputs"]) != len(truth["outputs"]):
            raise ValueError(f"{len(truth['inputs'])} inputs for {len(truth['outputs'])} outputs")
        pairs = list(zip(truth["inputs"], truth["outputs"]))
        return ("call", [(truth["fn_name"], *p) for p in pairs]) if truth.get("fn_name") else ("stdin", pairs)
    raise ValueError('ground_truth must hold {"inputs", "outputs"} (and "fn_name"), or assert statements')


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def passes(code: str, kind: str, case, seconds: float) -> bool:
    """One case, run in a new sandbox; whether the program passed it."""
    limits = sandbox_pb2.Limits(wall_s=seconds, cpu_s=seconds)
    if kind == "stdin":
        given, want = case
        reply = run(code, str(given).encode(), limits)
        return reply.exit_code == 0 and lines(reply.stdout.decode(errors="replace")) == lines(str(want))
    mark = secrets.token_hex(8)
    reply = run(asserts.script(code, case, secrets.token_hex(4), mark), b"", limits)
    return reply.exit_code == 0 and reply.stdout.decode(errors="replace").rstrip().endswith(mark)


def calls(code: str, tests: list, seconds: float) -> int:
    """Call cases, all in one sandbox (one program, its calls in turn, one time limit): how many passed.
    The results come back on a line behind a mark the program cannot know before it runs."""
    mark = secrets.token_hex(8)
    harness = code + CALLS.format(fn=tests[0][0], mark=mark)
    reply = run(
        harness, json.dumps([args for _, args, _ in tests]).encode(), sandbox_pb2.Limits(wall_s=seconds, cpu_s=seconds)
    )
    last = reply.stdout.decode(errors="replace").rstrip().rsplit("\n", 1)[-1]
    if reply.exit_code != 0 or not last.startswith(mark):
        return 0
    try:
        results = json.loads(last[len(mark) :])
        return sum(
            ok is True and (got == want or (isinstance(want, list) and len(want) == 1 and got == want[0]))
            for (ok, got), (_, _, want) in zip(results, tests)
        )
    except (ValueError, TypeError):  # not the harness's line: a program that printed the mark itself
        return 0


def run(code: str, stdin: bytes, limits: sandbox_pb2.Limits) -> sandbox_pb2.RunResponse:
    request = sandbox_pb2.RunRequest(argv=["python3", "main.py"], files={"main.py": code.encode()}, stdin=stdin)
    request.limits.CopyFrom(limits)
    return sandbox.run(request)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    kind, tests = cases(ground_truth)
    if not tests:
        raise ValueError("ground_truth holds no test cases")
    seconds = float((extra_info or {}).get("timeout") or CASE_S)
    code = program(solution_str)
    if kind == "call":
        passed = calls(code, tests, seconds)
    else:
        with concurrent.futures.ThreadPoolExecutor(min(MOST_AT_ONCE, len(tests))) as pool:
            passed = sum(pool.map(lambda case: passes(code, kind, case, seconds), tests))
    return {"score": passed / len(tests), "acc": passed == len(tests), "passed": passed, "total": len(tests)}


__all__ = ["VAR", "compute_score"]
