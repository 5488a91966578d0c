"""The run's `judge.*` keys: which judge grades the samples, what it is asked, how its answer is read, and
how its score joins the reward (docs/training.md, "A judge")."""

import dataclasses

from meshrl.config.checked import Checked, FieldError, one_of, require

MODES = ("pointwise", "pairwise")
PARSERS = ("verdict", "number", "boxed", "json")
ON_UNPARSED = ("score", "fail")


@dataclasses.dataclass
class JudgeSection(Checked):
    """A generative judge: a frozen model the run serves (model), a rollout service serving one (address),
    or any OpenAI-compatible server (url). Naming one turns the judge on in the policy-gradient loops."""

    model: str = ""  # the judge's HF folder: the run starts a rollout service for it (rollout.backend), never
    #   pushed to
    address: str = ""  # a running rollout service (`meshrl serve rollout`) serving the judge, or several,
    #   comma-separated (a judge fleet: each step's judgements are shared out over them)
    replicas: int = 1  # model: the judge's rollout services the run starts (a fleet, as rollout.replicas)
    url: str = ""  # an OpenAI-compatible server's base URL (http://HOST:PORT/v1): POST url/chat/completions
    url_model: str = ""  # url: the "model" of each request (the served model's name)
    api_key_env: str = "OPENAI_API_KEY"  # url: the environment variable holding the key (unset: no key)
    mode: str = "pointwise"  # pointwise: each answer judged alone; pairwise: each two answers of a group
    #   (rollout.n) against each other, in both orders, an answer's score its share of wins
    template: str = ""  # the rubric prompt, text or a file's path, with {prompt} {response} {ground_truth}
    #   (pairwise: {response_a} {response_b} instead of {response}); empty: the mode's default rubric
    parser: str = "verdict"  # how a judgement is read: verdict (the last verdict word: yes_words 1, no_words
    #   0; pairwise: A or B), number (the last number), boxed (the last \boxed{}), json (a "score" key)
    yes_words: list[str] = dataclasses.field(default_factory=lambda: ["yes", "correct", "right"])
    no_words: list[str] = dataclasses.field(default_factory=lambda: ["no", "incorrect", "wrong"])
    score_range: tuple[float, float] = (0.0, 10.0)  # number, boxed, json: the judge's scale, read as 0..1;
    #   a score outside it is unparseable
    max_new_tokens: int = 32  # tokens a judgement may take
    temperature: float = 0.0  # 0: greedy (a judgement is then the same every time, and cached)
    retries: int = 1  # an unparseable judgement is asked again this many times, sampled at temperature 1
    on_unparsed: str = "score"  # still unparseable: score (default_score, counted in judge/unparsed and
    #   warned about) or fail (the step stops, naming the sample and what the judge said)
    default_score: float = 0.0  # on_unparsed=score: the judge's score of that sample
    weight: float = 1.0  # a judged sample's reward: weight x the judge's score + reward_weight x the reward
    reward_weight: float = 1.0  # service's score (0: the reward service's scores are only logged)
    data_sources: list[str] = dataclasses.field(default_factory=list)  # the data sources judged (empty: all);
    #   the others keep the reward service's score alone
    function: str = ""  # a judge program of your own, FILE.py:name, called as name(samples, judge) -> scores
    #   (samples: dicts of prompt, response, ground_truth, data_source, uid; judge(texts) -> judgements)
    cache: int = 65536  # judgements kept, by (judge, its weight version, prompt); 0: none
    concurrency: int = 8  # url: requests at once
    timeout: float = 120.0  # seconds one call to the judge may take

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [f"{{{k}}}" for k in ("model", "address", "url") if getattr(self, k)]
        if len(given) > 1:
            raise FieldError(f"{' and '.join(given)} set: a judge is one of them")
        one_of(self, "mode", MODES)
        one_of(self, "parser", PARSERS)
        one_of(self, "on_unparsed", ON_UNPARSED)
        lo, hi = self.score_range
        require(lo < hi, self, "score_range", "must be [low, high] with low < high")
        require(self.replicas >= 1, self, "replicas", "must be >= 1")
        require(self.max_new_tokens >= 1, self, "max_new_tokens", "must be >= 1")
        require(self.temperature >= 0, self, "temperature", "must be >= 0 (0: greedy)")
        require(self.retries >= 0, self, "retries", "must be >= 0")
        require(self.weight >= 0 and self.reward_weight >= 0, self, "weight", "and reward_weight must be >= 0")
        require(self.cache >= 0, self, "cache", "must be >= 0 (0: none)")
        require(self.concurrency >= 1, self, "concurrency", "must be >= 1")
        require(self.timeout > 0, self, "timeout", "must be > 0")

    @property
    def given(self) -> bool:
        return bool(self.model or self.address or self.url or self.function)

    def names(self) -> list[str]:
        """The judge's services in the mesh: "judge", "judge-1", ... (one per address given, or replicas)."""
        count = len([a for a in self.address.split(",") if a.strip()]) if self.address else self.replicas
        return ["judge", *(f"judge-{i}" for i in range(1, count))] if self.served else []

    def address_of(self, name: str) -> str:
        """The address judge.address gives the service `name` ("" where the run starts it)."""
        given = [a.strip() for a in self.address.split(",") if a.strip()]
        return given[int(name.rsplit("-", 1)[1]) if "-" in name else 0] if given else ""

    @property
    def served(self) -> bool:
        """A rollout service of the mesh answers (model or address), not an HTTP server."""
        return bool(self.model or self.address)
