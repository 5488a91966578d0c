"""`meshrl serve gateway`: an OpenAI-compatible endpoint in front of running rollout services, for
evaluation and agent development (a training run starts its own, rollout.agent).

    meshrl serve gateway --rollout 127.0.0.1:50051[,...] --model models/tiny-lm --tool-parser hermes --port 8000
    meshrl serve gateway ... --sandbox 127.0.0.1:50060     # POST /v1/sandbox/run in a sandbox service

Every call needs one of the keys given (MESHRL_GATEWAY_KEYS, comma-separated, or --api-key); each key
is a session of its own, whose calls stay on one replica. Beyond loopback it needs --insecure-bind
(it speaks plain HTTP). Stops on SIGTERM or Ctrl-C.
"""

import argparse
import logging
import os
import signal
import threading

from meshrl import hosts
from meshrl.gateway.protocol import Limits
from meshrl.gateway.sandbox import Sandboxes
from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import Session
from meshrl.models import end_ids, generation_config
from meshrl.rpc.server import check_bind
from meshrl.vocab import model_vocab_size
from services.gateway.engine import RolloutEngine

KEEP = 64  # samples a long-lived key keeps for matching what its agent sends back

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve gateway", description=__doc__.splitlines()[0])
    p.add_argument("--rollout", required=True, help="rollout service address(es), comma-separated")
    p.add_argument("--model", required=True, help="the served model's folder: its tokenizer and chat template")
    p.add_argument("--name", default="", help="the model's name in /v1/models (default: the folder's name)")
    p.add_argument(
        "--tool-parser", default="hermes", help="how replies' tool calls are read: hermes, any of vLLM's, or ''"
    )
    p.add_argument("--api-key", default="", help="better MESHRL_GATEWAY_KEYS (a command line is readable by all)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--insecure-bind", action="store_true", help="serve beyond loopback (plain HTTP)")
    p.add_argument("--max-tokens", type=int, default=0, help="new tokens per choice at most (0: the room left)")
    p.add_argument("--max-model-len", type=int, default=0, help="prompt and new tokens together (0: the rollout's own)")
    p.add_argument("--sandbox", default="", help="a sandbox service (HOST:PORT) for POST /v1/sandbox/run")
    args = p.parse_args(argv)
    keys = [k for k in (os.environ.get("MESHRL_GATEWAY_KEYS", "") or args.api_key).split(",") if k.strip()]
    if not keys:
        p.error("give the keys callers must send: MESHRL_GATEWAY_KEYS=key1,key2 (or --api-key)")
    check_bind(args.host, tls_on=False, insecure_bind=args.insecure_bind)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ends = frozenset(end_ids(tokenizer, generation_config(args.model)))
    engine = RolloutEngine(hosts.address_list(args.rollout))
    max_model_len = args.max_model_len or engine.max_model_len()
    limits = Limits(max_tokens=args.max_tokens, max_model_len=max_model_len, vocab_size=model_vocab_size(args.model))
    name = args.name or os.path.basename(os.path.normpath(args.model))
    try:
        gateway = Gateway(
            engine,
            tokenizer,
            name,
            ends,
            tool_parser=args.tool_parser,
            limits=limits,
            address=(args.host, args.port),
            sandbox=Sandboxes(args.sandbox) if args.sandbox else None,
        )
    except ValueError as e:  # a parser that is not one, or not for this model's vocabulary
        engine.close()
        p.error(str(e))
    for key in keys:
        gateway.open(Session(key.strip(), keep=KEEP))
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    gateway.start()
    print(f"meshrl gateway: {gateway.base_url} ({name}, {len(keys)} key(s))", flush=True)
    stopped.wait()
    gateway.stop()
    engine.close()
    return 0
