"""What each update loss takes: a small typed parameter set per loss name ("ppo", "dpo", "sft", "value").

An UpdateRequest names the loss and carries these parameters; the actor service builds them back
(services/actor/losses.py) and meshrl.algos holds the math. PolicyLossSettings and RolloutISSettings are
also parts of the run config (`actor.*` and `algorithm.*`), so the run sends exactly what it was told.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from meshrl.config.checked import Checked, one_of, require

KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
KL_CONTROLLERS = ("fixed", "adaptive")  # algorithm.kl_ctrl: how the KL penalty's coefficient moves
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ROLLOUT_IS = ("none", "token", "sequence", "geometric")
ROLLOUT_IS_MODES = ("truncate", "mask")
ROLLOUT_RS = tuple(
    f"{scope}_{k}"
    for scope in ("token", "seq_sum", "seq_mean", "seq_max")
    for k in ("k1", "k2", "k3")
    if (scope, k) != ("seq_max", "k1")
)  # verl's rollout_rs options
DPO_LOSSES = ("sigmoid", "ipo")


@dataclasses.dataclass(frozen=True)
class Replay:
    """What a routing replay mode does (actor.router_replay; meshrl/algos/router_replay.py): the one place
    the actor, the mesh and preflight read it from, instead of comparing its name."""

    name: str
    own_first_pass: bool  # r2: the update's passes replay the routing of its own first pass
    rollouts: bool  # r3: the actor's passes replay the experts the rollout chose (it must return them)

    @property
    def afresh(self) -> bool:
        """Every pass routes as its weights do."""
        return not (self.own_first_pass or self.rollouts)


REPLAYS = {"off": Replay("off", False, False), "r2": Replay("r2", True, False), "r3": Replay("r3", False, True)}
ROUTER_REPLAY = tuple(REPLAYS)
ROUTED = "routed_experts"  # the experts each token was routed to, beside input_ids (router_replay)
OLD_LOGPROBS = ("actor_logprobs", "rollout_logprobs", "")
MAX_EPOCHS = 100  # passes over one batch; verl's ppo_epochs is 1-4 in practice, a caller's 2**31 is not work


@dataclasses.dataclass
class EpochSettings(Checked):
    """How many passes an update makes over its batch, in mini-batches of how many rows: the run's
    actor.ppo_epochs / actor.mini_batch_size (verl's names) and every update's parameters alike."""

    ppo_epochs: int = 1  # passes over each batch
    mini_batch_size: int = 0  # rows per optimizer step over all ranks; 0: the whole batch
    shuffle: bool = True  # each epoch's mini-batches drawn in a new seeded order (a pair or group of rows
    #   that must stay together stays); false: in the order the batch came, a prompt's samples together

    def __post_init__(self) -> None:
        super().__post_init__()
        require(1 <= self.ppo_epochs <= MAX_EPOCHS, self, "ppo_epochs", f"must be in 1..{MAX_EPOCHS}")
        require(self.mini_batch_size >= 0, self, "mini_batch_size", "must be >= 0")


@dataclasses.dataclass
class Schedule(EpochSettings):
    """How an update walks over the batch: epochs of mini-batches, one optimizer step each."""

    seed: int = 0  # of the shuffled orders (the run's trainer.seed; an epoch's order also follows the step)


@dataclasses.dataclass
class Aggregation(Checked):
    """How a loss averages its tokens (verl's loss_agg_mode; masked.PER_SEQUENCE)."""

    loss_agg_mode: str | None = None
    """token-mean, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm; null: token-mean, or
    the one the loss's objective fixes (gspo, gmpo, sapo: seq-mean-token-mean; another is refused)."""

    def fixed_aggregation(self) -> str | None:
        """The aggregation the loss's objective fixes; None: any (the policy loss's settings say)."""
        return None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss_agg_mode is None:
            self.loss_agg_mode = self.fixed_aggregation() or "token-mean"
        one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


@dataclasses.dataclass
class ValueLossSettings(Checked):
    """The critic's value loss: the run's critic.clip_range_value and a value update's parameter."""

    clip_range_value: float = 0.5  # value clipping around the old values


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    """One policy-gradient loss as the run sees it (meshrl/algos/policy_losses.py holds its math under the
    same name): its paper, the settings it reads with the paper's values where the run leaves them null,
    and the aggregation its objective fixes (None: the run's loss_agg_mode, token-mean by default)."""

    reference: str
    defaults: dict
    aggregation: str | None = None


SEQ_MEAN = "seq-mean-token-mean"
POLICY_LOSSES = {
    "ppo": PolicyLoss(
        "PPO's clipped ratio per token (arXiv:1707.06347), with DAPO's separate clip-higher (arXiv:2503.14476) "
        "and dual clip for negative advantages (arXiv:1912.09729)",
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2},
    ),
    "gspo": PolicyLoss(
        "GSPO (arXiv:2507.18071): one ratio per sequence, the geometric mean of its tokens', clipped as a whole",
        {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
        SEQ_MEAN,
    ),
    "cispo": PolicyLoss(
        "CISPO (MiniMax-M1, arXiv:2506.13585): the clipped ratio as a stop-gradient weight on each token's "
        "log-prob gradient, so no token loses its gradient; the paper bounds the ratio above only "
        "(clip_ratio_low=1: no lower bound)",
        {"clip_ratio_low": 1.0, "clip_ratio_high": 0.2},
    ),
    "gmpo": PolicyLoss(
        "GMPO (arXiv:2507.20673): the geometric mean of the tokens' ratios per sequence, each token's log-ratio "
        "clipped to [-clip_ratio_low, clip_ratio_high] on its advantage's side (the paper's e^-0.4..e^0.4)",
        {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4},
        SEQ_MEAN,
    ),
    "sapo": PolicyLoss(
        "SAPO (arXiv:2511.20347): a smooth gate 4/tau * sigmoid(tau (ratio - 1)) instead of a hard clip, "
        "tau_neg > tau_pos damping negative-advantage tokens faster",
        {"tau_pos": 1.0, "tau_neg": 1.05},
        SEQ_MEAN,
    ),
    "clip_cov": PolicyLoss(
        "Clip-Cov (arXiv:2505.22617): PPO's clip, and a random clip_cov_ratio share of the tokens whose "
        "covariance of log-prob and advantage is in (clip_cov_lb, clip_cov_ub) lose their gradient",
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
    ),
    "kl_cov": PolicyLoss(
        "KL-Cov (arXiv:2505.22617): no clip; the kl_cov_ratio share of tokens with the largest covariance of "
        "log-prob and advantage get a penalty ppo_kl_coef * |log ratio|",
        {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1},
    ),
}


def readers(setting: str) -> list[str]:
    return [name for name, loss in POLICY_LOSSES.items() if setting in loss.defaults]


@dataclasses.dataclass
class PolicyLossSettings(Aggregation):
    policy_loss: str = "ppo"
    """The policy-gradient loss, one of POLICY_LOSSES: ppo, gspo, cispo, gmpo, sapo, clip_cov, kl_cov (each
    with its paper and defaults in docs/training.md). The settings below that default to null take the
    chosen loss's own values; one the loss does not read is refused rather than ignored."""
    clip_ratio_low: float | None = None
    """The ratio's lower clip (ppo: ratio >= 1 - clip_ratio_low); null: the loss's own (ppo 0.2)."""
    clip_ratio_high: float | None = None
    """The ratio's upper clip (ppo: ratio <= 1 + clip_ratio_high; DAPO's clip-higher when larger)."""
    clip_ratio_c: float | None = 3.0
    """ppo's dual-clip bound for negative advantages; null turns it off (the other losses have none)."""
    tau_pos: float | None = None
    """sapo: the gate's temperature for positive advantages (1.0)."""
    tau_neg: float | None = None
    """sapo: the gate's temperature for negative advantages (1.05)."""
    clip_cov_ratio: float | None = None
    """clip_cov: the share of tokens whose gradient is cut (2e-4)."""
    clip_cov_lb: float | None = None
    """clip_cov: the covariance above which a token may be cut (1.0)."""
    clip_cov_ub: float | None = None
    """clip_cov: the covariance below which a token may be cut (5.0)."""
    kl_cov_ratio: float | None = None
    """kl_cov: the share of tokens, the largest covariances, that get the KL penalty (2e-4)."""
    ppo_kl_coef: float | None = None
    """kl_cov: the penalty's weight on |log ratio| (0.1)."""
    entropy_coeff: float = 0.0
    """Entropy bonus in the policy loss."""
    use_kl_loss: bool = False
    """KL(actor || ref) as a loss term (GRPO's); needs the ref's log-probs."""
    kl_loss_coef: float = 0.001
    """Its weight."""
    kl_loss_type: str = "k3"
    """Its estimator: k1, k2, k3 (low-variance) or abs."""
    router_aux_loss_coef: float = 0.0
    """A mixture of experts: the weight of the router's load-balancing loss (Switch Transformer's; Qwen3-MoE
    and Mixtral pretrain with 0.001-0.02). Every update of an MoE reports its expert load either way."""
    router_z_loss_coef: float = 0.0
    """A mixture of experts: the weight of the router's z-loss (ST-MoE's; 0.001 there)."""
    router_replay: str = "off"
    """A mixture of experts: "r2" records the experts each token's routers choose on the weights before the
    update (a pass without gradients over every row; skipped where the update is one mini-batch of one
    epoch, which routes as recorded anyway) and the update's passes use them instead of routing afresh, so
    every mini-batch and epoch trains the network the old log-probs came from (verl's and slime's R2).
    "r3" replays the experts the rollout chose (rollout routing replay, arXiv 2510.11370): the rollout
    returns them with each sample and the actor's log-prob and update passes use them (the ref routes as
    its own weights do), so the trainer scores what the rollout ran (meshrl/algos/router_replay.py).
    "off": every pass routes afresh."""
    router_agreement: bool = False
    """A mixture of experts without R3: the rollout returns its experts anyway and the update reports how
    many of them it would route alike (actor/moe/routing_agreement) without replaying them: what R3 would
    change, before turning it on. R3 reports it always; with R3 this also reports
    rollout/kl_to_actor_afresh, the rollout's distance from the actor routing afresh (one pass without
    gradients over every row before the update), beside the replayed rollout/kl_to_actor."""

    def fixed_aggregation(self) -> str | None:
        loss = POLICY_LOSSES.get(self.policy_loss)  # checked after the aggregation, in __post_init__
        return loss.aggregation if loss is not None else None

    @property
    def replay(self) -> Replay:
        return REPLAYS[self.router_replay]

    def rollout_experts(self) -> bool:
        """Whether the rollout returns each token's experts: the update replays them (R3) or compares."""
        return self.replay.rollouts or self.router_agreement

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "policy_loss", POLICY_LOSSES)
        require(self.router_aux_loss_coef >= 0, self, "router_aux_loss_coef", "must be >= 0")
        require(self.router_z_loss_coef >= 0, self, "router_z_loss_coef", "must be >= 0")
        one_of(self, "router_replay", ROUTER_REPLAY)
        require(
            not (self.router_agreement and self.replay.own_first_pass),
            self,
            "router_agreement",
            "compares with the rollout's experts; with router_replay=r2 the update routes as its own first pass",
        )
        loss = POLICY_LOSSES[self.policy_loss]
        for name in LOSS_SETTINGS:
            if name in loss.defaults:
                if getattr(self, name) is None:
                    setattr(self, name, loss.defaults[name])
            elif getattr(self, name) is not None:
                require(
                    False, self, name, f"is read by policy_loss {' or '.join(readers(name))}, not {self.policy_loss}"
                )
        if loss.aggregation:  # the paper's objective, said rather than silently changed
            require(
                self.loss_agg_mode == loss.aggregation,
                self,
                "loss_agg_mode",
                f"must be {loss.aggregation} with policy_loss={self.policy_loss} (its objective's own)",
            )
        one_of(self, "kl_loss_type", KL_ESTIMATORS)
        for name in ("clip_ratio_low", "clip_ratio_high", "clip_cov_ratio", "kl_cov_ratio", "ppo_kl_coef"):
            require(getattr(self, name) is None or getattr(self, name) >= 0, self, name, "must be >= 0")
        for name in ("tau_pos", "tau_neg"):
            require(getattr(self, name) is None or getattr(self, name) > 0, self, name, "must be > 0")
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            require(getattr(self, name) is None or getattr(self, name) <= 1, self, name, "must be <= 1 (a share)")
        if self.clip_cov_lb is not None and self.clip_cov_ub is not None:
            require(self.clip_cov_lb < self.clip_cov_ub, self, "clip_cov_lb", "must be < clip_cov_ub")


LOSS_SETTINGS = sorted({name for loss in POLICY_LOSSES.values() for name in loss.defaults})
"""The settings that are one loss's or another's: null in a run means the chosen loss's value."""


def rs_thresholds(options: str, thresholds: str) -> dict[str, tuple[float, float]]:
    """{option: (lower, upper)} from verl's comma-separated rollout_rs and rollout_rs_threshold (one threshold
    for every option or one each; a k1 option's is "lower_upper" or an upper u meaning 1/u_u, the others'
    an upper bound alone, lower 0). ValueError naming what does not fit."""
    names = [o.strip() for o in options.split(",") if o.strip()]
    unknown = [o for o in names if o not in ROLLOUT_RS]
    if unknown:
        raise ValueError(f"rollout_rs option(s) {unknown} not known; known: {', '.join(ROLLOUT_RS)}")
    specs = [t.strip() for t in str(thresholds).split(",") if t.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(
            f"rollout_rs_threshold gives {len(specs)} thresholds for {len(names)} options: one, or one each"
        )
    out = {}
    for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs):
        try:
            parts = [float(x) for x in spec.split("_")]
        except ValueError:
            raise ValueError(f"rollout_rs_threshold {spec!r} for {name} is not a number (or lower_upper)") from None
        if name.endswith("k1"):
            if len(parts) > 2 or min(parts) <= 0:
                raise ValueError(f"rollout_rs_threshold {spec!r} for {name} must be 0 < lower <= upper")
            lower, upper = parts if len(parts) == 2 else (1 / parts[0], parts[0])
            if not lower <= upper:
                raise ValueError(f"rollout_rs_threshold {spec!r} for {name} must be 0 < lower <= upper")
        elif len(parts) != 1 or parts[0] <= 0:
            raise ValueError(f"rollout_rs_threshold {spec!r} for {name} must be one upper bound > 0")
        else:
            lower, upper = 0.0, parts[0]
        out[name] = (lower, upper)
    return out


@dataclasses.dataclass
class RolloutISSettings(Checked):
    rollout_is: str = "none"
    """Correct the loss for the rollout sampling from another policy than the one trained (another
    engine's numerics, older weights): importance weights of the old log-probs against the batch's
    rollout_logprobs scale each token's loss, "token" (one per token), "sequence" (their product, one per
    response) or "geometric" (their geometric mean, one per response); "none": off."""
    rollout_is_cap: float = 2.0
    """The weights' upper bound (verl's default threshold); below 1 it would shrink every update."""
    rollout_is_mode: str = "truncate"
    """What the bound does: "truncate" (TIS: min(w, cap)) or "mask" (IcePop / MIS: a weight outside
    [rollout_is_floor, cap] is 0, its token out of the gradient)."""
    rollout_is_floor: float = 0.0
    """mask: the lower bound (IcePop's two-sided band; 0: none)."""
    rollout_rs: str = ""
    """Rejection sampling, verl's options, comma-separated: token_k1..3, seq_sum_k1..3, seq_mean_k1..3,
    seq_max_k2/k3 (docs/training.md); a rejected token or response leaves the loss. "": off."""
    rollout_rs_threshold: str = ""
    """Their bounds, one or one each: a k1 option's "lower_upper" or an upper u (1/u_u), the others' an
    upper bound."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "rollout_is", ROLLOUT_IS)
        one_of(self, "rollout_is_mode", ROLLOUT_IS_MODES)
        require(self.rollout_is_cap >= 1, self, "rollout_is_cap", "must be >= 1")
        require(0 <= self.rollout_is_floor <= 1, self, "rollout_is_floor", "must be in [0, 1]")
        require(
            self.rollout_is_floor == 0 or self.rollout_is_mode == "mask",
            self,
            "rollout_is_floor",
            "bounds the weights only with rollout_is_mode=mask (truncation has no lower side)",
        )
        if self.rollout_rs:  # a threshold without options is not read (verl's config keeps one so too)
            try:
                rs_thresholds(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as e:
                require(False, self, "rollout_rs", f"does not fit: {e}")

    @property
    def corrects(self) -> bool:
        """The update reads the rollout's log-probs: weights or rejection."""
        return self.rollout_is != "none" or bool(self.rollout_rs)


@dataclasses.dataclass
class PPOParams(Schedule, PolicyLossSettings, RolloutISSettings):
    temperature: float = 1.0
    """The rollout's sampling temperature, which the log-probs use too."""
    old_logprobs_key: str = "actor_logprobs"
    """The batch's old log-probs: "actor_logprobs", "rollout_logprobs", or "" when the update finds them
    itself: the first mini-batch of the first epoch takes the detached log-probs of its own pass (the
    weights are still the old ones then, as TRL and verl do with one mini-batch), and the other rows get
    theirs from a pass without gradients before the first optimizer step (every row with ppo_epochs > 1).
    The caller then needs no log-prob pass of its own."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "old_logprobs_key", OLD_LOGPROBS)
        require(
            not self.corrects or self.old_logprobs_key != "rollout_logprobs",
            self,
            "old_logprobs_key",
            "cannot be the log-probs rollout_is / rollout_rs weigh the old ones against (every ratio would be 1)",
        )
        require(self.temperature > 0, self, "temperature", "must be > 0")


def check_dpo(obj, loss: str, smoothing: str) -> None:
    """DPO's rules, on a run's names (DPOSettings) or an update's (DPOParams)."""
    one_of(obj, loss, DPO_LOSSES)
    require(0 <= getattr(obj, smoothing) < 0.5, obj, smoothing, "must be in [0, 0.5)")


@dataclasses.dataclass
class DPOSettings(Checked):
    """DPO's knobs as a run names them (algorithm.dpo_*); an update carries them as DPOParams."""

    dpo_beta: float = 0.1  # DPO's inverse temperature
    dpo_loss: str = "sigmoid"  # sigmoid or ipo
    dpo_label_smoothing: float = 0.0  # sigmoid: the share of preferences taken as flipped (conservative DPO;
    #   TRL's and OpenRLHF's label_smoothing), in [0, 0.5)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_dpo(self, "dpo_loss", "dpo_label_smoothing")

    def dpo_params(self) -> dict:
        """The knobs under DPOParams' names."""
        return {"beta": self.dpo_beta, "loss_type": self.dpo_loss, "label_smoothing": self.dpo_label_smoothing}


@dataclasses.dataclass
class DPOParams(Schedule):
    """A DPO update's parameters: DPOSettings' knobs (their defaults), checked again as any client may send them."""

    beta: float = DPOSettings.dpo_beta
    loss_type: str = DPOSettings.dpo_loss
    label_smoothing: float = DPOSettings.dpo_label_smoothing
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_dpo(self, "loss_type", "label_smoothing")


@dataclasses.dataclass
class SFTParams(Schedule, Aggregation):
    pass


@dataclasses.dataclass
class ValueParams(Schedule, ValueLossSettings, Aggregation):
    pass


RESPONSES = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
"""What every update reads: the sequences (verl's layout) and which of their tokens are the response's."""


def _ppo_reads(p: PPOParams) -> tuple[str, ...]:
    old = (p.old_logprobs_key,) if p.old_logprobs_key else ()
    routed = (ROUTED,) if p.rollout_experts() else ()
    return (
        ("advantages", *old)
        + (("rollout_logprobs",) if p.corrects else ())
        + (("ref_logprobs",) * p.use_kl_loss)
        + routed
    )


def _nothing(p) -> tuple[str, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class UpdateLoss:
    """One loss an Update may name: its parameter set, the role that trains with it, the tensors it reads
    beyond RESPONSES (given its parameters), those it reads when the batch has them (`also`), and how many
    adjacent rows belong together (DPO's chosen and rejected)."""

    params: type
    role: str
    reads: Callable[[Any], tuple[str, ...]]
    also: Callable[[Any], tuple[str, ...]] = _nothing
    unit: int = 1


UPDATE_LOSSES = {
    # an update that finds its own old log-probs reads the rollout's, if sent, for rollout/kl_to_actor
    "ppo": UpdateLoss(PPOParams, "actor", _ppo_reads, lambda p: () if p.old_logprobs_key else ("rollout_logprobs",)),
    "dpo": UpdateLoss(DPOParams, "actor", lambda p: ("ref_logprobs",), unit=2),
    "sft": UpdateLoss(SFTParams, "actor", _nothing),
    "value": UpdateLoss(ValueParams, "critic", lambda p: ("values", "returns")),
}
PARAMS = {name: loss.params for name, loss in UPDATE_LOSSES.items()}


def update_inputs(loss: str, params, present) -> list[str]:
    """The tensors an update with this loss and parameters reads, of those `present` for the optional ones:
    what the orchestrator sends and the actor service checks and passes to its ranks."""
    spec = UPDATE_LOSSES[loss]
    also = (k for k in spec.also(params) if k in present)  # may repeat one it reads (rollout_logprobs)
    return list(dict.fromkeys([*RESPONSES, *spec.reads(params), *also]))
