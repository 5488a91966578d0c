"""A step's samples graded by the judge, and its scores joined with the reward service's.

    judge = Judge(cfg.judge, client)               # client: the judge's rollout service, or None (url)
    scored = judge.grade(gen, scored)              # the reward service's Scores in, the joined ones out

A judged sample's score is judge.weight x the judge's + judge.reward_weight x the reward service's (the
token-level scores alike, the judge's on the last response token); a sample of a data source not in
judge.data_sources keeps the reward service's. The judge's score is in 0..1 (programs.py). A judgement
that cannot be read is asked again (judge.retries, sampled), then scored judge.default_score and counted,
or stops the step (judge.on_unparsed=fail): never silently 0. Columns judge_score and judge_said go to the
sample log; judge/* metrics (calls, cached share, unparsed, tokens) and timing_s/judge to the step's.
"""

import logging
import math
import time

import torch

from meshrl.algos import masked
from meshrl.chat import prompt_text
from meshrl.clients import Scores
from meshrl.dataproto import DataProto, object_array
from meshrl.loading import load_named
from orchestrator.judge import programs
from orchestrator.judge.client import Asked, JudgeClient
from orchestrator.judge.settings import JudgeSection

log = logging.getLogger(__name__)
SAID = 200  # characters of a judgement kept in the sample log and quoted in errors


class Judge:
    def __init__(self, cfg: JudgeSection, clients=None):
        self.cfg = cfg
        self.asking = JudgeClient(cfg, clients or [])
        self.text = programs.template_text(cfg.template, cfg.mode)
        self.function = load_named(cfg.function, "judge function") if cfg.function else None
        pairwise_words = cfg.mode == "pairwise" and cfg.parser == "verdict"
        self.words = (["a"], ["b"]) if pairwise_words else (cfg.yes_words, cfg.no_words)

    def grade(self, gen: DataProto, scored: Scores, seed: int = 0, clients=None) -> Scores:
        """`clients`: the judge's rollout services as the mesh has them now (a restart replaces one)."""
        self.asking.clients = clients or self.asking.clients
        samples = judged_samples(gen, self.cfg.data_sources)
        asked, start = Asked(), time.perf_counter()
        if not samples:
            return scored
        chosen = [s["row"] for s in samples]
        scores, said, unparsed = self.scores(samples, asked, seed)
        judge = torch.full((len(scored.scores),), float("nan"))
        judge[chosen] = torch.tensor(scores, dtype=torch.float32)
        out = joined(self.cfg, scored, judge, chosen, gen.batch.get("response_mask"), said)
        out.metrics |= {
            "judge/calls": float(asked.calls),
            "judge/cached_share": asked.cached / max(1, asked.cached + asked.calls),
            "judge/unparsed": float(unparsed),
            "judge/tokens": float(asked.tokens),
            "judge/score/mean": float(sum(scores) / len(scores)),
            "timing_s/judge": time.perf_counter() - start,
        }
        return out

    def scores(self, samples: list[dict], asked: Asked, seed: int) -> tuple[list[float], list[str], int]:
        """(each sample's judge score, what the judge said of it, judgements left unread)."""
        if self.function is not None:
            got = self.function([{k: v for k, v in s.items() if k != "row"} for s in samples], self.judge_call(asked))
            if not isinstance(got, (list, tuple)) or len(got) != len(samples):
                raise ValueError(f"judge.function={self.cfg.function} returned {got!r:.200}, not {len(samples)} scores")
            values = [finite(v) for v in got]  # None, NaN or inf: unreadable, by the same rule
            return self.settled(samples, values, ["" for _ in samples])
        if self.cfg.mode == "pointwise":
            values, said = self.judged(programs.pointwise_prompts(self.text, samples), asked, seed)
            return self.settled(samples, values, said)
        pairs = programs.pairwise_pairs(samples)
        prefs, said = self.judged(programs.pairwise_prompts(self.text, samples, pairs), asked, seed)
        unread = sum(p is None for p in prefs)
        if unread and self.cfg.on_unparsed == "fail":
            bad = prefs.index(None)
            raise ValueError(f"the judge's comparison {pairs[bad]} cannot be read: {said[bad][:SAID]!r}")
        shown: dict[int, str] = {}
        for (i, _), text in zip(pairs, said):
            shown.setdefault(i, text)
        return programs.win_shares(len(samples), pairs, prefs), [shown.get(i, "") for i in range(len(samples))], unread

    def judged(self, prompts: list[str], asked: Asked, seed: int) -> tuple[list[float | None], list[str]]:
        """Each prompt's score as read, asked again (sampled) while unreadable, up to judge.retries times."""
        said = self.asking.ask(prompts, asked, seed)
        values = [self.read(t) for t in said]
        for attempt in range(self.cfg.retries):
            again = [i for i, v in enumerate(values) if v is None]
            if not again:
                break
            texts = self.asking.ask([prompts[i] for i in again], asked, seed + 1 + attempt, temperature=1.0)
            for i, t in zip(again, texts):
                said[i], values[i] = t, self.read(t)
        return values, said

    def read(self, text: str) -> float | None:
        return programs.read(self.cfg.parser, text, *self.words, self.cfg.score_range)

    def settled(self, samples, values: list[float | None], said: list[str]) -> tuple[list[float], list[str], int]:
        """The unreadable ones by judge.on_unparsed: default_score (counted) or the step stops."""
        unread = [i for i, v in enumerate(values) if v is None]
        if unread and self.cfg.on_unparsed == "fail":
            i = unread[0]
            raise ValueError(
                f"the judge's judgement of sample {samples[i]['row']} cannot be read by judge.parser="
                f"{self.cfg.parser}: {said[i][:SAID]!r} ({len(unread)} of {len(values)} unread)"
            )
        if unread:
            log.warning(
                "%d of %d judgements could not be read (judge.parser=%s); scored judge.default_score=%g, e.g. %r",
                len(unread), len(values), self.cfg.parser, self.cfg.default_score, said[unread[0]][:SAID],
            )  # fmt: skip
        return [self.cfg.default_score if v is None else v for v in values], said, len(unread)

    def judge_call(self, asked: Asked):
        """What a judge function calls: judge(texts) -> the judge's texts (through the cache)."""
        return lambda texts: self.asking.ask([str(t) for t in texts], asked)

    def close(self) -> None:
        self.asking.close()


def finite(value) -> float | None:
    """A judge function's score as a float; None for None and for NaN or infinity (never trained on)."""
    if value is None:
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def judged_samples(gen: DataProto, sources: list[str]) -> list[dict]:
    """The rows the judge grades, each {row, prompt, response, ground_truth, data_source, uid}."""
    cols, n = gen.non_tensor_batch, len(gen)
    out = []
    for i in range(n):
        source = str(cols["data_source"][i]) if "data_source" in cols else ""
        if sources and source not in sources:
            continue
        model = cols["reward_model"][i] if "reward_model" in cols else None
        truth = model.get("ground_truth") if isinstance(model, dict) else None
        out.append(
            {
                "row": i,
                "prompt": prompt_text(cols["prompt"][i]) if "prompt" in cols else "",
                "response": str(cols["response_text"][i]),
                "ground_truth": "" if truth is None else str(truth),
                "data_source": source,
                "uid": str(cols["uid"][i]) if "uid" in cols else str(i),
            }
        )
    return out


def joined(cfg: JudgeSection, scored: Scores, judge: torch.Tensor, rows: list[int], mask, said: list[str]) -> Scores:
    """The reward service's Scores with the judge's joined on `rows` (judge: NaN elsewhere)."""
    chosen = torch.zeros(len(judge), dtype=torch.bool)
    chosen[rows] = True
    total = scored.scores.clone()
    total[chosen] = cfg.reward_weight * scored.scores[chosen] + cfg.weight * judge[chosen]
    token_level = scored.token_level_scores
    if token_level is not None and mask is not None:
        token_level = token_level.clone()
        token_level[chosen] = cfg.reward_weight * token_level[chosen]
        token_level += masked.token_level(torch.where(chosen, cfg.weight * judge, 0.0), mask)
    columns = dict(scored.columns)
    columns["judge_score"] = object_array([float(v) if c else None for c, v in zip(chosen.tolist(), judge.tolist())])
    texts = [""] * len(judge)
    for r, t in zip(rows, said):
        texts[r] = t[:SAID]
    columns["judge_said"] = object_array(texts)
    return Scores(total, token_level, columns, dict(scored.metrics))
