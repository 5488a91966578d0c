"""The two forms of a user reward function, told apart by its signature: verl's and TRL's.

    verl:  compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict
           (batched: data_sources, solution_strs, ground_truths, extra_infos -> list)
    TRL:   reward_fn(completions, **kwargs) -> list[float | None]
           (batched always; prompts, completions and the dataset's columns by keyword)

A function that declares `completions` is TRL's; any other is verl's, and must be one verl could call.
Shared by the reward service, which calls the function, and the run's preflight, which reads its
signature from the file (without running it) so that a function of neither form stops the run before
anything starts, and so that it knows what the function reads from each row.
"""

import ast
import inspect
import pathlib
from collections.abc import Mapping

VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
VERL_BATCHED_PARAMS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
# what TRL's GRPOTrainer passes besides the dataset's columns; the reward service passes prompts and
# completions (it scores text: no completion_ids, and no trainer_state, log_extra or log_metric)
TRL_PASSED = ("prompts", "completions")
TRL_OWN = (*TRL_PASSED, "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")

Params = Mapping[str, inspect.Parameter]


def form(params: Params | None, batched: bool, spec: str) -> str:
    """ "trl" or "verl" for a function with these parameters (None: unreadable, a builtin: verl, passed
    everything); ValueError, one line, for a function of neither form."""
    if params is None:
        return "verl"
    positional_only = [n for n, p in params.items() if p.kind is p.POSITIONAL_ONLY]
    if is_trl(params):
        if positional_only:
            raise ValueError(
                f"{spec}: parameter(s) {positional_only} are positional-only; TRL passes its arguments by "
                "keyword (prompts=..., completions=..., and the dataset's columns)"
            )
        return "trl"
    names = VERL_BATCHED_PARAMS if batched else VERL_PARAMS
    unknown = [n for n in required(params) if n not in names]
    if not takes_all(params) and names[1] not in params:  # it could not see the response it scores
        unknown = unknown or [f"(no {names[1]})"]
    if unknown or positional_only:
        raise ValueError(
            f"{spec} is neither reward function form: parameter(s) {unknown or positional_only} are not what "
            f"verl passes; it calls compute_score({', '.join(f'{n}=...' for n in names)}) by keyword, and "
            "TRL calls f(prompts=..., completions=..., **dataset_columns)"
        )
    return "verl"


def is_trl(params: Params) -> bool:
    """TRL's form declares `completions` (verl's never does)."""
    return "completions" in params


def takes_all(params: Params) -> bool:
    return not params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def required(params: Params) -> list[str]:
    """The parameters a call must name: no default, not *args or **kwargs."""
    return [n for n, p in params.items() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def takes_ground_truth(params: Params | None, batched: bool) -> bool:
    """A verl function that must be given a ground truth: it declares ground_truth without a default (one that
    scores without, such as a format reward, says so with ground_truth=None)."""
    name = VERL_BATCHED_PARAMS[2] if batched else VERL_PARAMS[2]
    return params is not None and name in required(params)


def trl_columns(params: Params) -> list[str]:
    """The dataset columns a TRL-form function cannot do without: its required parameters that TRL does
    not pass itself."""
    return [n for n in required(params) if n not in TRL_PASSED]


def read_parameters(spec: str) -> dict[str, inspect.Parameter] | None:
    """The parameters of the function `name` defined at the top of spec's file, from its source; None
    where the name is not a def there (the run's preflight checks the file and the name)."""
    path, _, name = spec.rpartition(":")
    file = pathlib.Path(path).expanduser()
    try:  # preflight checked the file, but not for a service given by address (trl_form reads it then)
        tree = ast.parse(file.read_text(), str(file))
    except (OSError, SyntaxError):
        return None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    return parameters_of(defs[-1].args) if defs else None  # the last def of a name is the one a module keeps


def parameters_of(a: ast.arguments) -> dict[str, inspect.Parameter]:
    """inspect's parameters for a def's arguments (defaults stand in as None: only whether there is one counts)."""
    P = inspect.Parameter
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    out = {
        arg.arg: P(
            arg.arg,
            P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
            default=None if i >= first_default else P.empty,
        )
        for i, arg in enumerate(positional)
    }
    if a.vararg:
        out[a.vararg.arg] = P(a.vararg.arg, P.VAR_POSITIONAL)
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out[arg.arg] = P(arg.arg, P.KEYWORD_ONLY, default=P.empty if default is None else None)
    if a.kwarg:
        out[a.kwarg.arg] = P(a.kwarg.arg, P.VAR_KEYWORD)
    return out


def trl_form(spec: str | None) -> bool:
    """The function "path.py:name" is of TRL's form, read from its source (so each row carries its dataset
    columns: orchestrator.data)."""
    params = read_parameters(spec) if spec else None
    return params is not None and is_trl(params)
