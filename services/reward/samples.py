"""The Score request's rows as samples, and outcomes back into the reply batch.

Request columns, per row: response_text (required, text), prompt_text,
data_source, reward_model ({"ground_truth": ...}), extra_info. An optional
response_mask tensor (N, T) asks for token_level_scores with each score on the
row's last response token, as verl places it.
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

    @property
    def args(self) -> tuple:
        """verl's compute_score arguments."""
        return self.data_source, self.response_text, self.ground_truth, self.extra_info


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
        prompt = cols["prompt_text"][i] if "prompt_text" in cols else None
        if prompt is not None and not isinstance(prompt, str):
            raise InvalidArgument(f"row {i}: prompt_text is a {type(prompt).__name__}, not text")
        source = cols["data_source"][i] if "data_source" in cols else None
        rm = cols["reward_model"][i] if "reward_model" in cols else None
        if rm is not None and not isinstance(rm, dict):
            raise InvalidArgument(f"row {i}: reward_model is a {type(rm).__name__}, expected a dict with ground_truth")
        out.append(
            Sample(
                source,
                prompt,
                response,
                (rm or {}).get("ground_truth"),
                cols["extra_info"][i] if "extra_info" in cols else None,
            )
        )
    return out


def build_reply(
    data: DataProto, samples: list[Sample], outcomes: list[Outcome], on_error: str, error_score: float
) -> tuple[DataProto, dict[str, float]]:
    failed = [i for i, o in enumerate(outcomes) if o.error is not None]
    if failed and on_error == "fail":
        i = failed[0]
        raise Aborted(
            f"row {i} (data_source {samples[i].data_source!r}): {outcomes[i].error}"
            f" ({len(failed)} of {len(outcomes)} samples failed)"
        )
    scores = torch.tensor([error_score if o.error is not None else o.score for o in outcomes], dtype=torch.float32)
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
    metrics = {
        "reward/score/mean": scores.mean().item() if len(scores) else 0.0,
        "reward/num_failed": float(len(failed)),
        "reward/num_timeout": float(sum(o.timed_out for o in outcomes)),
    }
    for k in extra_keys:
        values = [float(v) for v in columns[k] if isinstance(v, (int, float)) and math.isfinite(v)]
        if values:
            metrics[f"reward/{k}/mean"] = sum(values) / len(values)
    return DataProto(tensors, {k: object_array(v) for k, v in columns.items()}), metrics
