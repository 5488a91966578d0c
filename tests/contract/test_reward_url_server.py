"""reward.url: the reward service asks a real OpenRLHF-style HTTP server (http.server on 127.0.0.1), and a
gRPC address that answers HTTP/1 is named as such at once."""

import http.server
import json
import math
import re
import socket
import threading
import time

import pytest
from transformers import AutoTokenizer

from meshrl.chat import as_messages, render
from meshrl.clients import RewardClient
from meshrl.config.reward import RewardConfig
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.layout import rollout_tensors
from meshrl.rpc import Server
from orchestrator.lifecycle.mesh import reward_request
from orchestrator.lifecycle.services import Services
from services.reward.servicer import RewardServicer


class OpenRLHFServer(http.server.BaseHTTPRequestHandler):
    """OpenRLHF's remote reward protocol, scored as its math reward function does: the response is the query
    after the prompt, right when the label is in it. Other paths answer the ways a server goes wrong."""

    received: list[dict] = []
    busy = 0  # requests to /busyN so far

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append({"path": self.path, **body})
        responses = [q[len(p) :] if q.startswith(p) else q for q, p in zip(body["query"], body["prompts"])]
        rewards = [float(label != "" and label in r) for r, label in zip(responses, body["labels"])]
        reply = {
            "/get_reward": {
                "rewards": rewards,
                "scores": rewards,
                "extra_logs": {"chars": [len(r) for r in responses]},
            },
            "/plain": {"rewards": rewards},
            "/no_rewards": {"scores": rewards},
            "/short": {"rewards": rewards[:-1]},
            "/nan": {"rewards": [math.nan, *rewards[1:]]},
            "/text": {"rewards": ["1", *rewards[1:]]},
        }.get(self.path)
        if self.path == "/slow":  # past the client's timeout: it has gone, nothing to answer
            time.sleep(2)
            return
        if self.path == "/error":
            self.send_error(500, "scoring blew up")
            return
        if self.path.startswith("/busy"):  # /busyN: 503 to the first N requests, then OpenRLHF's reply
            OpenRLHFServer.busy += 1
            if OpenRLHFServer.busy <= int(self.path[5:]):
                self.send_error(503, "overloaded")
                return
            reply = {"rewards": rewards}
        data = b"<html>not json</html>" if reply is None else json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def openrlhf():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OpenRLHFServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def received():
    OpenRLHFServer.received.clear()
    return OpenRLHFServer.received


@pytest.fixture()
def reward_url():
    """A reward service for a reward.url (and settings), and its client; stopped after the test."""
    started = []

    def start(url: str, **settings) -> RewardClient:
        servicer = RewardServicer(RewardConfig(url=url, **settings))
        server = Server([servicer]).start()
        started.append((server, servicer))
        return RewardClient(server.address, timeout=60)

    yield start
    for server, servicer in started:
        server.stop(0)
        servicer.close()


def generated(tokenizer, prompts, responses, truths) -> DataProto:
    """A Generate reply as the rollout lays it out: the rendered prompts' ids left padded, each response's
    ids with its end token right padded."""
    rendered = [render(tokenizer, as_messages(p, "test"), "test") for p in prompts]  # as orchestrator.data does
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]
    response_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in responses]
    tensors = rollout_tensors(prompt_ids, response_ids, tokenizer.pad_token_id)
    return DataProto(
        tensors,
        {
            "prompt": prompts,
            "data_source": ["arithmetic"] * len(prompts),
            "reward_model": [{"ground_truth": t} for t in truths],
            "response_text": responses,
        },
    )


def test_an_openrlhf_server_gets_the_rendered_prompt_and_response_as_openrlhf_sends_them(
    tiny_lm, openrlhf, received, reward_url
):
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    prompts: list = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3="}], "4+4=", "1+1="]
    gen = generated(tok, prompts, ["5", "9", "2"], ["5", "8", None])
    client = reward_url(f"{openrlhf}/get_reward", batch_size=2)
    out = client.score(reward_request(gen, tok))  # the orchestrator decodes the texts (reward.url is set)

    assert [r["path"] for r in received] == ["/get_reward", "/get_reward"]  # chunks of reward.batch_size
    sent: dict[str, list] = {k: sum((r[k] for r in received), []) for k in ("query", "prompts", "labels")}
    rendered = [render(tok, as_messages(p, "test"), "test") for p in prompts]  # system prompt and all
    assert sent["prompts"] == rendered
    assert sent["query"] == [p + r + tok.eos_token for p, r in zip(rendered, ["5", "9", "2"])]
    assert sent["labels"] == ["5", "8", ""]  # OpenRLHF sends "" without a label_key
    assert out.scores.tolist() == [1.0, 0.0, 0.0]
    assert list(out.columns["remote_score"]) == [1.0, 0.0, 0.0]  # the reply's "scores"
    assert list(out.columns["chars"]) == [1 + len(tok.eos_token)] * 3  # a per-sample list of extra_logs
    assert list(out.columns["reward_status"]) == ["ok"] * 3
    assert out.metrics["reward/chars/mean"] == 1 + len(tok.eos_token)


def test_a_request_without_the_rendered_texts_sends_the_prompt_text_and_response(openrlhf, received, reward_url):
    client = reward_url(f"{openrlhf}/plain")
    batch = DataProto(non_tensor_batch={"response_text": ["7"], "prompt_text": ["3+4="], "reward_model": [{}]})
    assert client.score(batch).scores.tolist() == [0.0]
    assert received[0]["query"] == ["3+4=7"] and received[0]["prompts"] == ["3+4="] and received[0]["labels"] == [""]


@pytest.mark.parametrize(
    "path, failed, match",
    [
        ("/error", [0, 1, 2], r"answered HTTP 500"),
        ("/nojson", [0, 1, 2], r"answered with something other than JSON: '<html>not json</html>'"),
        ("/no_rewards", [0, 1, 2], r"answered without a 'rewards' list \(keys \['scores'\]\)"),
        ("/short", [0, 1, 2], r"answered 2 rewards for 3 samples"),
        ("/nan", [0], r"gave the reward nan"),
        ("/text", [0], r"gave the reward '1'"),
    ],
)
def test_a_bad_reply_fails_its_samples_as_any_scorer_failure_does(openrlhf, reward_url, path, failed, match):
    client = reward_url(f"{openrlhf}{path}", on_error="score", error_score=-1.0)
    batch = DataProto(
        non_tensor_batch={"response_text": ["5", "6", "7"], "reward_model": [{"ground_truth": g} for g in "567"]}
    )
    out = client.score(batch)
    assert [i for i, s in enumerate(out.columns["reward_status"]) if s != "ok"] == failed
    assert all(out.scores[i] == -1.0 for i in failed) and out.metrics["reward/num_failed"] == len(failed)
    errors = [e for e in out.columns["reward_error"] if e]
    assert errors[0].startswith(f"reward.url={openrlhf}{path} ")
    assert any(re.search(match, e) for e in errors), errors


def test_on_error_fail_stops_the_request_naming_reward_url(openrlhf, reward_url):
    client = reward_url(f"{openrlhf}/short")
    with pytest.raises(ServiceError, match=rf"ABORTED: row 0 .*reward.url={openrlhf}/short answered 0 rewards for 1"):
        client.score(DataProto(non_tensor_batch={"response_text": ["5"]}))


def test_a_server_slower_than_reward_timeout_times_its_samples_out(openrlhf, reward_url):
    client = reward_url(f"{openrlhf}/slow", timeout=0.3, on_error="score")
    out = client.score(DataProto(non_tensor_batch={"response_text": ["5", "6"]}))
    assert list(out.columns["reward_status"]) == ["timeout", "timeout"]
    assert "did not answer within 0.3s" in out.columns["reward_error"][0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_at_reward_url_is_said_in_one_line(reward_url):
    url = f"http://127.0.0.1:{closed_port()}/get_reward"
    client = reward_url(url)
    with pytest.raises(ServiceError, match=rf"reward.url={url} cannot be reached: .*refused"):
        client.score(DataProto(non_tensor_batch={"response_text": ["5"]}))


def test_an_http1_server_given_as_reward_address_is_named_at_once(openrlhf):
    address = openrlhf.removeprefix("http://")
    start = time.monotonic()
    with pytest.raises(ValueError) as e:
        Services().start("reward", address, [])
    assert time.monotonic() - start < 5  # not the 60 s wait for a gRPC server that never comes
    assert str(e.value) == (
        f"reward.address={address} answers HTTP/1, not gRPC: for an OpenRLHF-style reward server use "
        f"reward.url=http://{address}/... (OpenRLHF's serve_rm answers on /get_reward)"
    )


def test_a_busy_server_is_asked_again_and_a_list_of_servers_shares_the_chunks(openrlhf, reward_url, received):
    """A 503 (or a refused connection, a timeout, a 429) is sent again after a pause, reward.url_retries
    times, to the next server of the list; chunks go round the list."""
    batch = DataProto(
        non_tensor_batch={"response_text": ["5", "6", "7"], "reward_model": [{"ground_truth": g} for g in "567"]}
    )
    OpenRLHFServer.busy = 0
    out = reward_url(f"{openrlhf}/busy2", url_retries=2).score(batch)  # the third try is answered
    assert list(out.scores) == [1.0, 1.0, 1.0] and OpenRLHFServer.busy == 3
    OpenRLHFServer.busy = 0
    out = reward_url(f"{openrlhf}/busy2", url_retries=1, on_error="score").score(batch)  # two tries: both 503
    assert list(out.columns["reward_status"]) == ["error"] * 3 and "HTTP 503" in out.columns["reward_error"][0]
    dead = f"http://127.0.0.1:{closed_port()}/get_reward"
    received.clear()
    out = reward_url(f"{dead},{openrlhf}/plain,{openrlhf}/get_reward", batch_size=1).score(batch)
    assert list(out.scores) == [1.0, 1.0, 1.0]  # the first chunk's retry went to the next server
    # chunk i starts at server i of the list (round it), its retries at the ones after
    assert [r["path"] for r in received] == ["/plain", "/plain", "/get_reward"]
