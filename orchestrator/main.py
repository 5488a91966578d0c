"""`meshrl grpo|sft [--config FILE] [section.key=value ...]`: run an algorithm loop."""

import argparse
import importlib

from orchestrator.config import Config, load_config

LOOPS = {"grpo": "orchestrator.grpo", "sft": "orchestrator.sft"}


def parse(argv: list[str]) -> tuple[str, Config]:
    p = argparse.ArgumentParser(prog="meshrl <algorithm>")
    p.add_argument("algorithm", choices=sorted(LOOPS))
    p.add_argument("--config", default=None, help="YAML file; overrides follow as section.key=value")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)  # overrides may come before or after --config
    return args.algorithm, load_config(args.config, args.overrides)


def main(argv: list[str]) -> int:
    algorithm, cfg = parse(argv)
    run_dir = importlib.import_module(LOOPS[algorithm]).run(cfg)
    print(f"run finished: {run_dir}")
    return 0
