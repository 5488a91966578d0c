"""`meshrl ppo|grpo|rloo|reinforce|dpo|sft [--config FILE] [section.key=value ...]`: run an algorithm loop."""

import argparse
import logging
import sys
from collections.abc import Callable

from meshrl.errors import ServiceError
from orchestrator import verl_keys
from orchestrator.config import Config, describe_keys, load_config
from orchestrator.loops import dpo, policy_gradient, sft
from orchestrator.loops.algorithm import Algorithm
from orchestrator.run import trainer

# One entry per CLI command: a fresh algorithm object for the run.
LOOPS: dict[str, Callable[[], Algorithm]] = {
    "ppo": policy_gradient.ppo,
    "grpo": policy_gradient.grpo,
    "rloo": policy_gradient.rloo,
    "reinforce": policy_gradient.reinforce,
    "opd": policy_gradient.opd,
    "dpo": dpo.OnlineDPO,
    "sft": sft.SFT,
}


def parse(argv: list[str], prog: str = "meshrl") -> tuple[str, Config]:
    name = argv[0] if argv and argv[0] in LOOPS else "<algorithm>"
    p = argparse.ArgumentParser(
        prog=f"{prog} {name}",
        usage="%(prog)s [--config FILE] [section.key=value ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (YAML sections; any of them as section.key=value):\n" + describe_keys(),
    )
    p.add_argument("algorithm", choices=list(LOOPS), help=argparse.SUPPRESS)
    p.add_argument("--config", default=None, help="YAML file; overrides follow as section.key=value")
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. actor.lr=1e-5 rollout.n=8")
    args, unknown = p.parse_known_intermixed_args(argv)  # overrides may come before or after --config
    if unknown:  # another framework's flag (OpenRLHF's --remote_rm_url) gets the hint naming ours
        named = "".join(verl_keys.hint(a.partition("=")[0]) for a in unknown if a.startswith("--"))
        p.error(f"unrecognized arguments: {' '.join(unknown)}{named}")
    try:
        return args.algorithm, load_config(args.config, args.overrides)
    except ValueError as e:
        p.error(str(e))


def run(algorithm: str, cfg: Config):
    return trainer.run(cfg, LOOPS[algorithm]())


def main(argv: list[str], runner=run, prog: str = "meshrl") -> int:
    """Parse, run (embedded services by default; `meshrl ray` passes its own runner), report."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    algorithm, cfg = parse(argv, prog)
    try:
        run_dir = runner(algorithm, cfg)
    except trainer.RunInterrupted as e:
        print(f"{prog} {algorithm}: {e}", file=sys.stderr)
        return 130  # as a shell reports a command ended by SIGINT
    except KeyboardInterrupt:  # before the run took over Ctrl-C (imports, the config), or on its way out
        print(f"{prog} {algorithm}: interrupted by the user", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError, ServiceError) as e:
        # what went wrong, in one line; the services' own logs hold their details
        print(f"{prog} {algorithm}: error: {e}", file=sys.stderr)
        return 1
    print(f"run finished: {run_dir}")
    return 0
