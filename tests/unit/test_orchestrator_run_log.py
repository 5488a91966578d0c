"""What a run records besides its curves: reward failures, sample generations, and the loggers users
read them in (TensorBoard, Weights & Biases and MLflow, both offline, with the real packages)."""

import json
import logging

import numpy as np
import torch

from meshrl.clients.reward import check_reply
from meshrl.dataproto import DataProto
from orchestrator.lifecycle.mesh import reward_request
from orchestrator.output.loggers import RunLog, samples_markdown
from orchestrator.output.readings import sample_rows, score_metrics
from orchestrator.run.trainer import every


def generated(n=4, T=3) -> DataProto:
    """A Generate reply as the rollout builds it: model inputs, log-probs, and the prompts' columns."""
    return DataProto(
        {
            "input_ids": torch.ones(n, 7, dtype=torch.long),
            "position_ids": torch.zeros(n, 7, dtype=torch.long),
            "attention_mask": torch.ones(n, 7, dtype=torch.long),
            "rollout_logprobs": torch.zeros(n, T),
            "responses": torch.ones(n, T, dtype=torch.long),
            "response_mask": torch.tensor([[1, 1, 0]] * n, dtype=torch.float32),
        },
        {
            "prompt": [
                [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{i}+1="}] for i in range(n)
            ],
            "data_source": ["arithmetic"] * n,
            "reward_model": [{"ground_truth": str(i + 1)} for i in range(n)],
            "response_text": [str(i + 1) for i in range(n)],
            "uid": [f"u{i}" for i in range(n)],
        },
    )


def test_the_reward_request_carries_text_and_masks_not_model_inputs():
    req = reward_request(generated())
    assert set(req.batch) == {"responses", "response_mask"}
    assert req.non_tensor_batch["prompt_text"].tolist() == ["0+1=", "1+1=", "2+1=", "3+1="]
    assert {"data_source", "reward_model", "response_text", "uid"} <= set(req.non_tensor_batch)


def test_a_scores_only_reply_gets_token_level_scores_on_the_last_token():
    gen = reward_request(generated(2))
    out = check_reply("x:1", gen, DataProto({"scores": torch.tensor([1.0, 2.0])}), {})
    assert out.token_level_scores.tolist() == [[0, 1, 0], [0, 2, 0]]


def test_failed_samples_are_counted_and_warned_about(caplog):
    gen = reward_request(generated(2))
    reply = DataProto(
        {"scores": torch.tensor([0.0, 1.0])},
        {"reward_status": ["error", "ok"], "reward_error": ["ZeroDivisionError: division by zero", ""]},
    )
    scored = check_reply("x:1", gen, reply, {})  # a server that sends the columns but no metrics
    with caplog.at_level(logging.WARNING):
        metrics = score_metrics(scored)
    assert metrics["reward/num_failed"] == 1.0 and metrics["critic/score/mean"] == 0.5
    assert "1 of 2 samples failed to score" in caplog.text and "ZeroDivisionError" in caplog.text


def test_sample_rows_hold_the_rendered_prompt_messages_response_score_truth_and_extras():
    """The prompt is logged as the model saw it (the chat template's rendering: system turn, role markers,
    generation prompt), decoded from the prompt ids the rollout was given; the messages beside it."""
    from meshrl.chat import render
    from meshrl.layout import rollout_tensors
    from meshrl.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    gen = generated(3)
    messages = gen.non_tensor_batch["prompt"]
    messages[1] = messages[1][1:]  # no system turn: a shorter prompt, left padded
    ids = [tokenizer(render(tokenizer, m, "test"), add_special_tokens=False)["input_ids"] for m in messages]
    gen = DataProto(rollout_tensors(ids, [[5, 6], [7], [8]], pad=tokenizer.pad_token_id), gen.non_tensor_batch)
    scored = check_reply(
        "x:1",
        gen,
        DataProto(
            {"scores": torch.tensor([1.0, 0.0, 1.0])},
            {
                "acc": [True, False, True],
                "pred": ["1", "x", "3"],
                "reward_status": ["ok"] * 3,
                "reward_error": [""] * 3,
            },
        ),
        {},
    )
    rows = sample_rows(gen, scored, tokenizer, 2)
    assert rows == [
        {
            "prompt": "<|system|>be brief\n<|user|>0+1=\n<|assistant|>",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "0+1="}],
            "response": "1",
            "score": 1.0,
            "ground_truth": "1",
            "acc": True,
            "pred": "1",
            "reward_status": "ok",
        },
        {
            "prompt": "<|user|>1+1=\n<|assistant|>",
            "messages": [{"role": "user", "content": "1+1="}],
            "response": "2",
            "score": 0.0,
            "ground_truth": "2",
            "acc": False,
            "pred": "x",
            "reward_status": "ok",
        },
    ]
    assert "| prompt | messages | response | score |" in samples_markdown(rows)


def test_every_n_steps_with_zero_meaning_never():
    assert [s for s in range(1, 7) if every(2, s)] == [2, 4, 6]
    assert not any(every(0, s) for s in range(1, 7))


def test_run_log_writes_jsonl_tensorboard_wandb_and_mlflow_offline(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = [{"prompt": "1+1=", "response": "2", "score": 1.0, "acc": np.bool_(True)}]
    with RunLog(tmp_path, ["console", "tensorboard", "wandb", "mlflow"], {"actor": {"lr": 1e-4}}, "grpo") as log:
        for step in (1, 2):
            log.write(step, {"critic/score/mean": 0.5 * step, "val/acc/best@3": 0.25, "skip": float("nan")})
            log.write_samples(step, rows)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples[1] == {"step": 2, "prompt": "1+1=", "response": "2", "score": 1.0, "acc": True}
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    run_id = (tmp_path / "mlruns_run_id").read_text()
    import mlflow

    history = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri()).get_metric_history(
        run_id, "critic/score/mean"
    )
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 1.0)]
    assert list((tmp_path / "mlruns").rglob("samples/step_000002.json"))


def test_a_resumed_run_logs_each_step_once_everywhere(tmp_path, monkeypatch):
    """A run cut after step 3 resumes from its step-1 checkpoint and redoes steps 2 and 3: the files hold
    each step once (the redone values), TensorBoard purges the old points, MLflow keeps one point per step."""
    for var in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    loggers = ["tensorboard", "mlflow"]
    with RunLog(tmp_path, loggers, {}, "grpo", after=-1) as log:
        for step in range(4):
            log.write(step, {"critic/score/mean": float(step)}, [True] if step == 0 else None)
            log.write_samples(step, [{"prompt": "p", "response": "r"}])
    with RunLog(tmp_path, loggers, {}, "grpo", after=1) as log:
        for step in (2, 3):
            log.write(step, {"critic/score/mean": 10.0 + step})
            log.write_samples(step, [{"prompt": "p", "response": "again"}])
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["critic/score/mean"]) for m in metrics] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["response"]) for s in samples] == [(0, "r"), (1, "r"), (2, "again"), (3, "again")]
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_id = (tmp_path / "mlruns_run_id").read_text()
    history = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri()).get_metric_history(
        run_id, "critic/score/mean"
    )
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("critic/score/mean")] == [(0, 0), (1, 1), (2, 12), (3, 13)]
    with RunLog(tmp_path, [], after=-1):  # a fresh run in the same folder starts the files afresh
        pass
    assert (tmp_path / "metrics.jsonl").read_text() == "" and not (tmp_path / "val.jsonl").read_text()


def test_tensorboard_event_files_hold_each_step_once_after_redone_steps(tmp_path):
    """A step redone after in-run recovery (forget_after) and again after a resume: TensorBoard's event
    files themselves hold it once, as the jsonl files do (not only TensorBoard's view of them), with the
    redone values; a fresh run in the folder starts them afresh."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    def events():
        out = []
        for path in sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*")):
            for e in EventFileLoader(str(path)).Load():
                out += [(v.tag, e.step, list(v.tensor.float_val)) for v in e.summary.value]  # scalars: [x]
        return sorted(out)

    with RunLog(tmp_path, ["tensorboard"], after=-1) as log:
        for step in range(4):
            log.write(step, {"score": float(step)})
            log.write_samples(step, [{"prompt": "p", "response": "r"}])
        log.forget_after(1)  # recovery went back to the step-1 checkpoint
        for step in (2, 3):
            log.write(step, {"score": 10.0 + step})
    with RunLog(tmp_path, ["tensorboard"], after=2) as log:  # cut after step 3, resumed from step 2
        log.write(3, {"score": 23.0})
    scores = [(step, value) for tag, step, value in events() if tag == "score"]
    assert scores == [(0, [0]), (1, [1]), (2, [12]), (3, [23])]
    assert [step for tag, step, _ in events() if tag.startswith("samples")] == [0, 1]
    view = EventAccumulator(str(tmp_path / "tensorboard"))
    view.Reload()
    assert [(e.step, e.value) for e in view.Scalars("score")] == [(0, 0), (1, 1), (2, 12), (3, 23)]
    with RunLog(tmp_path, ["tensorboard"], after=-1):
        pass
    assert events() == []
