"""The tool task's learning recipe, shared by tests/e2e/test_tool_learning.py and bench/tool_recipe.py: a
fresh tiny model, an SFT warm-up on the calculator task (part calculator traces, part direct answers),
then multi-turn GRPO with the calculator (configs/calculator_grpo.yaml), validated on the 500 held-out
problems at its first and last step.

Two formats. "text": the char-level llama writing <calc>12*7</calc> and reading <result>84</result>, the
environment's stop strings ending a turn. "hermes": the model's own tool format, as a Qwen2.5 model is
trained: a qwen2 with a byte-level BPE tokenizer and ChatML template (meshrl/tiny/bpe.py), the tool's
schema listed in the system turn, SFT on the `messages` conversations (calls as <tool_call> JSON,
results in the tool role), GRPO with rollout.tool_parser=hermes, turns ending at the end tokens; with
`agent`, GRPO's episodes are played by the calculator written as an OpenAI-SDK agent (rollout.agent,
examples/agents/calculator.py) instead of the environment service.
"""

import dataclasses
import json
import os
import pathlib
import subprocess

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.output.report import gain_line, held_out_gain

ROOT = pathlib.Path(__file__).resolve().parents[1]
MORE_CALLS = 0.15  # tool calls per episode, last three steps against the first
PARITY = 1e-5  # rollout/kl_to_actor on these fp32 paths: ~1e-7 (see test_weight_sync.py)
AGENT = ["rollout.multi_turn=false", f"rollout.agent={ROOT / 'examples/agents/calculator.py'}:agent"]


@dataclasses.dataclass
class Recipe:
    fmt: str = "text"  # "text" or "hermes"
    seed: int = 0  # the model's initialization, the data, their order and sampling
    width: int = 256  # the model's hidden size (its MLP as much wider as the default's)
    tool_share: float = 0.5  # of the warm-up's answers are calculator traces, the rest direct answers
    sft_steps: int = 100
    traces_first: int = 0  # of those, the first this many on calculator traces only
    grpo_steps: int = 20
    sft_overrides: tuple[str, ...] = ()
    grpo_overrides: tuple[str, ...] = ()
    agent: bool = False  # hermes: GRPO's episodes played by the OpenAI-SDK agent (examples/agents/calculator.py)


def model_config(recipe: Recipe) -> TinyModelConfig:
    hermes = recipe.fmt == "hermes"
    base = TinyModelConfig(
        seed=recipe.seed, family="qwen2" if hermes else "llama", tokenizer="bpe" if hermes else "char"
    )
    return dataclasses.replace(
        base, hidden_size=recipe.width, intermediate_size=base.intermediate_size * recipe.width // base.hidden_size
    )


def warm_up_and_train(tmp: pathlib.Path, recipe: Recipe) -> tuple[pathlib.Path, pathlib.Path]:
    """(the SFT run's folder, the GRPO run's folder)."""
    hermes = recipe.fmt == "hermes"
    model = make_model(tmp / "model", model_config(recipe))
    task = ArithmeticConfig(ops="*", max_operand=99, tool=True, tool_share=recipe.tool_share, tool_format=recipe.fmt)
    data = make_data(tmp / "data", task)
    common = ["actor.engine=plain", "actor.world_size=1", "trainer.trace=", f"trainer.seed={recipe.seed}"]
    first = recipe.traces_first
    traces = make_data(tmp / "traces", dataclasses.replace(task, tool_share=1.0)) if first else data
    phases = [(first, traces), (recipe.sft_steps - first, data)] if first else [(recipe.sft_steps, data)]
    sft, warmed = tmp, model
    for i, (steps, files) in enumerate(phases):
        sft = run(
            "sft",
            load_config(
                str(ROOT / "configs/arithmetic_sft.yaml"),
                [
                    *common,
                    f"actor.model={warmed}",
                    f"data.train_files={files['train']}",
                    f"trainer.run_dir={tmp / f'sft{i}'}",
                    f"trainer.total_steps={steps}",
                    *(["data.prompt_key=messages"] if hermes else []),
                    *recipe.sft_overrides,
                ],
            ),
        )
        warmed = sft / "hf"
    grpo = run(
        "grpo",
        load_config(
            str(ROOT / "configs/calculator_grpo.yaml"),
            [
                *common,
                f"actor.model={warmed}",
                f"data.train_files={data['train']}",
                f"data.val_files={data['test']}",
                f"trainer.run_dir={tmp / 'grpo'}",
                f"trainer.total_steps={recipe.grpo_steps}",
                f"trainer.val_every={recipe.grpo_steps}",
                "data.train_batch_size=16",
                *(["rollout.tool_parser=hermes", "rollout.max_new_tokens=32"] if hermes else []),
                *(AGENT if recipe.agent else []),
                *recipe.grpo_overrides,
            ],
        ),
    )
    return sft, grpo


def per_step(grpo: pathlib.Path, key: str) -> list[float]:
    """A metric's value at each GRPO step that logged it."""
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


def check_learned(grpo, gain_z: float) -> None:
    """Held-out greedy accuracy rose by gain_z paired standard errors, tool calls per episode by MORE_CALLS
    (the last three steps against the first), and no episode failed in the environment."""
    gain = held_out_gain(grpo)
    assert gain is not None and gain["n"] == 500
    print(gain_line(gain))
    assert gain["gain"] > 0 and gain["gain"] >= gain_z * gain["gain_se"], gain_line(gain)
    calls = per_step(grpo, "multi_turn/tool_calls/mean")
    late = sum(calls[-3:]) / 3
    print(f"tool calls per episode: {calls[0]:.2f} at the first step, {late:.2f} over the last three")
    assert late >= calls[0] + MORE_CALLS and per_step(grpo, "multi_turn/num_env_failed")[-1] == 0


def check_agent_steps(out: pathlib.Path, steps: int) -> None:
    """Every training step played all its episodes (none lost) through the endpoint, and the rollout's
    log-probs of the recorded tokens agree with the actor's at the parity level."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in rows if "agent/episodes_lost" in s and "actor/pg_loss" in s]
    assert len(trained) == steps
    for s in trained:
        assert s["agent/episodes_lost"] == 0 and s["agent/calls/mean"] >= 1
        assert s["rollout/kl_to_actor"] < PARITY, s["rollout/kl_to_actor"]
    assert any("val/acc/mean" in s for s in rows)


def agent_workers_left() -> list[str]:
    """Agent worker processes this test process started that are still there."""
    found = subprocess.run(["pgrep", "-f", "orchestrator.agents.worker"], capture_output=True, text=True).stdout
    return [p for p in found.split() if _child_of_us(p)]


def _child_of_us(pid: str) -> bool:
    """Whether process `pid` was started by this test process (its parent chain reaches us)."""
    while pid not in ("0", "1"):
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if pid == str(os.getpid()):
            return True
    return False


def agent_step(tmp: pathlib.Path, model, agent: list[str]) -> pathlib.Path:
    """A 1-step GRPO run on the hermes calculator task whose episodes `agent` (overrides) plays, checked
    as every agent run is (check_agent_steps); its folder."""
    data = make_data(
        tmp / "data",
        ArithmeticConfig(ops="*", max_operand=99, tool=True, tool_format="hermes", num_train=32, num_test=8),
    )
    overrides = [
        f"actor.model={model}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"trainer.run_dir={tmp / 'grpo'}",
        "trainer.total_steps=1",
        "trainer.val_every=1",
        "trainer.trace=",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.multi_turn=false",
        "rollout.tool_parser=hermes",
        "rollout.max_new_tokens=32",
        "actor.engine=plain",
        "actor.world_size=1",
        *agent,
    ]
    out = run("grpo", load_config(str(ROOT / "configs/calculator_grpo.yaml"), overrides))
    check_agent_steps(out, steps=1)
    return out
