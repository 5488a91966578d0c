"""What routing replay R3 buys when the rollout and the trainer compute differently: per MoE family (tiny
Qwen3-MoE, Mixtral, Qwen2-MoE; 8 experts, top 2), the hf rollout samples in bfloat16 (as a vLLM engine in
bf16 does) and the actor scores the samples in fp32, once routing afresh and once replaying the rollout's
experts (actor.router_replay=r3). Reported: the share of tokens whose experts (every MoE layer) the actor
picks as the rollout did, and rollout/kl_to_actor (mean |rollout - actor| log-prob over response tokens)
without and with replay. An fp32 rollout is the control (the two sides compute alike).

    .venv/bin/python bench/router_replay_bench.py            # ~1 min here
    .venv/bin/python bench/router_replay_bench.py --prompts 64 --n 4 --tokens 48

In-process: the rollout backend and the actor's forward passes, no services. Prints a markdown table for
bench/RESULTS.md.
"""

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from meshrl.algos.rollout_correction import kl_to_actor  # noqa: E402
from meshrl.algos.router_replay import ROUTED, agreement, compared  # noqa: E402
from meshrl.config.rollout import RolloutConfig  # noqa: E402
from meshrl.dataproto import DataProto  # noqa: E402
from meshrl.models import load_model  # noqa: E402
from meshrl.tiny.models import MOE, TinyModelConfig, make_model  # noqa: E402
from services.actor.model import forward_response, record_routing, token_logprobs  # noqa: E402
from services.rollout.backend_hf import HFBackend  # noqa: E402
from services.rollout.layout import build  # noqa: E402
from services.rollout.sampling import Sampling  # noqa: E402


def measure(folder: pathlib.Path, dtype: str, args) -> dict[str, float]:
    backend = HFBackend(RolloutConfig(model=str(folder), backend="hf", dtype=dtype, max_model_len=256))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(4, 16, (args.prompts,))]
    s = Sampling(args.n, 1.0, 1.0, -1, args.tokens, [], [], seed=1, logprobs=True, routed_experts=True)
    out = build(DataProto(), prompts, backend.generate(prompts, s), 0, True).batch
    actor = load_model(str(folder), "causal")
    mask = out["response_mask"]
    with torch.no_grad():
        own = record_routing(actor, out)
        afresh = {k: v for k, v in out.items() if k != ROUTED}
        fresh = token_logprobs(forward_response(actor, afresh), out["responses"])
        replayed = token_logprobs(forward_response(actor, {**out, ROUTED: out[ROUTED]}), out["responses"])
    return {
        "agreement": agreement(own, out[ROUTED], compared(out["attention_mask"])),
        "kl_fresh": kl_to_actor(out["rollout_logprobs"], fresh, mask),
        "kl_replayed": kl_to_actor(out["rollout_logprobs"], replayed, mask),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", nargs="+", default=list(MOE))
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| family | rollout | tokens routed as the rollout did | kl_to_actor afresh | kl_to_actor with R3 |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            cfg = TinyModelConfig(family=family, num_experts=8, hidden_size=128, intermediate_size=256, num_layers=2)
            folder = make_model(pathlib.Path(tmp) / family, cfg)
            for dtype in ("bfloat16", "float32"):
                m = measure(folder, dtype, args)
                print(
                    f"| {family} | hf, {dtype} | {m['agreement']:.4f} | {m['kl_fresh']:.2e} | {m['kl_replayed']:.2e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
