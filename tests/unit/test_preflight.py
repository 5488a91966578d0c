"""Config mistakes found before any service starts: one line naming the key (orchestrator.lifecycle.preflight)."""

import socket
import subprocess
import sys

import pytest

from orchestrator.config import load_config
from orchestrator.lifecycle.preflight import check
from orchestrator.main import LOOPS


@pytest.fixture
def base(tiny_lm, arithmetic_data):
    return [
        f"actor.model={tiny_lm}",
        f"data.train_files={arithmetic_data['train']}",
        "data.train_batch_size=4",
        "rollout.n=2",
    ]


def roles(algorithm, cfg):
    return LOOPS[algorithm]().setup(cfg)


def checked(algorithm, overrides):
    cfg = load_config(None, overrides)
    check(cfg, roles(algorithm, cfg))


@pytest.mark.parametrize(
    "algorithm, extra, match",
    [
        (
            "grpo",
            ["actor.engine=plain", "actor.world_size=3"],
            r"actor.engine=plain runs one process: set actor.world_size=1",
        ),
        (
            "grpo",
            ["actor.world_size=9"],
            r"actor.world_size=9 is more ranks than the 8 rows of a step "
            r"\(data.train_batch_size=4 x rollout.n=2\)",
        ),
        ("sft", ["actor.world_size=5"], r"more ranks than the 4 rows of a step \(data.train_batch_size=4\)"),
        ("ppo", ["critic.world_size=9"], r"critic.world_size=9"),
        (
            "grpo",
            ["actor.world_size=2", "actor.sequence_parallel=2", "actor.use_kl_loss=true", "ref.world_size=1"],
            r"actor.sequence_parallel=2 splits each sequence .* ref.world_size=1 is not a multiple of it",
        ),
        ("grpo", ["actor.sequence_parallel=2", "actor.padding_free=false"], r"needs padding_free=true"),
        (
            "grpo",
            ["actor.world_size=18", "actor.sequence_parallel=2", "actor.use_kl_loss=false"],
            r"more ranks than the 8 rows .* 9 groups of ranks hold rows",
        ),
        ("grpo", ["rollout.weight_transport=ipc"], r"rollout.weight_transport=ipc must be one of"),
        ("grpo", ["rollout.weight_bucket_mb=0"], r"rollout.weight_bucket_mb=0 must be >= 1"),
        ("grpo", ["rollout.dtype=float8"], r"rollout.dtype=float8 must be one of"),
        ("grpo", ["algorithm.rollout_is=tis"], r"algorithm.rollout_is=tis must be one of"),
        ("grpo", ["rollout.colocate=true", "trainer.max_staleness=1"], r"runs them at once: set one of them off"),
        ("grpo", ["algorithm.rollout_is_cap=0.5"], r"algorithm.rollout_is_cap=0.5 must be >= 1"),
        ("grpo", ["rollout.backend=sglang"], r"rollout.backend=sglang must be one of"),
        ("grpo", ["rollout.chunks=0"], r"rollout.chunks=0 must be in 1..16"),
        ("grpo", ["rollout.multi_turn=true", "rollout.max_turns=0"], r"rollout.max_turns=0 and rollout.concurrency"),
        ("grpo", ["rollout.multi_turn=true", "rollout.max_turns=40"], r"a multi-turn response of up to 640 tokens"),
        ("grpo", ["rollout.multi_turn=true", "env.reward=judge"], r"env.reward=judge must be one of"),
        ("dpo", ["rollout.multi_turn=true"], r"rollout.multi_turn works with ppo, grpo, rloo and reinforce"),
        ("grpo", ["rollout.on_update=drop"], r"rollout.on_update=drop must be one of"),
        (
            "grpo",
            ["rollout.on_update=keep", "rollout.engine_in_process=false"],
            r"on_update=keep needs engine_in_process",
        ),
        ("grpo", ["actor.lora_rank=8", "actor.lora_experts=true"], r"actor.lora_experts=true: no rollout takes"),
        ("grpo", ["rollout.max_new_tokens=300"], r"leaves no room for a prompt in rollout.max_model_len=256"),
        (
            "grpo",
            ["rollout.max_model_len=1024"],
            r"rollout.max_model_len=1024 is longer than the 512 positions actor.model encodes "
            r"\(max_position_embeddings in its config.json\): set rollout.max_model_len <= 512",
        ),
        ("grpo", ["data.max_prompt_length=250"], r"data.max_prompt_length=250 \+ rollout.max_new_tokens=16 exceeds"),
        ("grpo", ["reward.on_error=ignore"], r"reward.on_error=ignore must be one of"),
        ("grpo", ["reward.batched=true"], r"reward.batched=true applies to a user function"),
        ("grpo", ["reward.function=/no/such/file.py:compute_score"], r"file /no/such/file.py not found"),
        ("grpo", ["reward.function=no_colon.py"], r"must look like path/to/file.py:function_name"),
        ("grpo", ["rollout.agent=/no/such/agent.py:agent"], r"rollout.agent=/no/such/agent.py:agent: file /no/such"),
        (
            "grpo",
            ["rollout.agent=a.py:f", "rollout.agent_command=node a.js"],
            r"rollout.agent=a.py:f or rollout.agent_co",
        ),
        ("grpo", ["rollout.agent=a.py:f", "rollout.multi_turn=true"], r"leave rollout.multi_turn false"),
        ("dpo", ["rollout.agent=examples/agents/calculator.py:agent"], r"rollout.agent works with ppo, grpo"),
        (
            "grpo",
            ["rollout.agent=examples/agents/calculator.py:agent", "rollout.agent_python=/no/such/python"],
            r"rollout.agent_python=/no/such/python",
        ),
        ("grpo", ["trainer.run_dir="], r"trainer.run_dir is empty"),
        ("grpo", ["reward.model=/no/such/rm"], r"reward.model=/no/such/rm is not a HuggingFace model folder"),
        ("grpo", ["reward.model=/no/such/rm", "reward.function=r.py:f"], r"reward.function and reward.model both set"),
        ("grpo", ["actor.lr=nan"], r"actor.lr: expected float, got str 'nan'"),
        ("grpo", ["actor.lr=.nan"], r"actor.lr=nan must be a finite number"),
        ("grpo", ["actor.lr=-1"], r"actor.lr=-1.0 must be > 0"),
        ("ppo", ["critic.lr=0"], r"critic.lr=0.0 must be > 0"),
        ("grpo", ["rollout.temperature=-1"], r"rollout.temperature=-1.0 must be >= 0"),
        ("grpo", ["rollout.top_p=0"], r"rollout.top_p=0.0 must be in \(0, 1\]"),
        ("grpo", ["algorithm.kl_coef=.inf"], r"algorithm.kl_coef=inf must be a finite number"),
        ("grpo", ["reward.address=127.0.0.1:70000"], r"reward.address=127.0.0.1:70000 must be HOST:PORT with a port"),
        ("grpo", ["rollout.address=localhost"], r"rollout.address=localhost must be HOST:PORT"),
        ("grpo", ["rollout.address=127.0.0.2:1,x"], r"rollout.address=127.0.0.2:1,x \('x'\) must be HOST:PORT"),
        ("grpo", ["rollout.address=127.0.0.2:1,127.0.0.2:1"], r"names a replica twice"),
        ("grpo", ["rollout.replicas=0"], r"rollout.replicas=0 must be >= 1"),
        ("grpo", ["algorithm.dynamic_sampling=true", "trainer.max_staleness=1"], r"set one of them off"),
        ("grpo", ["algorithm.dynamic_sampling=true", "rollout.n=1"], r"rollout.n=1 makes groups of one"),
        ("grpo", ["algorithm.dynamic_sampling_metric=f1"], r"algorithm.dynamic_sampling_metric=f1 must be one of"),
        ("grpo", ["algorithm.max_sample_rounds=0"], r"algorithm.max_sample_rounds=0 must be >= 1"),
        ("grpo", ["rollout.replicas=2", "rollout.colocate=true"], r"a fleet .* cannot share it"),
        ("grpo", ["rollout.partial=true"], r"rollout.partial=true trains samples begun .* trainer.max_staleness=K"),
        ("grpo", ["rollout.partial_tokens=-1"], r"rollout.partial_tokens=-1 must be >= 0"),
        ("grpo", ["rollout.partial_tokens=8"], r"rollout.partial_tokens=8 is read with rollout.partial=true"),
        *(
            ("grpo", ["rollout.partial=true", "trainer.max_staleness=2", *extra], match)
            for extra, match in [
                (["rollout.multi_turn=true"], r"rollout.partial=true: plays multi-turn or agent episodes"),
                (["algorithm.dynamic_sampling=true"], r"rollout.partial=true: algorithm.dynamic_sampling samples"),
                (["rollout.chunks=2"], r"rollout.partial=true: rollout.chunks"),
                (["rollout.colocate=true"], r"rollout.partial=true: rollout.colocate"),
                (["rollout.on_update=keep"], r"rollout.partial=true: rollout.on_update=keep is for pushes during"),
            ]
        ),
        ("grpo", ["algorithm.overlong_buffer=17"], r"must be at most rollout.max_new_tokens=16, the limit it"),
        ("grpo", ["algorithm.overlong_buffer=4", "rollout.multi_turn=true"], r"a multi-turn episode has no such"),
        ("grpo", ["algorithm.overlong_buffer=-1"], r"algorithm.overlong_buffer=-1 must be >= 0"),
        (
            "grpo",
            ["actor.policy_loss=gspo", "actor.loss_agg_mode=token-mean"],
            r"actor.loss_agg_mode=token-mean must be seq-mean-token-mean with policy_loss=gspo",
        ),
        ("grpo", ["actor.policy_loss=dppo"], r"actor.policy_loss=dppo must be one of \('ppo', 'gspo', 'cispo'"),
        ("grpo", ["actor.tau_pos=2"], r"actor.tau_pos=2.0 is read by policy_loss sapo, not ppo"),
        ("opd", [], r"meshrl opd needs a teacher: teacher.model=FOLDER"),
        ("opd", ["teacher.address=127.0.0.1:1", "rollout.temperature=0"], r"greedy sampling \(rollout.temperature=0\)"),
        ("grpo", ["teacher.model=/no/such/folder"], r"teacher.model=/no/such/folder is not a HuggingFace model"),
        ("grpo", ["teacher.model=x", "algorithm.distill_coef=0"], r"algorithm.distill_coef=0.0 must be > 0"),
        # a LoRA adapter the model cannot take: refused before any service starts
        ("grpo", ["actor.lora_rank=1000"], r"actor.lora_rank=1000 is larger than model.layers.0.\S+ \(\d+ x \d+\)"),
        ("grpo", ["actor.lora_rank=8", "actor.lora_target_modules=foo_proj"], r"actor.lora_target_modules: \w+ has no"),
        ("grpo", ["actor.lora_rank=8", "actor.lora_target_modules=norm"], r"model.norm \(\w+\) is not a linear layer"),
        ("ppo", ["critic.lora_rank=1000"], r"critic.lora_rank=1000 is larger than"),
    ],
)
def test_bad_settings_are_one_line_errors(base, algorithm, extra, match):
    with pytest.raises(ValueError, match=match) as e:
        checked(algorithm, [*base, *extra])
    assert "\n" not in str(e.value)


def test_cuda_ipc_without_a_gpu_is_refused_unless_both_ends_are_elsewhere(base):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="cuda_ipc needs the actor and rollout on one GPU"):
        checked("grpo", [*base, "rollout.weight_transport=cuda_ipc"])
    checked(
        "grpo", [*base, "rollout.weight_transport=cuda_ipc", "actor.address=gpu-host:1", "rollout.address=gpu-host:2"]
    )


def test_world_sizes_resolve_and_fit_the_gpus(base, monkeypatch):
    from meshrl import hosts

    monkeypatch.setattr(hosts, "gpus", lambda: 0)
    cfg = load_config(None, base)
    assert (cfg.actor.world_size, cfg.ref.world_size, cfg.critic.world_size) == (1, 1, 1)  # auto on CPU
    check(cfg, roles("ppo", cfg))
    monkeypatch.setattr(hosts, "gpus", lambda: 2)
    assert load_config(None, base).actor.world_size == 2  # auto: one rank per GPU
    with pytest.raises(
        ValueError,
        match=r"actor.world_size=4 puts 4 ranks on this machine's 2 GPU\(s\), and NCCL "
        r"refuses two ranks on one device: set actor.world_size=auto",
    ):
        checked("grpo", [*base, "actor.world_size=4"])
    checked("grpo", [*base, "actor.world_size=4", "actor.address=elsewhere:1"])  # not placed here
    cfg = load_config(None, [*base, "actor.world_size=4"])
    check(cfg, roles("grpo", cfg), local=False)  # Ray places the ranks on its cluster
    for bad in ("actor.world_size=0", "ref.world_size=many", "critic.world_size=-1"):
        with pytest.raises(ValueError, match=r"world_size=.* must be a number of ranks >= 1 or 'auto'"):
            load_config(None, [*base, bad])
    with pytest.raises(ValueError, match=r"actor.world_size: expected int, got a bool"):
        load_config(None, [*base, "actor.world_size=true"])
    with pytest.raises(ValueError, match=r"threads=-1 must be >= 0"):
        load_config(None, [*base, "actor.threads=-1"])


def test_the_reward_file_is_read_not_run(base, tmp_path):
    f = tmp_path / "reward.py"
    f.write_text("import sys\nsys.exit('ran at import')\ndef other(): pass\n")
    with pytest.raises(ValueError, match=r"defines no 'compute_score' \(functions there: \['other'\]\)"):
        checked("grpo", [*base, f"reward.function={f}:compute_score"])
    f.write_text("def compute_score(:\n")
    with pytest.raises(ValueError, match=r"line 1"):
        checked("grpo", [*base, f"reward.function={f}:compute_score"])
    f.write_text("from math import fsum as compute_score\n")
    checked("grpo", [*base, f"reward.function={f}:compute_score"])
    checked("grpo", [*base, "reward.function=/no/file.py:f", "reward.address=elsewhere:1"])  # not ours to check


def test_a_good_config_passes(base, tiny_lm):
    for algorithm in LOOPS:
        checked(algorithm, [*base, *([f"teacher.model={tiny_lm}"] if algorithm == "opd" else [])])


def test_a_teacher_with_another_tokenizer_is_refused_before_anything_starts(base, bpe_lm, tmp_path):
    with pytest.raises(
        ValueError, match=r"teacher.model=\S+ has another tokenizer than actor.model=\S+ \(\d+ tokens"
    ) as e:
        checked("opd", [*base, f"teacher.model={bpe_lm}"])
    assert "\n" not in str(e.value)


def test_the_cli_says_it_in_one_line_before_starting_anything(base, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "grpo",
            *base,
            "actor.engine=plain",
            "actor.world_size=3",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert errors == [
        "meshrl grpo: error: actor.engine=plain runs one process: set actor.world_size=1 (it is 3), or use engine fsdp2"
    ], out.stderr
    assert "started" not in out.stderr and not (tmp_path / "run").exists()  # no service, no run folder


def test_help_lists_every_config_key():
    out = subprocess.run([sys.executable, "-m", "cli", "grpo", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: meshrl grpo [--config FILE]")
    for key in (
        "actor.lr=1.0e-05",
        "rollout.max_model_len=256",
        "reward.batched=false",
        "trainer.logger=",
        "data.max_prompt_length=0",
        "algorithm.kl_coef=0.001",
    ):
        assert key in out.stdout, key
    assert "reward.batched=false  The function takes lists" in out.stdout


@pytest.mark.parametrize("algorithm", ["dpo", "sft"])
@pytest.mark.parametrize(
    "keys, match",
    [(["trainer.max_staleness=1"], "runs synchronously: set it to 0"), (["rollout.partial=true"], "does not sample")],
)
def test_only_the_policy_gradient_loops_sample_ahead_or_carry_samples(algorithm, keys, match, base, tmp_path):
    from orchestrator.main import run

    cfg = load_config(None, [*base, f"trainer.run_dir={tmp_path}", *keys])
    with pytest.raises(ValueError, match=f"{algorithm} {match}"):
        run(algorithm, cfg)
    assert not any(tmp_path.iterdir())  # refused before anything started or was written


def test_a_symlinked_checkpoints_folder_is_refused_before_the_first_save(base, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (run / "checkpoints").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"checkpoints is a link to .*elsewhere: the services write checkpoints"):
        checked("grpo", [*base, f"trainer.run_dir={run}"])
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"trainer.run_dir=.*file is a file, not a folder"):
        checked("grpo", [*base, f"trainer.run_dir={tmp_path / 'file'}"])


def test_settings_no_service_of_the_run_reads_are_warned_about(base, caplog):
    with caplog.at_level("WARNING"):
        checked("sft", [*base, "rollout.temperature=0.5", "critic.lr=1e-3"])
    assert "critic.lr: set, but this run uses no critic service" in caplog.text
    assert "rollout.n, rollout.temperature: set, but this run uses no rollout service" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        checked("grpo", base)
    assert "do nothing" not in caplog.text


@pytest.mark.parametrize(
    "override,match",
    [
        ("actor_rollout_ref.actor.optim.lr=1e-6", r"verl's actor_rollout_ref.actor.optim.lr is actor.lr here"),
        ("trainer.save_freq=5", r"unknown key trainer.save_freq.*verl's trainer.save_freq is trainer.save_every here"),
        ("actor_rollout_ref.rollout.foo=1", r"a verl key: `meshrl grpo --help` lists ours"),
    ],
)
def test_verl_keys_get_a_hint_naming_ours(override, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])
    f = tmp_path / "verl.yaml"
    f.write_text("actor_rollout_ref:\n  rollout:\n    n: 8\ntrainer:\n  total_training_steps: 3\n")
    with pytest.raises(ValueError, match=r"is a verl config, not ours: convert it with `meshrl config from-verl"):
        load_config(str(f))  # a whole verl file: one line, not each key (tests/unit/test_from_verl.py)
    f.write_text("trainer:\n  total_training_steps: 3\n")
    with pytest.raises(ValueError, match=r"verl's trainer.total_training_steps is trainer.total_steps here"):
        load_config(str(f))


@pytest.mark.parametrize(
    "override,match",
    [
        (
            "remote_rm_url=http://rm:5000/get_reward",
            r"section.key=value \(OpenRLHF's remote_rm_url is reward.url here\)",
        ),
        ("reward.remote_url=http://rm:5000/get_reward", r"OpenRLHF's reward.remote_url is reward.url here"),
        ("input_key=question", r"OpenRLHF's input_key is data.prompt_key here"),
        ("data.input_key=question", r"unknown key data.input_key.*OpenRLHF's data.input_key is data.prompt_key here"),
        ("label_key=answer", r"OpenRLHF's label_key is data.answer_key here"),
        ("data.label_key=answer", r"OpenRLHF's data.label_key is data.answer_key here"),
        ("apply_chat_template=true", r"OpenRLHF's apply_chat_template is always on here"),
        ("prompt_max_len=512", r"OpenRLHF's prompt_max_len is data.max_prompt_length here"),
        ("generate_max_len=512", r"OpenRLHF's generate_max_len is rollout.max_new_tokens here"),
        ("n_samples_per_prompt=8", r"OpenRLHF's n_samples_per_prompt is rollout.n here"),
        ("actor_learning_rate=1e-6", r"OpenRLHF's actor_learning_rate is actor.lr here"),
        ("actor.adam.lr=1e-6", r"OpenRLHF's actor.adam.lr is actor.lr here"),
        ("init_kl_coef=0.01", r"OpenRLHF's init_kl_coef is algorithm.kl_coef \(with use_kl_loss: actor.kl_loss_coef"),
    ],
)
def test_openrlhf_keys_get_a_hint_naming_ours(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])


def test_openrlhf_flags_and_flat_yaml_keys_get_the_hint_too(tmp_path, capsys):
    from orchestrator.main import parse

    with pytest.raises(SystemExit):
        parse(["grpo", "--remote_rm_url", "http://rm:5000/get_reward", "--input_key=question"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --remote_rm_url http://rm:5000/get_reward --input_key=question" in err
    assert "(OpenRLHF's remote_rm_url is reward.url here) (OpenRLHF's input_key is data.prompt_key here)" in err
    f = tmp_path / "openrlhf.yaml"
    f.write_text("label_key: answer\ndata:\n  train_files: x.jsonl\n")
    with pytest.raises(ValueError, match=r"unknown config section\(s\) \['label_key'\].*is data.answer_key here"):
        load_config(str(f))


def test_a_flat_openrlhf_flag_under_a_section_gets_its_hint_not_a_close_key(tmp_path):
    """`reward.remote_rm_url` (a verl or OpenRLHF user's dotted override) was told "did you mean
    reward.model?"; it is OpenRLHF's remote_rm_url, which is reward.url here, in an override as in a YAML."""
    for override, ours in [
        ("reward.remote_rm_url=http://rm:5000/get_reward", "OpenRLHF's remote_rm_url is reward.url here"),
        ("critic.pretrain=models/rm", "OpenRLHF's critic_pretrain is critic.model here"),
        ("actor.learning_rate=1e-6", "OpenRLHF's actor_learning_rate is actor.lr here"),
    ]:
        with pytest.raises(ValueError) as e:
            load_config(None, [override])
        assert ours in str(e.value) and "did you mean" not in str(e.value), str(e.value)
    f = tmp_path / "mixed.yaml"
    f.write_text("reward:\n  remote_rm_url: http://rm:5000/get_reward\n")
    with pytest.raises(ValueError, match=r"remote_rm_url'\].*OpenRLHF's remote_rm_url is reward.url here\)$"):
        load_config(str(f))
    f.write_text("trainer:\n  seed: 1\n  sed: 2\n")  # trainer.seed is ours: no hint about it, the typo's
    with pytest.raises(ValueError) as e:
        load_config(str(f))
    assert "OpenRLHF" not in str(e.value) and "(did you mean trainer.seed?)" in str(e.value), str(e.value)


def test_reward_url_with_nothing_listening_stops_the_run_before_it_starts(base):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/get_reward"
        checked("grpo", [*base, f"reward.url={url}"])  # something listens: the run goes on
    with pytest.raises(ValueError, match=rf"^reward.url={url} cannot be reached: .*[Rr]efused"):
        checked("grpo", [*base, f"reward.url={url}"])
    cfg = load_config(None, [*base, f"reward.url={url}"])
    check(cfg, roles("grpo", cfg), local=False)  # Ray places the service, where the URL may be reachable
    with pytest.raises(ValueError, match=r"reward.url=localhost:5000 must be http\(s\)://HOST\[:PORT\]/PATH"):
        load_config(None, [*base, "reward.url=localhost:5000"])


def test_a_tensor_parallel_engine_needs_its_gpus(base, monkeypatch):
    """vLLM would fail only once it starts (on CPU: "Not enough allowed NUMA nodes"), after the actor."""
    from meshrl import hosts

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    tp2 = [*base, "rollout.tensor_parallel_size=2"]
    monkeypatch.setattr(hosts, "gpus", lambda: 1)
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel_size=2 .* this machine has 1: set it to at most 1"):
        checked("grpo", tp2)
    monkeypatch.setattr(hosts, "gpus", lambda: 0)
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel_size=2 .* this machine has none: set it to 1"):
        checked("grpo", tp2)
    checked("grpo", [*tp2, "rollout.backend=hf"])  # one process whatever the setting
    checked("grpo", [*tp2, "rollout.address=elsewhere:1"])  # not placed here
    cfg = load_config(None, tp2)
    check(cfg, roles("grpo", cfg), local=False)  # Ray places it
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # vllm-cpu's workers bound to a core each
    checked("grpo", tp2)
    monkeypatch.setattr(hosts, "gpus", lambda: 2)
    checked("grpo", tp2)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_a_group_baseline_with_one_sample_a_prompt_is_warned_about(algorithm, base, caplog):
    with caplog.at_level("WARNING"):
        checked(algorithm, [*base, "rollout.n=1"])
    assert f"{algorithm} advantages with rollout.n=1: each prompt's group is one sample" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        checked(algorithm, base)
        checked("reinforce", [*base, "rollout.n=1"])  # its baseline is the batch's
    assert "group baseline" not in caplog.text


@pytest.mark.parametrize(
    "override,match",
    [
        ("rollout.max_new_token=8", r"unknown key rollout.max_new_token \(did you mean rollout.max_new_tokens\?\)"),
        ("actor.temperature=0.5", r"unknown key actor.temperature \(did you mean rollout.temperature\?\)"),
        ("rolout.n=2", r"unknown section 'rolout' \(did you mean rollout.n\?\)"),
    ],
)
def test_a_typo_key_gets_the_closest_known_one(override, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])
    f = tmp_path / "typo.yaml"
    f.write_text("data:\n  train_batch_sise: 8\n")
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['train_batch_sise'\].*did you mean data.train_batch_size"
    ):
        load_config(str(f))
    with pytest.raises(ValueError) as e:
        load_config(None, ["trainer.save_freq=5"])  # verl's key: its hint, not a near miss
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize(
    "algorithm, key",
    [("ppo", "critic.model"), ("grpo", "teacher.model"), ("opd", "teacher.model")],
)
def test_a_critic_or_teacher_folder_that_is_not_there_is_refused_before_anything_starts(algorithm, key, base, tmp_path):
    with pytest.raises(ValueError, match=rf"^{key}=.*nope is not a HuggingFace model folder \(no config.json"):
        checked(algorithm, [*base, f"{key}={tmp_path / 'nope'}", f"trainer.run_dir={tmp_path / 'run'}"])
    if key == "critic.model":  # given by address, the folder is that service's to read
        checked(algorithm, [*base, f"{key}={tmp_path / 'nope'}", "critic.address=127.0.0.1:1"])


def test_a_folder_where_a_run_trained_is_refused_without_resume(base, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 0, "val/acc/mean": 0.1}\n')
    checked("grpo", [*base, f"trainer.run_dir={run}"])  # a run that failed before its first step: taken over
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "critic')  # killed mid-line
    with pytest.raises(ValueError) as e:
        checked("grpo", [*base, f"trainer.run_dir={run}"])
    line = str(e.value)
    assert "\n" not in line and f"trainer.run_dir={run} holds a run (steps logged in metrics.jsonl)" in line
    assert "trainer.resume=true" in line and "another trainer.run_dir (or remove that folder)" in line
    (run / "metrics.jsonl").unlink()
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step_80")
    with pytest.raises(ValueError, match=r"holds a run \(checkpoints up to step_80\)"):
        checked("sft", [*base, f"trainer.run_dir={run}"])
    checked("grpo", [*base, f"trainer.run_dir={run}", "trainer.resume=true"])  # the way on


def test_a_second_run_into_the_folder_stops_before_any_service_starts(base, tmp_path):
    from orchestrator.main import run

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_2")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match="holds a run"):
        run("grpo", load_config(None, [*base, f"trainer.run_dir={tmp_path}"]))
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing started
