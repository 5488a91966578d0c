"""A rollout backend that writes a policy's tool-calling turns in the model's own format (hermes calls,
ChatML end tokens), so that every token of a multi-turn episode can be checked: the scripts by question,
the run settings they are played with, and the rows a step is given. Used by
tests/contract/test_multi_turn_tools.py and bench/gateway_bench.py."""

import torch

from meshrl.dataproto import DataProto
from services.rollout.sampling import Completion

LOGPROB = -0.5  # every scripted token's
CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
SCRIPTS = {  # question -> the policy's turns, in order
    "12*7=": [CALL.format("12*7") + "<|im_end|>", "84<|im_end|>"],
    "3*3=": [  # a call that is not JSON, then two calls in one turn, then the answer
        "<tool_call>{bad</tool_call><|im_end|>",
        CALL.format("3*3") + "\n" + CALL.format("1+1") + "<|im_end|>",
        "9<|im_end|>",
    ],
    "5*5=": [CALL.format("5*5"), "25<|im_end|>"],  # the first turn is cut before its end token
    "2*6=": [CALL.format("2*6") + "<|endoftext|>", "12<|im_end|>"],  # ended at the model's other end token
}

FILLER = "ok " * 256  # what a prompt of no script is answered with, cut at its max_new_tokens


class ScriptedEngine:
    """A rollout backend that writes each question's script, turn by turn (which turn: the tool results
    the prompt holds so far)."""

    name, concurrent = "scripted", False

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def generate(self, prompts, s, alive=None):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            question = next((q for q in SCRIPTS if f"user\n{q}<|im_end|>" in text), None)
            if question is None:  # a prompt of no script (tests/contract/edge_agents.py): plain text to the end
                turn = FILLER
            else:
                turn = SCRIPTS[question][text.count("<tool_response>") and text.count("<|im_start|>assistant") - 1]
            tokens = self.tok(turn, add_special_tokens=False)["input_ids"][: s.max_new_tokens]
            ended = self.tok.decode(tokens[-1:]) in ("<|im_end|>", "<|endoftext|>")
            text_out = self.tok.decode(tokens, skip_special_tokens=True)
            out.append([Completion(tokens, [LOGPROB] * len(tokens), text_out, "stop" if ended else "length")])
        return out

    def close(self):
        pass


SETTINGS = [
    "rollout.n=1",
    "rollout.max_new_tokens=64",
    "rollout.tool_parser=hermes",
    "rollout.max_turns=4",
    "rollout.max_response_tokens=300",
]


def batch(questions: list[str], truths: list[str]) -> DataProto:
    """Rows as the data gives them (the prompt ids are rendered again, with the tools, by the sampler)."""
    return DataProto(
        {"input_ids": torch.ones(len(questions), 1, dtype=torch.long)},
        {
            "prompt": [[{"role": "user", "content": q}] for q in questions],
            "reward_model": [{"ground_truth": t} for t in truths],
            "uid": [f"u{i}" for i in range(len(questions))],
        },
    )
