"""The Score request's rows as samples, and outcomes back into the reply batch.

Request columns, per row: response_text (required, text), prompt_text,
data_source, reward_model ({"ground_truth": ...}), extra_info, ability,
dataset_columns (the row's other dataset columns, with the prompt as the
dataset holds it under "prompt": what a TRL-form function is passed), and
prompt_rendered and sequence_text (the prompt, and the prompt with its
response, as the model saw them: what reward.url sends as OpenRLHF does). An optional
response_mask tensor (N, T) asks for token_level_scores with each score on the
row's last response token, as verl places it.

A TRL-form function may score a sample None, "no score". As TRL's GRPOTrainer
does with one reward function (None becomes NaN, and nansum over the functions
makes it 0), the sample's reward is 0; reward/num_none counts such samples
and reward/score/mean leaves them out, as TRL's per-function mean does. (TRL's
newest trainer also leaves them out of the group baseline and zeroes their
advantage; here the advantage is the orchestrator's and sees a 0.)
"""

import dataclasses
import math
from typing import Any

import torch

from meshrl.algos.masked import token_level
from meshrl.dataproto import DataProto, object_array
from meshrl.errors import Aborted, InvalidArgument
from services.reward.pool import Outcome


@dataclasses.dataclass
class Sample:
    data_source: str | None
    prompt_text: str | None
    response_text: str
    ground_truth: Any
    extra_info: Any
    prompt: Any = None  # as the dataset holds it (chat messages or text); prompt_text when not sent
    columns: dict = dataclasses.field(default_factory=dict)  # the row's dataset columns, TRL's keyword arguments
    prompt_rendered: str | None = None  # the prompt as the chat template rendered it (special tokens kept)
    sequence_text: str | None = None  # that prompt and the response as one text (OpenRLHF's query)

    @property
    def args(self) -> tuple:
        """verl's compute_score arguments, then the prompt and the columns TRL's form reads
        (functions.Args)."""
        return self.data_source, self.response_text, self.ground_truth, self.extra_info, self.prompt, self.columns


TEXT_COLUMNS = ("prompt_text", "prompt_rendered", "sequence_text")  # optional, text where given


def read_samples(data: DataProto) -> list[Sample]:
    cols = data.non_tensor_batch
    if "response_text" not in cols:
        raise InvalidArgument(f"column 'response_text' is missing; columns: {sorted(cols)}")
    n = len(data)
    out = []
    for i in range(n):
        response = cols["response_text"][i]
        if not isinstance(response, str):
            raise InvalidArgument(f"row {i}: response_text is a {type(response).__name__}, not text")
        prompt, rendered, sequence = (cols[k][i] if k in cols else None for k in TEXT_COLUMNS)
        for key, text in zip(TEXT_COLUMNS, (prompt, rendered, sequence)):
            if text is not None and not isinstance(text, str):
                raise InvalidArgument(f"row {i}: {key} is a {type(text).__name__}, not text")
        source = cols["data_source"][i] if "data_source" in cols else None
        rm = cols["reward_model"][i] if "reward_model" in cols else None
        if rm is not None and not isinstance(rm, dict):
            raise InvalidArgument(f"row {i}: reward_model is a {type(rm).__name__}, expected a dict with ground_truth")
        columns = cols["dataset_columns"][i] if "dataset_columns" in cols else None
        if columns is not None and not isinstance(columns, dict):
            raise InvalidArgument(f"row {i}: dataset_columns is a {type(columns).__name__}, expected a dict")
        columns = dict(columns or {})
        as_held = columns.pop("prompt", prompt)
        # TRL passes every dataset column but the prompt: verl's too, where the row has them
        verl = {k: cols[k][i] for k in ("data_source", "reward_model", "extra_info", "ability") if k in cols}
        out.append(
            Sample(
                source,
                prompt,
                response,
                (rm or {}).get("ground_truth"),
                cols["extra_info"][i] if "extra_info" in cols else None,
                as_held,
                {**verl, **columns},
                rendered,
                sequence,
            )
        )
    return out


def build_reply(
    data: DataProto,
    samples: list[Sample],
    outcomes: list[Outcome],
    on_error: str,
    error_score: float,
    count_none: bool = False,
) -> tuple[DataProto, dict[str, float]]:
    """The reply's scores, columns and metrics; count_none: the scorer may answer None (TRL's form), and
    reward/num_none says how often it did."""
    failed = [i for i, o in enumerate(outcomes) if o.error is not None]
    if failed and on_error == "fail":
        i = failed[0]
        raise Aborted(
            f"row {i} (data_source {samples[i].data_source!r}): {outcomes[i].error}"
            f" ({len(failed)} of {len(outcomes)} samples failed)"
        )
    unscored = [o.error is None and o.score is None for o in outcomes]  # a TRL-form function's None
    scores = torch.tensor(
        [error_score if o.error is not None else 0.0 if none else o.score for o, none in zip(outcomes, unscored)],
        dtype=torch.float32,
    )
    tensors = {"scores": scores}
    if "response_mask" in data.batch:
        mask = data.batch["response_mask"]
        if mask.dim() != 2:
            raise InvalidArgument(f"tensor 'response_mask' must be (N, T), got shape {list(mask.shape)}")
        tensors["token_level_scores"] = token_level(scores, mask)
    extra_keys = sorted({k for o in outcomes for k in o.extras})
    columns: dict[str, list] = {k: [o.extras.get(k) for o in outcomes] for k in extra_keys}
    columns["reward_status"] = ["timeout" if o.timed_out else "error" if o.error else "ok" for o in outcomes]
    columns["reward_error"] = [o.error or "" for o in outcomes]
    scored = scores[~torch.tensor(unscored, dtype=torch.bool)] if len(scores) else scores
    metrics = {
        "reward/score/mean": scored.mean().item() if len(scored) else 0.0,
        "reward/num_failed": float(len(failed)),
        "reward/num_timeout": float(sum(o.timed_out for o in outcomes)),
    }
    if count_none:
        metrics["reward/num_none"] = float(sum(unscored))
    for k in extra_keys:
        values = [float(v) for v in columns[k] if isinstance(v, (int, float)) and math.isfinite(v)]
        if values:
            metrics[f"reward/{k}/mean"] = sum(values) / len(values)
    return DataProto(tensors, {k: object_array(v) for k, v in columns.items()}), metrics
