"""`meshrl grpo|sft [--config FILE] [section.key=value ...]`: run an algorithm loop."""

import argparse

from orchestrator.config import load_config

LOOPS = {"grpo": "orchestrator.grpo", "sft": "orchestrator.sft"}


def main(argv: list[str]) -> int:
    import importlib

    p = argparse.ArgumentParser(prog="meshrl <algorithm>")
    p.add_argument("algorithm", choices=sorted(LOOPS))
    p.add_argument("--config", default=None, help="YAML file; overrides follow as section.key=value")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    run_dir = importlib.import_module(LOOPS[args.algorithm]).run(cfg)
    print(f"run finished: {run_dir}")
    return 0
