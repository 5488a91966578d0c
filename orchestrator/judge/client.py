"""Asking the judge: a batch of prompts in, its judgements out, through a cache.

A judge the mesh serves (judge.model or judge.address: a rollout service) gets the step's prompts in one
Generate, as chat messages its own template renders; an OpenAI-compatible server (judge.url) gets one
chat completion per prompt, judge.concurrency at a time, each sent again after 0.5 s, 1 s, ... when it
cannot connect or gets 429 or 5xx. A judgement is kept by (the judge, the weight version that gave it,
the prompt, the sampling) while it is greedy: the same answer to the same question is judged once.
"""

import collections
import concurrent.futures
import json
import os
import threading
import time
import urllib.error
import urllib.request

from meshrl.codec import Payload
from meshrl.dataproto import DataProto, object_array
from meshrl.rpc import Client
from meshrl.v1 import rollout_pb2
from orchestrator.judge.settings import JudgeSection

URL_RETRIES = 2  # a judge.url request that cannot connect or gets 429 / 5xx is sent this many times again
SHOWN = 200  # characters of a bad reply quoted in an error


class Asked:
    """One batch's figures: prompts asked, served from the cache, the judge's tokens."""

    def __init__(self):
        self.calls = self.cached = self.tokens = 0


class JudgeClient:
    def __init__(self, cfg: JudgeSection, clients: list[Client]):
        self.cfg, self.clients = cfg, clients
        self.who = cfg.url or cfg.address or cfg.model
        self.version = 0  # the served judge's weight version, as its last reply said
        self.cache: collections.OrderedDict[tuple, str] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="meshrl-judge")

    def ask(self, prompts: list[str], asked: Asked, seed: int = 0, temperature: float | None = None) -> list[str]:
        """The judge's text for each prompt; the cache answers the prompts it holds (greedy only)."""
        temperature = self.cfg.temperature if temperature is None else temperature
        cached = temperature == 0 and self.cfg.cache > 0
        out: list[str | None] = [None] * len(prompts)
        if cached:
            with self.lock:
                out = [self.cache.get(self.key(p)) for p in prompts]
        todo = list(dict.fromkeys(p for p, x in zip(prompts, out) if x is None))  # each prompt asked once
        asked.cached += sum(x is not None for x in out)
        if todo:
            said = dict(zip(todo, self._generate(todo, seed, temperature, asked)))
            asked.calls += len(todo)
            out = [said[p] if x is None else x for p, x in zip(prompts, out)]
            if cached:
                self._keep({self.key(p): t for p, t in said.items()})
        return [str(x) for x in out]

    def key(self, prompt: str) -> tuple:
        """A greedy judgement's cache key: the judge, the weight version that gives it, the prompt, its length."""
        return (self.who, self.version, prompt, self.cfg.max_new_tokens)

    def _keep(self, new: dict) -> None:
        with self.lock:
            self.cache.update(new)
            while len(self.cache) > self.cfg.cache:
                self.cache.popitem(last=False)

    def _generate(self, prompts: list[str], seed: int, temperature: float, asked: Asked) -> list[str]:
        if self.clients:
            return self._fleet(prompts, seed, temperature, asked)
        futures = [self.pool.submit(self._post, p, seed + i, temperature) for i, p in enumerate(prompts)]
        texts = []
        try:
            for f in futures:
                text, tokens = f.result()
                texts.append(text)
                asked.tokens += tokens
        finally:  # one failed: the batch fails, and the requests not yet sent are not sent
            for f in futures:
                f.cancel()
        return texts

    def _fleet(self, prompts: list[str], seed: int, temperature: float, asked: Asked) -> list[str]:
        """The prompts shared out over the judge's services in consecutive parts, one Generate each, at once."""
        n = len(self.clients)
        bounds = [len(prompts) * i // n for i in range(n + 1)]
        parts = [(c, a, b) for c, a, b in zip(self.clients, bounds, bounds[1:]) if b > a]
        futures = [
            self.pool.submit(self._served, client, prompts[a:b], seed + a, temperature) for client, a, b in parts
        ]
        texts = []
        for f in futures:
            said, tokens = f.result()
            texts += said
            asked.tokens += tokens
        return texts

    def _served(self, client: Client, prompts: list[str], seed: int, temperature: float) -> tuple[list[str], int]:
        """One Generate on one of the judge's rollout services: (its texts, the tokens it generated)."""
        sampling = rollout_pb2.SamplingParams(
            n=1,
            greedy=temperature == 0,
            temperature=temperature or 1.0,
            top_p=1.0,
            top_k=-1,
            max_new_tokens=self.cfg.max_new_tokens,
            seed=seed,
        )
        column = object_array([[{"role": "user", "content": p}] for p in prompts])
        request = Payload(rollout_pb2.GenerateRequest(sampling=sampling), DataProto({}, {"prompt": column}))
        reply, gen = client.call_batch("Generate", request, rollout_pb2.GenerateResponse, timeout=self.cfg.timeout)
        self.version = max(self.version, reply.weight_version)
        tokens = int(gen.batch["response_mask"].sum()) if "response_mask" in gen.batch else 0
        return [str(t) for t in gen.non_tensor_batch["response_text"]], tokens

    def _post(self, prompt: str, seed: int, temperature: float) -> tuple[str, int]:
        """One chat completion from judge.url: (its text, its completion tokens)."""
        body = {
            "model": self.cfg.url_model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.cfg.max_new_tokens,
            "temperature": temperature,
            "seed": seed,
        }
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.cfg.url.rstrip("/") + "/chat/completions"
        for attempt in range(URL_RETRIES + 1):
            request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.cfg.timeout) as response:
                    return read_completion(response.read().decode("utf-8", "replace"), url)
            except urllib.error.HTTPError as e:
                said = e.read().decode("utf-8", "replace")[:SHOWN]
                if (e.code != 429 and e.code < 500) or attempt == URL_RETRIES:
                    raise RuntimeError(f"judge.url {url} answered HTTP {e.code}: {said!r}") from None
            except OSError as e:  # refused, timed out, cut off
                if attempt == URL_RETRIES:
                    raise RuntimeError(f"judge.url {url} cannot be reached: {e}") from None
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def read_completion(text: str, url: str) -> tuple[str, int]:
    """(the first choice's message content, the completion tokens) of a chat completion reply."""
    try:
        reply = json.loads(text)
        content = reply["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise RuntimeError(f"judge.url {url} answered with no choices[0].message.content: {text[:SHOWN]!r}") from None
    usage = reply.get("usage") if isinstance(reply, dict) else None
    tokens = usage.get("completion_tokens", 0) if isinstance(usage, dict) else 0
    return str(content or ""), int(tokens or 0)
