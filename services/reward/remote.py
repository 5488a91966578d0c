"""reward.url: an OpenRLHF-style remote reward server, scored over HTTP as OpenRLHF's --remote_rm_url is.

    POST reward.url  {"query": [text, ...], "prompts": [text, ...], "labels": [label, ...]}
    reply            {"rewards": [number, ...]}  (newer servers add "scores" and "extra_logs")

As OpenRLHF builds them (openrlhf/utils/agent.py, SingleTurnAgentExecutor; remote_rm_utils.py before 2026):
a query is the whole sequence decoded with special tokens kept, i.e. the prompt as the chat template
rendered it followed by the response with its end token; prompts are the rendered prompts, which a server
strips off a query with query[len(prompt):]; labels are the label_key column, "" without one. The
orchestrator decodes the two texts from the token ids (prompt_rendered, sequence_text; docs/wire.md).

"rewards" is the score trained on. "scores" (OpenRLHF logs and filters on them) is kept per sample as
remote_score, and each per-sample list in "extra_logs" under its own name; anything else there is left
out. The batch goes in chunks of reward.batch_size, one request each, with reward.timeout seconds per
request; with several servers (reward.url a comma-separated list, as OpenRLHF's list of remote_rm_url)
the chunks go round the list. A request that cannot connect, times out or gets HTTP 429 / 5xx is sent
again, reward.url_retries times, to the next server, after 0.5 s, 1 s, ... (OpenRLHF retried its
requests too); one still failing, an HTTP 4xx, or a reply that is not JSON, has no "rewards" or the wrong
number of them, fails each of the chunk's samples, and a reward that is not a finite number fails its
sample; reward.on_error decides what a failed sample does, as with any scorer.
"""

import http.client
import itertools
import json
import logging
import math
import time
import urllib.error
import urllib.request

from services.reward.pool import Outcome
from services.reward.samples import Sample

log = logging.getLogger(__name__)

SHOWN = 200  # characters of a bad reply quoted in its error


class UrlScorer:
    """POST each chunk of samples to an OpenRLHF-style server (round the list); "rewards" are the scores."""

    none_ok = False  # every sample gets a number or an error
    BACKOFF = 0.5  # seconds before the first retry, doubled for each next one

    def __init__(self, urls: list[str], batch_size: int, timeout: float, retries: int = 0):
        self.urls, self.batch_size, self.timeout, self.retries = urls, batch_size, timeout, retries
        self.turns = itertools.count()  # each chunk's first server, round the list (next() is atomic in CPython)

    def score(self, samples: list[Sample]) -> list[Outcome]:
        out: list[Outcome] = []
        for start in range(0, len(samples), self.batch_size):
            out += self.post(samples[start : start + self.batch_size])
        return out

    def post(self, chunk: list[Sample]) -> list[Outcome]:
        body = json.dumps(request_body(chunk)).encode()
        first = next(self.turns)
        for attempt in range(self.retries + 1):
            url = self.urls[(first + attempt) % len(self.urls)]
            text, outcomes, again = self.send(url, body, len(chunk))
            if text is not None:
                return read_reply(text, len(chunk), f"reward.url={url}")
            if not again or attempt == self.retries:
                return outcomes
            log.warning("%s; sending it again (%d of %d)", outcomes[0].error, attempt + 1, self.retries)
            time.sleep(self.BACKOFF * 2**attempt)
        raise AssertionError("unreachable")

    def send(self, url: str, body: bytes, n: int) -> tuple[str | None, list[Outcome], bool]:
        """(the reply's text, or None with the chunk's failed outcomes and whether to send it again)."""
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
        where = f"reward.url={url}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read().decode("utf-8", "replace"), [], False
        except urllib.error.HTTPError as e:  # the server answered, with an error status
            said = e.read().decode("utf-8", "replace")[:SHOWN]
            busy = e.code == 429 or e.code >= 500  # overloaded or broken for now, not a bad request
            return None, failed(n, f"{where} answered HTTP {e.code} {e.reason}: {said!r}"), busy
        except (OSError, http.client.HTTPException) as e:  # refused, unknown host, timed out, cut off, TLS
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, TimeoutError):
                return None, failed(n, f"{where} did not answer within {self.timeout:g}s", timed_out=True), True
            return None, failed(n, f"{where} cannot be reached: {reason}"), True

    def close(self):
        pass


def request_body(chunk: list[Sample]) -> dict[str, list]:
    """OpenRLHF's request: without the rendered texts (a client that did not send them), the prompt text
    and the response are what there is."""
    prompts = [s.prompt_rendered if s.prompt_rendered is not None else s.prompt_text or "" for s in chunk]
    return {
        "query": [
            s.sequence_text if s.sequence_text is not None else p + s.response_text for s, p in zip(chunk, prompts)
        ],
        "prompts": prompts,
        "labels": ["" if s.ground_truth is None else s.ground_truth for s in chunk],
    }


def read_reply(text: str, n: int, where: str) -> list[Outcome]:
    """The n samples' outcomes from the server's reply (see the module for what counts as bad)."""
    try:
        reply = json.loads(text)
    except ValueError:
        return failed(n, f"{where} answered with something other than JSON: {text[:SHOWN]!r}")
    rewards = reply.get("rewards") if isinstance(reply, dict) else None
    if not isinstance(rewards, list):
        what = f"keys {sorted(reply)}" if isinstance(reply, dict) else f"a {type(reply).__name__}"
        return failed(
            n, f"{where} answered without a 'rewards' list ({what}); OpenRLHF's reply is {{\"rewards\": [...]}}"
        )
    if len(rewards) != n:
        return failed(n, f"{where} answered {len(rewards)} rewards for {n} samples")
    logs = reply.get("extra_logs")
    extras: list[dict] = [{} for _ in range(n)]
    for key, values in [("remote_score", reply.get("scores")), *(logs.items() if isinstance(logs, dict) else [])]:
        if isinstance(values, list) and len(values) == n:
            for row, v in zip(extras, values):
                row[key] = v
        elif values is not None:
            log.warning("%s: %s is not a list of %d per-sample values; left out", where, key, n)
    return [
        Outcome(score=float(r), extras=e) if is_number(r) else Outcome(error=f"{where} gave the reward {r!r}")
        for r, e in zip(rewards, extras)
    ]


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def failed(n: int, error: str, timed_out: bool = False) -> list[Outcome]:
    return [Outcome(error=error, timed_out=timed_out) for _ in range(n)]
