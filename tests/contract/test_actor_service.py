"""The actor service over real gRPC, each service a real process group (`meshrl serve actor`)."""

import math

import grpc
import pytest
import torch
from actor_process import P, Service, T, batch, hf_logprobs, next_step, seq_logprob
from calls import expect
from transformers import AutoTokenizer

from meshrl.codec import Payload
from meshrl.codec.values import to_value
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.v1 import actor_pb2
from meshrl.vocab import fingerprint

ACTOR_FLAGS = ("--lr", "1e-3", "--micro-batch-size", "2")  # the shared fixture's actor (conftest.py)


def test_the_group_listens_on_loopback_only(actor):
    """The ranks meet through a file only this user can read, not torch's TCP store (which listened on
    every interface, unauthenticated); gloo's own sockets stay on loopback."""
    import ipaddress

    import psutil

    def loopback(ip: str) -> bool:
        a = ipaddress.ip_address(ip)
        return (getattr(a, "ipv4_mapped", None) or a).is_loopback

    procs = [psutil.Process(actor.proc.pid), *psutil.Process(actor.proc.pid).children(recursive=True)]
    listening = [(p.pid, c.laddr) for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert listening and all(loopback(addr.ip) for _, addr in listening), listening


def test_describe_hides_nothing_but_the_ranks(actor, tiny_lm):
    info = actor.call("Describe")
    assert (info.role, info.world_size, info.backend, info.model) == ("actor", 2, "fsdp2", str(tiny_lm))
    # what a run checks a teacher given by address against (meshrl.vocab)
    assert info.details["tokenizer"] == fingerprint(AutoTokenizer.from_pretrained(tiny_lm))


@pytest.mark.parametrize("rows", [4, 5])  # 5 rows are padded to 6 across the 2 ranks, then unpadded
def test_logprobs_match_huggingface(actor, tiny_lm, rows):
    data = batch(rows, seed=rows)
    lp = actor.logprobs(data)
    assert lp.shape == (rows, T)
    if actor.call("Describe").weight_version == 0:
        assert torch.allclose(lp, hf_logprobs(tiny_lm, data), atol=1e-5)


def test_bad_requests_are_refused_and_change_nothing(actor):
    data = batch()
    before = actor.logprobs(data)
    ppo = batch()
    ppo.batch["actor_logprobs"] = before
    ppo.batch["advantages"] = torch.ones(4, T)
    nan = DataProto(dict(ppo.batch))
    nan.batch["advantages"] = ppo.batch["advantages"].clone()
    nan.batch["advantages"][2, 1] = float("nan")
    short = DataProto(dict(ppo.batch))
    short.batch["advantages"] = torch.ones(4, T - 1)
    bad = grpc.StatusCode.INVALID_ARGUMENT
    expect(bad, lambda: actor.update(100, "ppo", data), "missing tensor(s) ['advantages', 'actor_logprobs']")
    expect(bad, lambda: actor.update(100, "ppo", nan), "tensor 'advantages' has NaN or inf (first at row 2)")
    expect(bad, lambda: actor.update(100, "ppo", short), "tensor 'advantages' must be [4, 6]")
    expect(bad, lambda: actor.update(100, "ppo", ppo[:1]), "a batch of 1 rows cannot be split over 2 ranks")
    expect(bad, lambda: actor.update(100, "ppx", ppo), "unknown loss 'ppx'")
    expect(bad, lambda: actor.update(100, "value", ppo), "the actor role does not train with loss 'value'")
    expect(bad, lambda: actor.update(100, "ppo", ppo, clip_ratio=0.2), "unknown key(s) ['clip_ratio']")
    expect(bad, lambda: actor.update(100, "ppo", ppo, ppo_epochs="two"), "loss ppo.ppo_epochs: expected int")
    expect(bad, lambda: actor.update(100, "ppo", ppo, ppo_epochs=2**31), "ppo.ppo_epochs=2147483648 must be in 1..100")
    expect(
        bad,
        lambda: actor.update(100, "ppo", ppo, clip_ratio_low=float("nan")),
        "ppo.clip_ratio_low=nan must be a finite",
    )
    expect(bad, lambda: actor.update(0, "ppo", ppo), "step must be > 0")
    expect(bad, lambda: actor.call("ComputeValues", actor_pb2.BatchRequest(), data), "call ComputeLogProbs")
    wrong = batch()
    wrong.batch["attention_mask"] = wrong.batch["attention_mask"][:, 1:]
    expect(bad, lambda: actor.logprobs(wrong), "tensor 'attention_mask' must be [4, 11]")
    floats = batch()
    floats.batch["responses"] = floats.batch["responses"].double()  # was INTERNAL, from a rank's gather()
    expect(bad, lambda: actor.logprobs(floats), "tensor 'responses' must hold integers")
    assert actor.client.health() == "SERVING"
    assert torch.equal(actor.logprobs(data), before)  # weights unchanged


def test_ppo_raises_the_logprob_of_a_positive_advantage(actor):
    data = batch(seed=7)
    before = actor.logprobs(data)
    data.batch["actor_logprobs"] = before
    adv = torch.zeros(4, T)
    adv[1] = 1.0
    data.batch["advantages"] = adv
    step = next_step(actor) + 1  # skip one: the skipped step is then older than the last applied
    reply = actor.update(step, "ppo", data, ppo_epochs=2, mini_batch_size=2, clip_ratio_high=0.28, entropy_coeff=0.01)
    assert reply.metrics["actor/num_optimizer_steps"] == 4 and reply.metrics["actor/grad_norm"] > 0
    assert "actor/pg_clipfrac" in reply.metrics and "actor/entropy" in reply.metrics
    after = actor.logprobs(batch(seed=7))
    assert seq_logprob(after, data)[1] > seq_logprob(before, data)[1]
    # a retried step is not applied twice; an older one is refused
    again = actor.update(step, "ppo", data)
    assert again.already_applied and again.metrics == reply.metrics
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: actor.update(step - 1, "ppo", data), "is older than")
    assert torch.equal(actor.logprobs(batch(seed=7)), after)


@pytest.mark.parametrize(
    "loss,metric",
    [
        ("gspo", "actor/seq_ratio_mean"),
        ("cispo", "actor/pg_clipfrac"),
        ("gmpo", "actor/pg_clipfrac_lower"),
        ("sapo", "actor/pg_gate_mean"),
        ("clip_cov", "actor/clip_cov_frac"),
        ("kl_cov", "actor/kl_cov_frac"),
    ],
)
def test_every_policy_loss_raises_the_logprob_of_a_positive_advantage(actor, loss, metric):
    """Each loss of the table through the service's two ranks, with nothing but its name: its own defaults
    (meshrl/config/losses.py POLICY_LOSSES) and metrics, and two epochs so the ratio leaves 1."""
    data = batch(seed=8)
    before = actor.logprobs(data)
    data.batch["actor_logprobs"] = before
    adv = torch.zeros(4, T)
    adv[1] = 1.0
    data.batch["advantages"] = adv
    reply = actor.update(next_step(actor), "ppo", data, ppo_epochs=2, mini_batch_size=2, policy_loss=loss)
    assert metric in reply.metrics and math.isfinite(reply.metrics["actor/pg_loss"])
    assert seq_logprob(actor.logprobs(batch(seed=8)), data)[1] > seq_logprob(before, data)[1]
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: actor.update(
            next_step(actor), "ppo", data, policy_loss=loss, **{"ppo_kl_coef" if loss != "kl_cov" else "tau_pos": 1.0}
        ),
        "is read by policy_loss",
    )


def test_rejected_responses_leave_the_update_and_weights_follow_the_mode(actor, tmp_path):
    """algorithm.rollout_rs through the service: the one response with a positive advantage was sampled by a
    policy far from the actor's (rollout log-probs 2 nats below: -log r = -2, outside [ln 0.5, ln 2]), so
    token_k1 rejects it and the update is the one with no advantage at all (the optimizer's moments still
    move the weights); so is a geometric weight in mask mode (e^2 > the cap: 0), and a truncated one (2)
    lets that response learn. Each update from the same checkpoint."""
    data = batch(seed=9)
    before = actor.logprobs(data)
    data.batch["actor_logprobs"] = before
    data.batch["rollout_logprobs"] = before - 2.0 * (torch.arange(4) == 1).float()[:, None]
    adv = torch.zeros(4, T)
    adv[1] = 1.0
    step, saved = next_step(actor), actor_pb2.CheckpointRequest(path=str(tmp_path / "c"))
    actor.call("SaveCheckpoint", saved)

    def after(advantages, **params) -> tuple[torch.Tensor, dict]:
        actor.call("LoadCheckpoint", saved)
        reply = actor.update(step, "ppo", DataProto(dict(data.batch, advantages=advantages)), **params)
        return actor.logprobs(batch(seed=9)), reply.metrics

    still, _ = after(torch.zeros(4, T))
    rejected, m = after(adv, rollout_rs="token_k1", rollout_rs_threshold="2")
    # (the metrics are micro-batch figures averaged by their share of the batch's tokens: > 0, not 1/4)
    assert m["actor/rollout_rs_seq_masked_frac"] > 0 and torch.allclose(rejected, still, atol=1e-6)
    masked, m = after(adv, rollout_is="geometric", rollout_is_mode="mask")
    assert m["actor/rollout_is_masked_frac"] > 0 and torch.allclose(masked, still, atol=1e-6)
    truncated, m = after(adv, rollout_is="geometric")
    assert m["actor/rollout_is_capped_frac"] > 0 and seq_logprob(truncated, data)[1] > seq_logprob(still, data)[1]


@pytest.mark.parametrize(
    "schedule",
    [
        {},
        {"mini_batch_size": 2},
        {"mini_batch_size": 2, "shuffle": True, "seed": 3},
        {"ppo_epochs": 2, "mini_batch_size": 2},
    ],
    ids=["one-step", "mini-batches", "shuffled", "two-epochs"],
)
def test_an_update_finds_its_own_old_logprobs(actor, tmp_path, schedule):
    """old_logprobs_key="": the first mini-batch's ratio against its own pass's detached log-probs, the
    others' against a pass inside the update before the first optimizer step, give the same update as
    the explicit path (a log-prob call first), so a step can skip that call whatever its schedule."""
    actor.update(next_step(actor), "sft", batch(seed=5))
    actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "c")))
    data = batch(seed=17)
    data.batch["advantages"] = torch.linspace(-1, 1, 4)[:, None].expand(4, T).contiguous()
    step = next_step(actor)
    explicit = DataProto(dict(data.batch, actor_logprobs=actor.logprobs(data)))
    r1 = actor.update(step, "ppo", explicit, **schedule)
    after_explicit = actor.logprobs(data)
    actor.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "c")))
    own = DataProto(dict(data.batch, rollout_logprobs=explicit.batch["actor_logprobs"] - 0.5))
    r2 = actor.update(step, "ppo", own, old_logprobs_key="", **schedule)
    assert torch.allclose(actor.logprobs(data), after_explicit, atol=1e-6)
    for key in ("actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert r2.metrics[key] == pytest.approx(r1.metrics[key], abs=1e-6), key
    assert r2.metrics["actor/grad_norm"] == pytest.approx(r1.metrics["actor/grad_norm"], rel=1e-5)
    assert r2.metrics["actor/num_optimizer_steps"] == r1.metrics["actor/num_optimizer_steps"]
    if not schedule:  # one optimizer step: the ratio is 1 everywhere
        assert r2.metrics["actor/ppo_kl"] == 0
    else:  # later mini-batches were taken after the first one's step: their ratio moved
        assert r2.metrics["actor/ppo_kl"] != 0
    assert r2.metrics["rollout/kl_to_actor"] == pytest.approx(0.5, abs=1e-5)


def test_dpo_raises_the_chosen_vs_rejected_margin(actor):
    data = batch(rows=4, seed=11)  # rows 0/2 chosen, 1/3 rejected
    data.batch["response_mask"] = torch.ones(4, T)
    ref = actor.logprobs(data)
    data.batch["ref_logprobs"] = ref
    margin = lambda lp: (seq_logprob(lp, data)[0::2] - seq_logprob(lp, data)[1::2]).mean()  # noqa: E731
    before = margin(ref)
    step = next_step(actor)
    reply = actor.update(step, "dpo", data, beta=0.5)
    assert reply.metrics["actor/dpo_loss"] == pytest.approx(0.6931, abs=1e-3)  # log 2 at the start
    assert margin(actor.logprobs(batch(rows=4, seed=11))) > before


def test_sft_lowers_the_nll(actor):
    data = batch(seed=13)
    before = seq_logprob(actor.logprobs(data), data).sum()
    step = next_step(actor)
    reply = actor.update(step, "sft", data, ppo_epochs=3)
    assert reply.metrics["actor/sft_loss"] > 0
    assert seq_logprob(actor.logprobs(batch(seed=13)), data).sum() > before


def test_checkpoint_round_trip_into_a_fresh_service(actor, tiny_lm, tmp_path):
    actor.update(next_step(actor), "sft", batch(seed=5))  # the weights differ from the model folder's
    data = batch(seed=3)
    expected = actor.logprobs(data)
    saved = actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "ckpt"), export_hf=True))
    fresh = Service("--role", "actor", "--model", str(tiny_lm), "--world-size", "2", "--lr", "1e-3")
    try:
        assert not torch.equal(fresh.logprobs(data), expected)
        loaded = fresh.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "ckpt")))
        assert loaded.step == saved.step
        assert torch.equal(fresh.logprobs(data), expected)
        assert fresh.call("Describe").weight_version == actor.call("Describe").weight_version
        # optimizer and schedule came back too: the same next update lands on the same weights
        sft, step = batch(seed=21), next_step(actor)
        actor.update(step, "sft", sft)
        fresh.update(step, "sft", sft)
        assert torch.allclose(fresh.logprobs(data), actor.logprobs(data), atol=1e-6)
    finally:
        fresh.stop()
    assert torch.allclose(hf_logprobs(tmp_path / "ckpt" / "hf", data), expected, atol=1e-5)


def test_checkpoints_stay_under_the_root_and_counters_are_bounded(tiny_lm, tmp_path):
    """A caller cannot make the actor write or read (DCP unpickles metadata) outside --checkpoint-root, nor
    pin its step with an absurd one."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    s = Service("--role", "actor", "--model", str(tiny_lm), "--world-size", "1", "--lr", "1e-3", root=str(root))
    try:
        bad = grpc.StatusCode.INVALID_ARGUMENT
        for path in (str(outside / "c"), "../outside/c", "escape/c", "/etc"):
            for method in ("SaveCheckpoint", "LoadCheckpoint"):
                expect(
                    bad,
                    lambda: s.call(method, actor_pb2.CheckpointRequest(path=path)),  # noqa: B023 - called at once, in the loop
                    "is outside this service's checkpoint root",
                )
        assert not any(outside.iterdir())  # nothing was written there
        saved = s.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path="run/c"))  # relative: under the root
        assert saved.path == str(root.resolve() / "run" / "c") and (root / "run" / "c" / "actor_service.json").is_file()
        s.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=str(root / "run" / "c")))
        data = batch(seed=5)
        expect(bad, lambda: s.update(2**63 - 1, "sft", data), "UpdateRequest.step must be in 1..")
        expect(bad, lambda: s.update(10_001, "sft", data), "is more than 10000 past the last applied step 0")
        assert s.update(1, "sft", data).metrics["actor/sft_loss"] > 0  # the service still trains
        expect(
            bad,
            lambda: s.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address="127.0.0.1:1", version=2**62)),
            "PushWeightsRequest.version must be in 1..",
        )
    finally:
        s.stop()


def long_update(service, step, **call):
    """An SFT update of 100 epochs x 16 mini-batches (1,600 optimizer steps): a minute or more here."""
    spec = actor_pb2.LossSpec(
        name="sft",
        params={"ppo_epochs": to_value(100, "ppo_epochs"), "mini_batch_size": to_value(8, "mini_batch_size")},
    )
    return service.client.call(
        "Update", Payload(actor_pb2.UpdateRequest(step=step, loss=spec), batch(rows=128)), **call
    )


def test_an_update_whose_caller_goes_away_stops_between_micro_batches(tiny_lm, tmp_path):
    """An expired Update stops at the next micro-batch: the optimizer steps it took stay, so the service
    refuses to update, save or push (the weights are between two steps) until a checkpoint is loaded.
    SIGTERM stops a busy actor the same way, within the server's grace."""
    import threading
    import time

    s = Service(
        "--role",
        "actor",
        "--model",
        str(tiny_lm),
        "--world-size",
        "1",
        "--lr",
        "1e-3",
        "--micro-batch-size",
        "2",
        root=str(tmp_path),
    )
    try:
        probe = batch(seed=3)
        s.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path="c"))
        saved = s.logprobs(probe)
        expect(grpc.StatusCode.DEADLINE_EXCEEDED, lambda: long_update(s, 1, timeout=2), "")
        partial = s.call("Describe").details["partial"]  # Describe waits for nothing: poll until it stopped
        for _ in range(600):
            if partial:
                break
            time.sleep(0.1)
            partial = s.call("Describe").details["partial"]
        taken = int(partial.split(" after ")[1].split()[0])
        assert 0 < taken < 1600 and "of its 1600 optimizer steps" in partial, partial
        for call in (
            lambda: s.update(1, "sft", probe),
            lambda: s.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path="d")),
            lambda: s.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address="127.0.0.1:1")),
        ):
            expect(grpc.StatusCode.FAILED_PRECONDITION, call, "LoadCheckpoint first")
        s.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path="c"))
        assert torch.equal(s.logprobs(probe), saved) and s.call("Describe").details["partial"] == ""
        assert s.update(1, "sft", probe).step == 1  # whole again

        busy = threading.Thread(target=lambda: pytest.raises(ServiceError, long_update, s, 2), daemon=True)
        busy.start()
        time.sleep(2)
        s.proc.terminate()
        assert s.proc.wait(30) == 0  # the 5 s grace, then the update stops at its next micro-batch
        busy.join(10)
    finally:
        if s.proc.poll() is None:
            s.stop()


def test_the_lr_schedule_advances_once_per_update(tiny_lm, tmp_path):
    """Warm-up over 2 updates, then cosine to 10% at update 5, as verl counts them: each Update's two
    optimizer steps (mini-batches of 2 rows) run at that update's rate."""
    s = Service(
        "--role",
        "actor",
        "--model",
        str(tiny_lm),
        "--world-size",
        "1",
        "--lr",
        "1e-3",
        "--warmup-steps",
        "2",
        "--total-steps",
        "5",
        "--lr-schedule",
        "cosine",
        "--min-lr-ratio",
        "0.1",
        root=str(tmp_path),
    )
    try:
        replies = [s.update(step, "sft", batch(seed=step), mini_batch_size=2) for step in range(1, 6)]
    finally:
        s.stop()
    assert all(r.metrics["actor/num_optimizer_steps"] == 2 for r in replies)
    # 1e-3 x: 1/2, 2/2 (warm-up), then 0.1 + 0.9 * (1 + cos(pi * k / 3)) / 2 for k = 0, 1, 2
    assert [r.metrics["actor/lr"] for r in replies] == pytest.approx([5e-4, 1e-3, 1e-3, 7.75e-4, 3.25e-4])


def test_offload_and_reload(actor):
    assert actor.call("Offload", actor_pb2.OffloadRequest()).device == "cpu"
    assert actor.call("Reload", actor_pb2.OffloadRequest()).device in ("cpu", "cuda:0")


def test_push_weights_checks_its_request(actor):
    for address in ("", "127.0.0.1:70000", "rollout", "127.0.0.1:x"):  # port 70000 was dialled (as 4464)
        expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=address, version=1)),  # noqa: B023 - called at once, in the loop
            "must be HOST:PORT with a port in 1..65535",
        )
    somewhere = {"rollout_address": "127.0.0.1:1", "version": 1}
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: actor.call("PushWeights", actor_pb2.PushWeightsRequest(transport="pigeon", **somewhere)),
        "transport must be one of",
    )
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: actor.call("PushWeights", actor_pb2.PushWeightsRequest(bucket_bytes=8, **somewhere)),
        "bucket_bytes must be 0",
    )


def test_init_over_rpc_ref_and_critic(tiny_lm):
    ref = Service("--role", "ref", "--world-size", "1")
    critic = Service(
        "--role", "critic", "--model", str(tiny_lm), "--world-size", "1", "--engine", "plain", "--lr", "1e-3"
    )
    try:
        data = batch()
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: ref.logprobs(data, "ref_logprobs"), "call Init first")
        expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: ref.call(
                "Init", actor_pb2.InitRequest(model=str(tiny_lm), engine={"engin": to_value("plain", "e")})
            ),
            "unknown key(s) ['engin']",
        )
        init = actor_pb2.InitRequest(model=str(tiny_lm), engine={"engine": to_value("plain", "e")})
        assert ref.call("Init", init).details["initialized"] == "true"
        assert ref.call("Init", init).role == "ref"  # the same settings again: fine
        other = actor_pb2.InitRequest(model=str(tiny_lm), engine={"engine": to_value("fsdp2", "e")})
        expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: ref.call("Init", other), "already initialized")
        assert torch.allclose(ref.logprobs(data, "ref_logprobs"), hf_logprobs(tiny_lm, data), atol=1e-5)
        expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: ref.update(1, "ppo", data), "it is frozen")

        values = critic.call("ComputeValues", actor_pb2.BatchRequest(), data).data.batch["values"]
        assert values.shape == (4, T)
        data.batch["values"] = values
        data.batch["returns"] = torch.ones(4, T)
        mask = data.batch["response_mask"]
        err = lambda v: ((v - 1).abs() * mask).sum()  # noqa: E731
        reply = critic.update(1, "value", data, ppo_epochs=4, clip_range_value=10.0)
        assert reply.metrics["critic/num_optimizer_steps"] == 4 and "critic/vf_loss" in reply.metrics
        after = critic.call("ComputeValues", actor_pb2.BatchRequest(), batch()).data.batch["values"]
        assert err(after) < err(values)
    finally:
        ref.stop()
        critic.stop()


def ragged(seed: int) -> DataProto:
    """Rows of very different prompt and response lengths (verl's layout), so that a token budget groups
    them differently on the two ranks."""
    prompts, responses = [5, 1, 2, 5, 1, 2, 1, 2], [6, 1, 2, 6, 1, 1, 1, 2]
    mask = torch.zeros(8, P + T, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        mask[i, P - p : P + r] = 1
    ids = torch.randint(4, 100, (8, P + T), generator=torch.Generator().manual_seed(seed)) * mask
    return DataProto(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, P:],
            "response_mask": mask[:, P:].float(),
        }
    )


def test_a_token_budget_gives_the_same_logprobs_and_updates(actor, tmp_path):
    """--micro-batch-tokens: rows grouped by length and cut to each group's longest row; the ranks agree
    on how many passes they run (FSDP) although their rows group differently."""
    from services.actor.batches import token_groups

    data = ragged(seed=31)
    parts = data.chunk(2)
    assert len(token_groups(parts[0], 16)) != len(token_groups(parts[1], 16))  # the ranks must agree
    actor.update(next_step(actor), "sft", batch(seed=5))
    actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "c")))
    budget = Service(
        "--role",
        "actor",
        "--model",
        actor.call("Describe").model,
        "--world-size",
        "2",
        "--lr",
        "1e-3",
        "--micro-batch-tokens",
        "16",
    )
    try:
        budget.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "c")))
        mask = data.batch["response_mask"]  # padding positions are 0 with a budget (they were never computed)
        same = lambda a, b: torch.allclose(a * mask, b * mask, atol=1e-5)  # noqa: E731
        lp = actor.logprobs(data)
        assert same(budget.logprobs(data), lp)
        ppo = DataProto(
            dict(data.batch, actor_logprobs=lp, advantages=torch.linspace(-1, 1, 8)[:, None].expand(8, T).contiguous())
        )
        step = next_step(actor)
        r1 = actor.update(step, "ppo", ppo, mini_batch_size=4)
        r2 = budget.update(step, "ppo", ppo, mini_batch_size=4)
        assert r2.metrics["actor/num_optimizer_steps"] == r1.metrics["actor/num_optimizer_steps"] == 2
        assert r2.metrics["actor/grad_norm"] == pytest.approx(r1.metrics["actor/grad_norm"], rel=1e-4)
        assert r2.metrics["actor/pg_loss"] == pytest.approx(r1.metrics["actor/pg_loss"], abs=1e-5)
        after = actor.logprobs(data)
        assert not same(after, lp)  # it trained
        assert same(budget.logprobs(data), after)
        pairs = ragged(seed=32)  # DPO: rows (0, 1), (2, 3), ... stay together
        pairs.batch["ref_logprobs"] = actor.logprobs(pairs)
        step = next_step(actor)
        actor.update(step, "dpo", pairs, beta=0.5)
        budget.update(step, "dpo", pairs, beta=0.5)
        assert same(budget.logprobs(data), actor.logprobs(data))
    finally:
        budget.stop()


def test_rows_that_share_a_prompt_run_it_once_with_the_same_results(actor, tmp_path):
    """The default (--share-prompts on): a GRPO-like batch, 3 prompts sampled 4 times each, gives the same
    log-probs and the same PPO update as a service where every row runs its whole sequence."""
    from testkit.batches import grouped

    data = DataProto(grouped([5, 2, 4], [[6, 1, 3, 2], [6, 6, 1, 4], [1, 2, 3, 4]], width=(P, T), seed=3))
    actor.update(next_step(actor), "sft", batch(seed=5))
    actor.call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "c")))
    full = Service(
        "--role",
        "actor",
        "--model",
        actor.call("Describe").model,
        "--world-size",
        "2",
        "--lr",
        "1e-3",
        "--micro-batch-size",
        "2",
        "--no-share-prompts",
    )
    try:
        full.call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=str(tmp_path / "c")))
        mask = data.batch["response_mask"]
        same = lambda a, b: torch.allclose(a * mask, b * mask, atol=1e-5)  # noqa: E731
        lp = full.logprobs(data)
        assert same(actor.logprobs(data), lp)
        ppo = DataProto(dict(data.batch, advantages=torch.linspace(-1, 1, 12)[:, None].expand(12, T).contiguous()))
        step = next_step(actor)
        r1 = full.update(step, "ppo", ppo, old_logprobs_key="")
        r2 = actor.update(step, "ppo", ppo, old_logprobs_key="")
        assert r2.metrics["actor/grad_norm"] == pytest.approx(r1.metrics["actor/grad_norm"], rel=1e-4)
        assert r2.metrics["actor/pg_loss"] == pytest.approx(r1.metrics["actor/pg_loss"], abs=1e-6)
        after = full.logprobs(data)
        assert not same(after, lp)  # it trained
        assert same(actor.logprobs(data), after)
    finally:
        full.stop()
