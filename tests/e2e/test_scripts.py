"""The main job's scripts: run.sh refuses a bad --seed before doing anything; prepare.sh seeds everything it
builds (model, held-out split, SFT) with SEED and keeps what it built for that seed."""

import pathlib
import subprocess
import sys

import pandas as pd
import pytest
from safetensors.torch import load_file

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
MESHRL = str(pathlib.Path(sys.executable).parent / "meshrl")


@pytest.mark.parametrize("args", [["--seed", "two"], ["--seed"], ["trainer.seed=-1"]])
def test_run_refuses_a_bad_seed_before_setting_anything_up(args):
    done = subprocess.run(["bash", "scripts/run.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--seed" in done.stderr, done.stderr
    assert "pip" not in done.stdout  # setup.sh did not run


@pytest.mark.slow
def test_prepare_seeds_the_model_the_split_and_the_warm_up(tmp_path):
    run = tmp_path / "run"
    env = {"PATH": "/usr/bin:/bin", "MESHRL": MESHRL, "SEED": "3", "SFT_STEPS": "1"}
    subprocess.run(
        ["bash", "scripts/prepare.sh", str(run)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300
    )
    assert (run / "recipe").read_text().startswith("seed 3 ") and (run / "sft" / "hf" / "config.json").is_file()
    expected = make_data(tmp_path / "expected", ArithmeticConfig(seed=3))
    assert pd.read_parquet(run / "data" / "test.parquet").equals(pd.read_parquet(expected["test"]))
    assert len(pd.read_parquet(expected["test"])) == 500
    ours = load_file(run / "model" / "model.safetensors")
    theirs = load_file(make_model(tmp_path / "m3", TinyModelConfig(seed=3)) / "model.safetensors")
    assert all((ours[k] == theirs[k]).all() for k in ours)
    built = (run / "sft" / "hf" / "model.safetensors").stat().st_mtime_ns
    subprocess.run(
        ["bash", "scripts/prepare.sh", str(run)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=60
    )
    assert (run / "sft" / "hf" / "model.safetensors").stat().st_mtime_ns == built  # same seed: kept
