"""The `meshrl` command: one subcommand per job, each in the module that owns it.

This package sits above everything (meshrl, services, orchestrator) and is the only one that imports
all of them. Each subcommand imports what it runs only when it runs, so `meshrl --help` and
`meshrl health` stay fast (no torch, no transformers).
"""

import argparse
import contextlib
import faulthandler
import logging
import os
import pathlib
import signal
import sys

from meshrl.flags import add_dataclass_flags, dataclass_from_args


def cmd_make_model(args) -> int:
    from meshrl.tiny.models import TinyModelConfig, make_model

    out = make_model(args.out, dataclass_from_args(TinyModelConfig, args))
    print(out)
    return 0


def cmd_make_data(args) -> int:
    """A bundled task's parquet files (args.task: the meshrl.tiny module that writes it)."""
    import importlib

    module = importlib.import_module(f"meshrl.tiny.{args.task}")
    for split, path in module.make_data(args.out, dataclass_from_args(args.config, args)).items():
        print(f"{split}: {path}")
    return 0


def cmd_health(args) -> int:
    """Exit 0 if the server at ADDRESS reports SERVING (for compose healthchecks); imports only grpc."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from meshrl.hosts import is_address

    if not is_address(args.address):
        print(f"meshrl health: give HOST:PORT, got {args.address!r}", file=sys.stderr)
        return 2
    from meshrl import tls

    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    if tls.enabled():
        tls.set_role(tls.folder_role())  # inside a service's container: the only key there is its own
    with tls.channel(args.address, None, []) as channel:  # TLS (any mesh role's certificate) when configured
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # not in the stubs
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout, metadata=metadata
            )
        except grpc.RpcError as e:
            print(f"{args.address}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


SERVICES = ("actor", "rollout", "reward", "env", "gateway", "sandbox")


def service_main(service: str):
    """A service's own main (services.<service>.main), imported only when it is served."""
    if service == "actor":
        from services.actor.main import main
    elif service == "rollout":
        from services.rollout.main import main
    elif service == "reward":
        from services.reward.main import main
    elif service == "gateway":
        from services.gateway.main import main
    elif service == "sandbox":
        from services.sandbox.main import main
    else:
        assert service == "env", service  # argparse allows only SERVICES
        from services.env.main import main
    return main


def cmd_serve(args) -> int:
    """Run a service's own main (services.<role>.main)."""
    from meshrl.lifeline import die_with_parent
    from meshrl.rpc.server import BindRefused

    die_with_parent()  # started by an orchestrator (or rank 0): do not outlive it
    try:
        main = service_main(args.service)
    except ModuleNotFoundError as e:
        print(f"the {args.service} service is not available: {e}", file=sys.stderr)
        return 2
    try:
        return main(args.args)
    except BindRefused as e:  # the user's flags, whichever main checked the bind: as argparse says them
        print(f"meshrl serve {args.service}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a port already taken: one line, not a traceback
        print(f"meshrl serve {args.service}: {e}", file=sys.stderr)
        return 1


def console() -> int:
    """The installed `meshrl` command (pyproject's [project.scripts]): main, then the fast exit that
    `python -m cli` takes too (a Ctrl-C's end waited 2.7 s for the interpreter's teardown without it)."""
    code = main()
    exit_at_once(sys.argv[1:], code)
    return code


def exit_at_once(argv: list[str], code: int) -> None:
    """End a `meshrl serve` or `meshrl <algorithm>` process as soon as its main returned: by then it has
    stopped what it ran and closed what it holds (run_service's and the run's finally blocks), and the
    interpreter's teardown of torch, transformers and vLLM took 2-3 s more per process, which every run's
    end and every Ctrl-C waited for (and a stray non-daemon thread could hold it for good). Other commands
    return as usual."""
    if argv[:1] != ["serve"] and argv[:1] != ["ray"] and not (argv and argv[0] in ALGORITHMS):
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_certs(args) -> int:
    """A private CA and a certificate per role, for MESHRL_TLS_DIR (meshrl.tls)."""
    from meshrl.tls import make_certs, split_by_role

    for path in make_certs(pathlib.Path(args.out), [h for h in args.hosts.split(",") if h], args.days):
        print(path)
    if args.per_role:
        for folder in split_by_role(pathlib.Path(args.out)):
            print(folder)
        print(f"MESHRL_TLS_DIR={pathlib.Path(args.out).resolve()}/ROLE for each service, orchestrator/ for the run")
        return 0
    print(
        f"export MESHRL_TLS_DIR={pathlib.Path(args.out).resolve()}  # every process of the run, servers and "
        "clients; a host needs ca.pem and the .pem/.key of the roles it runs"
    )
    return 0


def cmd_report(args) -> int:
    """Write a run's summary.md and curves.png again and print them (orchestrator.output.report)."""
    from orchestrator.output import report

    run_dir = pathlib.Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        print(f"meshrl report: {run_dir} has no metrics.jsonl (not a run folder?)", file=sys.stderr)
        return 1
    if not args.held_out:
        print(report.finish_report(run_dir))
        return 0
    val = report.series(report.read_metrics(run_dir), "val/acc/mean")
    print("held-out greedy accuracy by step: " + ", ".join(f"{s}: {a:.3f}" for s, a in val))
    gain = report.held_out_gain(run_dir)
    print(report.gain_line(gain) if gain else "fewer than two validations: no gain to report")
    return 0


def cmd_export(args) -> int:
    """A checkpoint's actor as a HuggingFace folder (and a peft adapter folder): services.actor.export."""
    run_dir = pathlib.Path(args.run_dir)
    config, root = run_dir / "config.yaml", run_dir / "checkpoints"
    if not config.is_file():
        print(f"meshrl export: {run_dir} has no config.yaml (not a run folder?)", file=sys.stderr)
        return 1
    latest = root / "latest"
    name = f"step_{args.step}" if args.step is not None else latest.read_text().strip() if latest.is_file() else ""
    saved = sorted(
        (p.name for p in root.glob("step_*") if p.name.removeprefix("step_").isdigit()),
        key=lambda n: int(n.removeprefix("step_") or 0),
    )
    if not name or not (root / name / "actor").is_dir():
        what = f"no actor checkpoint {name}" if name else "no checkpoint"
        print(f"meshrl export: {run_dir}: {what} (saved: {', '.join(saved) or 'none'})", file=sys.stderr)
        return 1
    from orchestrator.config import load_config
    from orchestrator.lifecycle.roles import settings
    from services.actor.export import export

    cfg = load_config(str(config))
    out = pathlib.Path(args.out) if args.out else run_dir / "export" / name
    try:
        for path in export(root / name / "actor", cfg.actor.model, settings(cfg, "actor"), out):
            print(path)
    except (ValueError, FileNotFoundError) as e:
        print(f"meshrl export: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_fleet(args) -> int:
    """A running run's rollout fleet: RUN_DIR/fleet.json, which the run reads before every step."""
    from orchestrator.lifecycle.fleet import FLEET_FILE, write_fleet

    run_dir = pathlib.Path(args.run_dir)
    if not (run_dir / "config.yaml").is_file():
        print(f"meshrl fleet: {run_dir} has no config.yaml (not a run folder?)", file=sys.stderr)
        return 2
    try:
        wanted = write_fleet(run_dir, args.replicas or 0, args.address or "")
    except ValueError as e:
        print(f"meshrl fleet: {e}", file=sys.stderr)
        return 2
    print(f"wrote {run_dir / FLEET_FILE}: {wanted}; the run makes it so before its next step")
    return 0


def cmd_config_from_verl(args) -> int:
    """A verl PPO/GRPO YAML or launch script as our config, and what has no equivalent: orchestrator.from_verl."""
    from orchestrator.from_verl import convert, read, render

    path = pathlib.Path(args.file)
    try:
        text = render(convert(*read(path.read_text())), str(path))
    except (OSError, ValueError) as e:
        print(f"meshrl config from-verl: {path}: {e}", file=sys.stderr)
        return 2
    if args.out:
        pathlib.Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def cmd_trace(args) -> int:
    """Print one training step's spans as a timeline (meshrl.trace_view)."""
    from meshrl.trace_view import main

    try:
        return main(args.run_dir, args.step, args.attempt)
    except ValueError as e:
        print(f"meshrl trace: {e}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_making_parsers(sub)
    p = sub.add_parser("serve", help="start a service: meshrl serve reward --help")
    p.add_argument("service", choices=SERVICES)
    p.add_argument("args", nargs=argparse.REMAINDER, help="the service's own flags")
    p.set_defaults(fn=cmd_serve)
    for algorithm, what in ALGORITHMS.items():  # listed for --help; main() hands them on before parsing
        sub.add_parser(algorithm, help=f"train with {what}: meshrl {algorithm} --config FILE section.key=value ...")
    sub.add_parser(
        "ray",
        help="place the services on a Ray cluster, then train: meshrl ray grpo --config FILE ray.address=auto ...",
    )
    add_health_parser(sub)
    add_certs_parser(sub)
    add_run_dir_parsers(sub)
    p = sub.add_parser("config", help="configs from elsewhere: `meshrl config from-verl VERL.yaml|run.sh`")
    which_config = p.add_subparsers(dest="config_command", required=True)
    q = which_config.add_parser(
        "from-verl", help="our config for a verl PPO/GRPO YAML or launch script, and what has no equivalent"
    )
    q.add_argument("file", help="a verl YAML, or a script running python3 -m verl.trainer.main_ppo key=value ...")
    q.add_argument("--out", default=None, help="write it here instead of printing it")
    q.set_defaults(fn=cmd_config_from_verl)
    return parser


def add_making_parsers(sub) -> None:
    """make-model and make-data: the tiny models and data, built here."""
    from meshrl.tiny.arithmetic import ArithmeticConfig
    from meshrl.tiny.code import CodeConfig
    from meshrl.tiny.models import TinyModelConfig
    from meshrl.tiny.visual import VisualConfig

    p = sub.add_parser("make-model", help="write a tiny HF model folder (no download)")
    p.add_argument("out", help="output folder")
    add_dataclass_flags(p, TinyModelConfig)
    p.set_defaults(fn=cmd_make_model)
    tasks = {
        "make-data": ("arithmetic", ArithmeticConfig, "the arithmetic task as parquet (verl schema)"),
        "make-visual-data": ("visual", VisualConfig, "the visual task (name a drawn shape) as parquet with images"),
        "make-code-data": (
            "code",
            CodeConfig,
            "the code task (write f(x) for a described mapping), graded by running it",
        ),
    }
    for command, (task, config, what) in tasks.items():
        p = sub.add_parser(command, help=f"write {what}")
        p.add_argument("out", help="output folder for train.parquet and test.parquet")
        add_dataclass_flags(p, config)
        p.set_defaults(fn=cmd_make_data, task=task, config=config)


def add_certs_parser(sub) -> None:
    p = sub.add_parser("certs", help="make a private CA and a TLS certificate per role (MESHRL_TLS_DIR)")
    p.add_argument("out", help="output folder")
    p.add_argument(
        "--hosts",
        default="",
        help="comma-separated names or IPs the services are reached by, beyond localhost and 127.0.0.1",
    )
    p.add_argument("--days", type=int, default=365, help="validity")
    p.add_argument(
        "--per-role",
        action="store_true",
        help="a folder per role holding only its own key and the CA certificate (one per container or host)",
    )
    p.set_defaults(fn=cmd_certs)


def add_run_dir_parsers(sub) -> None:
    """What reads or steers a run by its folder: report, export, fleet, trace."""
    p = sub.add_parser("report", help="a run's summary table and curves.png, written again from its files")
    p.add_argument("run_dir", help="a run folder (trainer.run_dir)")
    p.add_argument(
        "--held-out",
        action="store_true",
        help="only the held-out accuracy by step and the gain from first to last validation, with standard errors",
    )
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("export", help="a checkpoint's actor as a HF folder (LoRA: merged, and its peft adapter)")
    p.add_argument("run_dir", help="a run folder (trainer.run_dir) with checkpoints/")
    p.add_argument("--step", type=int, default=None, help="which checkpoint; default: the latest")
    p.add_argument("--out", default=None, help="output folder for hf/ (and hf_adapter/); default RUN_DIR/export/step_N")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("fleet", help="resize a running run's rollout fleet (read before every step)")
    p.add_argument("run_dir")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--replicas", type=int, help="rollout replicas the run starts (it starts or stops the difference)"
    )
    which.add_argument("--address", help="HOST:PORT,... of running replicas, for a run given them by address")
    p.set_defaults(fn=cmd_fleet)
    p = sub.add_parser("trace", help="show one training step's spans (every service) as a timeline")
    p.add_argument("run_dir", help="a run folder (trainer.run_dir) with traces/")
    p.add_argument("--step", type=int, default=None, help="which step; default: the last traced")
    p.add_argument(
        "--attempt",
        type=int,
        default=None,
        help="a step done more than once: which time (1, 2, ...); default: the last",
    )
    p.set_defaults(fn=cmd_trace)


def add_health_parser(sub) -> None:
    p = sub.add_parser("health", help="check a service's grpc.health.v1 status")
    p.add_argument("address", help="HOST:PORT")
    p.add_argument(
        "--service", default="", help="a service's full name, e.g. meshrl.v1.RewardService; empty: the whole server"
    )
    p.add_argument("--token", default=None, help="bearer token, if the server wants one")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    p.set_defaults(fn=cmd_health)


# The orchestrator's loops (orchestrator.main.LOOPS; a test keeps the two in step), named here so
# that `meshrl --help` lists them without importing torch.
ALGORITHMS = {
    "ppo": "PPO with a critic and GAE",
    "grpo": "GRPO (group-normalised rewards)",
    "rloo": "RLOO (leave-one-out baseline)",
    "reinforce": "REINFORCE++",
    "opd": "on-policy distillation from a teacher model (teacher.model=FOLDER)",
    "dpo": "online DPO (best vs worst of n samples)",
    "sft": "supervised fine-tuning",
}


def main(argv: list[str] | None = None) -> int:
    # `kill -USR1 PID` prints every thread's stack to stderr: a process that hangs shows where
    with contextlib.suppress(ValueError, OSError):  # a stderr without a descriptor (captured, in a test)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ALGORITHMS:  # the loop parses its own flags (argparse would take --config here)
        if not {"-h", "--help"} & set(argv):
            from meshrl import forkserver

            forkserver.start()  # it imports what the services need while this process imports the loop
        try:
            from orchestrator.main import main as loop_main

            return loop_main(argv)
        except KeyboardInterrupt:  # Ctrl-C while torch and the loop import: no traceback for that
            print(f"meshrl {argv[0]}: interrupted by the user", file=sys.stderr)
            return 130
    if argv and argv[0] == "ray":  # the same loops, services placed on a Ray cluster
        from orchestrator.ray_launch import main as ray_main

        return ray_main(argv[1:])
    if argv and argv[0] == "health":  # a compose healthcheck runs this often: no torch, no transformers
        parser = argparse.ArgumentParser(prog="meshrl")
        add_health_parser(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        return args.fn(args)
    args = build_parser().parse_args(argv)
    return args.fn(args)
