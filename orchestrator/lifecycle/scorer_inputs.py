"""What the run's scorer reads from each row, checked against the data before any service starts.

    check(cfg)              # ValueError, one line, naming the key and the columns the data has

The scorer is the built-in rules (reward.function unset) or the user's function, whose signature is read
from its file (not run: running user code is the reward service's job, in its own processes) and told
apart by meshrl/reward_forms.py: a function of neither form stops the run here. Rows the built-in code
scorer grades need reward.sandbox. The rules and a verl
function that declares ground_truth without a default take a ground truth; rows without one (a TRL
dataset's `solution` column, say, with no data.answer_key naming it) would score 0 every time, and train on
nothing, so that stops the run. A TRL-form function reads the dataset's columns by name: a column it
needs and the data lacks stops it too. A function named through an import or an assignment has no
signature to read here; the reward service checks it when it loads it.
"""

import dataclasses
import pathlib

from meshrl import reward_forms
from meshrl.clients.sandbox import CODE_SOURCES
from meshrl.rows import plain, read_rows
from orchestrator.config import Config


@dataclasses.dataclass
class Needs:
    what: str  # the scorer, for the message
    ground_truth: bool = False  # each row's reward_model.ground_truth (or data.answer_key's column)
    columns: tuple[str, ...] = ()  # dataset columns, by name (TRL's form)
    trl: bool = False


def check(cfg: Config) -> None:
    """The rows of data.train_files and data.val_files give the scorer what it takes (see the module)."""
    if cfg.rollout.episodes and cfg.env.reward == "env":  # the environment (agent) scores, not the reward service
        return
    needs = scorer_needs(cfg)
    if needs is None:
        return
    for key in ("train_files", "val_files"):
        path = getattr(cfg.data, key)
        if path:
            check_rows(cfg, needs, f"data.{key}", pathlib.Path(path))


def scorer_needs(cfg: Config) -> Needs | None:
    """What the scorer the run starts takes from a row; None: nothing this can tell (a reward model, a
    remote server at reward.url, a service given by address, a function without a signature to read)."""
    rw = cfg.reward
    if rw.address or rw.model or rw.url:
        return None
    if not rw.function:
        return Needs("the built-in scorer (reward.function unset)", ground_truth=True)
    spec = f"reward.function={rw.function}"
    params = reward_forms.read_parameters(rw.function)
    if params is None:
        return None
    if reward_forms.form(params, rw.batched, spec) == "trl":
        return Needs(spec, columns=tuple(reward_forms.trl_columns(params)), trl=True)
    return Needs(spec, ground_truth=reward_forms.takes_ground_truth(params, rw.batched))


def check_rows(cfg: Config, needs: Needs, key: str, path: pathlib.Path) -> None:
    frame = read_rows(path, key)
    if not len(frame):  # the dataset's own reading says so
        return
    columns = list(frame.columns)
    if needs.trl:
        # TRL passes every column but the prompt; the service has no token ids or trainer state to pass
        given = set(columns) - {cfg.data.prompt_key, "tools"}
        missing = [c for c in needs.columns if c not in given]
        if missing:
            raise ValueError(
                f"{needs.what} takes {missing}, and {key} has no such column (TRL passes a reward function "
                f"the dataset's columns by name; columns: {columns})"
            )
        return
    check_sandbox(cfg, key, frame)
    if not needs.ground_truth:
        return
    answer_key = cfg.data.answer_key
    if answer_key:  # each row's answer there; orchestrator.data names a row without one
        if answer_key.split(".")[0] not in columns:
            raise ValueError(f"data.answer_key={answer_key}: {key} has no such column (columns: {columns})")
        return
    cells = [plain(rm) for rm in frame["reward_model"]] if "reward_model" in columns else []
    if not any(isinstance(rm, dict) and rm.get("ground_truth") is not None for rm in cells):
        own = cfg.reward.function and "; a function that scores without one declares ground_truth=None"
        raise ValueError(
            f"{key} has no ground truth in any row (reward_model.ground_truth) and {needs.what} takes one: "
            f"set data.answer_key to the column holding the answers (columns: {columns}){own or ''}"
        )


def check_sandbox(cfg: Config, key: str, frame) -> None:
    """Rows the built-in code scorer grades (by data_source) need a sandbox service to run their programs in:
    without reward.sandbox each would fail at the first step, after every service has started."""
    if cfg.reward.function or cfg.reward.sandbox or "data_source" not in frame.columns:
        return
    code = sorted({str(s) for s in frame["data_source"]} & set(CODE_SOURCES))
    if code:
        raise ValueError(
            f"{key} has rows of data_source {code[0]!r}, which the built-in code scorer grades by running them in "
            "a sandbox: set reward.sandbox=auto (the reward service starts one) or HOST:PORT of `meshrl serve sandbox`"
        )
