"""`meshrl serve sandbox`: the SandboxService, until SIGTERM.

meshrl serve sandbox --port 50060
meshrl serve sandbox --concurrency 16 --wall-s 5 --memory-mb 512
"""

import argparse

from meshrl.config.sandbox import SandboxConfig
from meshrl.flags import add_dataclass_flags, add_server_flags, dataclass_from_args
from meshrl.rpc.server import run_service
from services.sandbox.servicer import SandboxServicer


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve sandbox", description=__doc__.splitlines()[0])
    add_server_flags(p)
    add_dataclass_flags(p, SandboxConfig)
    args = p.parse_args(argv)
    cfg = dataclass_from_args(SandboxConfig, args)
    servicer = SandboxServicer(cfg)
    # a Run waits for a slot: the server takes a few more calls than there are slots
    return run_service(servicer, args, "sandbox service", max_workers=cfg.concurrency * 2)
