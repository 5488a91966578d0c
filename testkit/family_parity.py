"""One family's verdict for the family matrix (bench/family_matrix.py): trained at parity, or refused in one line.

    verdict = measure("gpt_oss", tmp_path)    # Verdict(family, architecture, verdict, packed, rollout, note)

A tiny folder of the family (testkit/tiny_families.py: transformers' own config class, random weights by
save_pretrained, meshrl's char tokenizer) goes through what a run does with it, in this process:

1. meshrl's family check (meshrl/families.py), as preflight runs it with the defaults (packed passes with
   shared prompts, the hf rollout); a refusal's way out (actor.padding_free=false, actor.share_prompts=false)
   is taken and the family checked again, and measured with it (its verdict says so, and what the refused
   settings give when run all the same); a refusal without one is the verdict;
2. the actor's log-probs of random rows (meshrl.models.load_model, services/actor/model.forward_response)
   three ways: the model's own eager attention padded, the padded pass the actor runs with
   actor.padding_free=false (the reference), and the packed pass (with and without shared prompts);
3. the actor's weights moved (an update's worth of noise) and pushed to the hf rollout backend as a push
   sends them (in the files' layout), which then samples (greedy, and n=2 at temperature 1) with its
   log-probs; the actor computes the same tokens' log-probs as it would train on them.

`parity`: every difference within BOUND (fp32). Anything else that is not a refusal is a disagreement
(the matrix must have none) or a failure (an error a refusal should have said first).
"""

import dataclasses
import pathlib
import traceback

import torch

from meshrl.families import SPELLED, Settings, check, read_config, refusal
from testkit import tiny_families

BOUND = 1e-5  # fp32: parity.BOUNDS["float32"], the run's own stop
MOST_PARAMETERS = 40_000_000  # past this a family is not tiny at SIZES (e.g. per-layer embedding tables)


DEFAULTS = Settings(backend="hf")  # a default run's on the hf rollout (the matrix runs that in-process)


@dataclasses.dataclass
class Verdict:
    family: str  # the config's model_type
    architecture: str  # the class meshrl loads (transformers' registry)
    verdict: str  # parity, parity (the settings it took), refused, skipped, disagrees, fails
    packed: float | None = None  # max |Δ log-prob| of the packed pass against the padded one
    eager: float | None = None  # max |Δ log-prob| of the padded pass against the model's own eager attention
    rollout: float | None = None  # max |Δ log-prob| of the hf rollout's against the actor's, after a push
    note: str = ""  # the refusal, the reason skipped, the failure, or what else was measured
    checked: list[str] = dataclasses.field(default_factory=list)  # what each refused setting gave when run


def measure(family: str, work: pathlib.Path) -> Verdict:
    """The family's verdict (its folder written under work/family)."""
    architecture = tiny_families.registry().get(family, "?")
    out = Verdict(family, architecture, "skipped")
    vocab, ids = tiny_families.tokenizer_ids()
    try:
        config = tiny_families.tiny_config(family, vocab, ids)
    except Exception as e:  # a config class that will not be made tiny by name: the reason is the verdict
        out.note = f"no tiny config: {first_line(e)}"
        return out
    path = work / family
    tiny_families.folder(config, path)
    s, lines, final = family_check(path)
    out.note = " / ".join(lines)
    if final:
        out.verdict = "refused"
        return out
    if getattr(config, "vision_config", None) is not None and not (path / "preprocessor_config.json").is_file():
        out.note = "no image processor of the family is made here (none named, or it needs torchvision)"
        return out
    try:
        saved = tiny_families.save_weights(config, path)
    except Exception as e:
        out.note = f"no tiny model: {first_line(e)}"
        return out
    parameters = sum(p.numel() for p in saved.parameters())
    if parameters > MOST_PARAMETERS:
        out.note = f"{parameters / 1e6:.0f}M parameters at the tiny sizes"
        return out
    try:
        run(path, out, vocab, s, saved.state_dict())
    except NotKept as e:
        out.note = str(e)
        return out
    except Exception as e:
        out.verdict, out.note = "fails", f"{first_line(e)} [{where(e)}]"
        return out
    worst = max(x for x in (out.packed, out.eager, out.rollout) if x is not None)
    changed = [f"{SPELLED[k]}={str(getattr(s, k)).lower()}" for k in SPELLED if getattr(s, k) != getattr(DEFAULTS, k)]
    out.verdict = "disagrees" if worst > BOUND else "parity" + (f" ({', '.join(changed)})" if changed else "")
    if out.eager is not None and out.eager > BOUND:
        out.note += f" (the padded pass against the model's own eager attention: {out.eager:.1e})"
    return out


def family_check(path: pathlib.Path):
    """meshrl's family check from the defaults, each refusal's way out taken in turn: (the settings it
    passes, the refusals' lines, whether the last refusal had no way out)."""
    config, s, lines = read_config(str(path)), DEFAULTS, list[str]()
    while True:
        try:
            check(config, s)
            return s, lines, False
        except ValueError as e:
            lines.append(str(e))
        limit = refusal(config, s)
        assert limit is not None
        if not limit.way_out:
            return s, lines, True
        s = dataclasses.replace(s, **limit.way_out)


class NotKept(Exception):
    """transformers' own save_pretrained and from_pretrained do not give the model back (not meshrl's to judge)."""


def run(path: pathlib.Path, out: Verdict, vocab: int, s: Settings, saved: dict) -> None:
    """The actor's passes and the rollout's log-probs against them (fills out.packed, out.eager, out.rollout,
    out.checked): the padded pass without shared prompts is the reference; the actor's pass is the packed one
    (with and without shared prompts), or with s.padding_free off the padded one with shared prompts if s
    allows; what s leaves out (a refusal's setting) is run too, to show the refusal was needed."""
    from meshrl.models import load_model
    from testkit.packed import batch, grouped

    model = load_model(str(path), "causal")
    lost = [n for n, t in model.state_dict().items() if n in saved and not torch.equal(t, saved[n])]
    if lost:
        raise NotKept(f"transformers' from_pretrained does not load what its save_pretrained wrote ({lost[0]})")
    moved(model)  # weights of no init's symmetry (zero sinks, unit norms): what training makes of them
    plain = model.config._attn_implementation
    rows = [batch([5, 9, 2, 7], [6, 1, 8, 3], vocab), grouped(vocab)]
    model.set_attn_implementation("eager")
    try:
        eager = [logprobs(model, mb, False) for mb in rows]
    except Exception as e:  # the model's own code on text rows: not a verdict on meshrl
        raise NotKept(f"the model's own eager forward fails on text rows at the tiny sizes: {first_line(e)}") from e
    model.set_attn_implementation(plain)
    padded = [logprobs(model, mb, False) for mb in rows]
    out.eager = max(gap(a, b, mb) for a, b, mb in zip(eager, padded, rows))
    refused = [] if s.padding_free else [Settings()] if s.share_prompts else [Settings(), Settings(padding_free=False)]
    out.checked = [f"{way(r)}: {attempt(model, rows, padded, r, plain)}" for r in refused]
    out.packed = actor_gap(model, rows, padded, s, plain)
    out.rollout = rollout_gap(model, path, vocab, s)


def way(s: Settings) -> str:
    return "packed" if s.padding_free else "padded with shared prompts"


def actor_gap(model, rows: list[dict], padded: list, s: Settings, plain: str) -> float | None:
    """The actor's pass as s runs it against the padded one (None where s runs the padded one itself); the
    model is left set up as s runs it."""
    from services.actor import packing

    model.set_attn_implementation(plain)
    if s.padding_free:
        packing.enable(model)
    shares = [False, True] if s.padding_free else [True] if s.share_prompts else []
    worst = None
    for share in shares:
        actor = [logprobs(model, mb, share) for mb in rows]
        worst = max(worst or 0.0, *(gap(a, b, mb) for a, b, mb in zip(padded, actor, rows)))
    return worst


def attempt(model, rows: list[dict], padded: list, s: Settings, plain: str) -> str:
    """What a refused setting would have given: a failure, or its largest difference from the padded pass."""
    try:
        worst = actor_gap(model, rows, padded, s, plain)
    except Exception as e:
        return f"fails ({first_line(e)[:80]})"
    return f"{'agrees' if (worst or 0.0) <= BOUND else 'differs'} ({worst:.1e})"


def rollout_gap(model, path: pathlib.Path, vocab: int, s) -> float:
    """The actor's weights moved and pushed to an hf rollout backend, which samples; the largest difference
    of its log-probs from the actor's for the same tokens."""
    from meshrl import file_layout
    from meshrl.config.rollout import RolloutConfig
    from meshrl.layout import rollout_tensors
    from meshrl.models import weight_tensors
    from services.rollout.backend_hf import HFBackend
    from services.rollout.sampling import Sampling

    backend = HFBackend(RolloutConfig(model=str(path), backend="hf", dtype="float32"))
    moved(model, seed=1)  # an update: the rollout holds the folder's weights, then only what is pushed
    g = torch.Generator().manual_seed(2)
    sent = file_layout.to_files(file_layout.shell(model.config), dict(weight_tensors(model)))
    backend._copy_in((n, t.detach().clone()) for n, t in received(path, model.config, sent).items())
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (4, 7, 5)]
    worst = 0.0
    for n, temperature in ((1, 0.0), (2, 1.0)):
        asked = Sampling(n, temperature, 1.0, -1, 6, [], [], 0, True)
        done = [c for samples in backend.generate(prompts, asked) for c in samples]
        mb = rollout_tensors(
            [p for p in prompts for _ in range(n)],
            [c.token_ids for c in done],
            0,
            logprobs=[c.logprobs or [] for c in done],
        )
        actor = logprobs(model, mb, s.share_prompts)
        worst = max(worst, gap(actor, mb["rollout_logprobs"], mb))
    return worst


def received(path: pathlib.Path, config, sent: dict) -> dict:
    """What the rollout service's receiver passes on to its backend of a push's tensors (its checks of the
    names and shapes against the model folder's files, services/rollout/weights.py; no transport)."""
    from meshrl import file_layout
    from services.rollout.servicer import modules_of
    from services.rollout.weights import WeightReceiver, checkpoint_shapes

    heads = {"lm_head.weight", *file_layout.tied(file_layout.shell(config))}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    receiver = WeightReceiver(checkpoint_shapes(str(path)), tied, 0, modules_of(config), heads)
    kept = {}
    for name, tensor in sent.items():
        if name in receiver.skip:
            continue
        if list(tensor.shape) != receiver.expected.get(name):
            raise ValueError(
                f"the rollout refuses {name} {list(tensor.shape)} (the files': {receiver.expected.get(name)})"
            )
        kept[name] = tensor
    return kept


@torch.no_grad()
def moved(model, scale: float = 0.02, seed: int = 0) -> None:
    """Every floating-point weight plus seeded noise."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.is_floating_point():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@torch.no_grad()
def logprobs(model, mb: dict, share: bool) -> torch.Tensor:
    """The actor's log-probs of mb's response tokens (B, T), as it trains on them."""
    from services.actor.model import forward_response, token_logprobs

    return token_logprobs(forward_response(model, mb, share_prompts=share), mb["responses"])


def gap(a: torch.Tensor, b: torch.Tensor, mb: dict) -> float:
    """max |a - b| over the response tokens."""
    return float(((a - b).abs() * mb["response_mask"]).max())


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def where(e: BaseException) -> str:
    """The innermost frame of ours (or transformers') an error came from: file:line."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "/services/" in f.filename or "/meshrl/" in f.filename] or frames
    f = ours[-1]
    return f"{pathlib.Path(f.filename).name}:{f.lineno}"
