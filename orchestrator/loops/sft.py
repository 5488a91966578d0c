"""SFT through the actor service: teach the answers (extra_info.answer, as verl's GSM8K SFT reads them)
as assistant turns after the chat-rendered prompt, with masked cross-entropy on the answer tokens.

A row whose prompt column holds a conversation with assistant turns (TRL's and OpenRLHF's messages
format; data.prompt_key=messages) is learnt as it is instead: every assistant turn is trained, up to and
with its end token, and everything else (system and user turns, tool results, the template's own text
between turns) is context with no loss (meshrl.chat.turns). Where those turns hold tool calls, preflight
has checked that the chat template renders tools, calls and results (orchestrator/lifecycle/tool_template.py).

Used as the warm-up before RL: a randomly initialised model scores zero, and zero rewards teach nothing.
The final model is run_dir/hf (a link into the last checkpoint).
"""

import dataclasses

from meshrl import modalities
from meshrl.chat import turns
from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from orchestrator.config import Config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.loops.params import sft_params
from orchestrator.sampling import combinations
from orchestrator.sampling.rollouts import Rollouts


def sft_batch(data: PromptDataset, indices: list[int]) -> DataProto:
    """Prompt (left padded) + what is learnt (right padded) in verl's layout, response_mask on the learnt
    tokens: the answer and </s>, or a conversation's assistant turns."""
    prompts, responses, masks = [], [], []
    for i in indices:
        prompt, response, mask = example(data, i)
        prompts.append(prompt)
        responses.append(response)
        masks.append(mask)
    tensors = rollout_tensors(prompts, responses, data.pad, masks)  # never empty: an end token at least
    media = {c: [data.rows[i].get(c) for i in indices] for c in modalities.COLUMNS}  # a vision-language task's
    return DataProto({k: v for k, v in tensors.items() if k != "prompts"}, {c: v for c, v in media.items() if any(v)})


def example(data: PromptDataset, i: int) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, response mask) of row i."""
    tokenizer, row = data.tokenizer, data.rows[i]
    messages = row["prompt"]
    if any(m["role"] == "assistant" for m in messages):
        held = [m.name for m in modalities.MODALITIES if row.get(m.column)]
        if held:
            raise ValueError(f"data.train_files row {i}: SFT on conversations with {held[0]} is not supported yet")
        pieces = turns(tokenizer, messages, f"data.train_files row {i}", row.get("tools"))
        prompt = ids(tokenizer, pieces[0][0]) if not pieces[0][1] else []
        response, mask = [], []
        for text, trained in pieces[1:] if prompt else pieces:
            piece = ids(tokenizer, text)
            response += piece
            mask += [int(trained)] * len(piece)
        return prompt, response, mask
    answer = (row.get("extra_info") or {}).get("answer")
    if answer is None:
        raise ValueError(
            f"SFT needs extra_info.answer in every row, or a conversation with assistant turns; row {i} has neither"
        )
    response = ids(tokenizer, str(answer)) + [tokenizer.eos_token_id]
    return data.prompt_ids[i], response, [1] * len(response)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclasses.dataclass
class SFT:
    name: str = "sft"
    trained: tuple[str, ...] = ("actor",)

    def setup(self, cfg: Config) -> set[str]:
        combinations.check(cfg, self.name)  # it samples nothing: a way of sampling turned on is refused
        return {"actor"}

    def step(self, mesh: Mesh, rollouts: Rollouts, number: int, data, indices, uids) -> dict[str, float]:
        return mesh.update("actor", number, "sft", sft_params(mesh.cfg), sft_batch(data, indices))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
