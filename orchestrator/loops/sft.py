"""SFT through the actor service: teach the answers (extra_info.answer, as verl's GSM8K SFT reads them)
as assistant turns after the chat-rendered prompt, with masked cross-entropy on the answer tokens.

Used as the warm-up before RL: a randomly initialised model scores zero, and zero rewards teach nothing.
The final model is run_dir/hf (a link into the last checkpoint).
"""

import dataclasses

from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from orchestrator.config import Config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.loops.params import sft_params
from orchestrator.sampling.rollouts import Rollouts


def sft_batch(data: PromptDataset, indices: list[int]) -> DataProto:
    """Prompt (left padded) + answer and </s> (right padded) in verl's layout, response_mask on the answer."""
    tokenizer = data.tokenizer
    missing = [i for i in indices if "answer" not in (data.rows[i].get("extra_info") or {})]
    if missing:
        raise ValueError(f"SFT needs extra_info.answer in every row; row {missing[0]} has none")
    prompts = [data.prompt_ids[i] for i in indices]
    answers = [
        tokenizer(str(data.rows[i]["extra_info"]["answer"]), add_special_tokens=False)["input_ids"]
        + [tokenizer.eos_token_id]
        for i in indices
    ]
    tensors = rollout_tensors(prompts, answers, data.pad)  # every answer ends in </s>: never empty
    return DataProto({k: v for k, v in tensors.items() if k != "prompts"})


@dataclasses.dataclass
class SFT:
    name: str = "sft"
    trained: tuple[str, ...] = ("actor",)

    def setup(self, cfg: Config) -> set[str]:
        return {"actor"}

    def step(self, mesh: Mesh, rollouts: Rollouts, number: int, data, indices, uids) -> dict[str, float]:
        return mesh.update("actor", number, "sft", sft_params(mesh.cfg), sft_batch(data, indices))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
