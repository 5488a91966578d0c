"""A reward function's form from its signature: verl's compute_score or TRL's reward function
(meshrl/reward_forms.py), read alike from the loaded function and from its source (preflight's way)."""

import ast
import inspect

import pytest

from meshrl import reward_forms
from meshrl.reward_forms import parameters_of
from services.reward.functions import TRLCall, check_result, load

SOURCES = {
    "verl": "def f(data_source, solution_str, ground_truth, extra_info=None): ...",
    "verl_kwargs": "def f(solution_str, **kwargs): ...",
    "verl_format": "def f(data_source, solution_str, ground_truth=None, extra_info=None): ...",
    "verl_keyword_only": "def f(*, ground_truth, solution_str, **kwargs): ...",
    "trl_accuracy": "def f(completions, solution, **kwargs): ...",
    "trl_all": "def f(prompts, completions, completion_ids=None, *, level=1, **kwargs): ...",
    "trl_async": "async def f(completions, **kwargs): ...",
    "neither": "def f(responses, answers): ...",
    "trl_positional_only": "def f(completions, /, **kwargs): ...",
}


def from_source(name: str) -> dict:
    return parameters_of(ast.parse(SOURCES[name]).body[0].args)  # type: ignore[attr-defined]


def from_function(name: str) -> dict:
    scope: dict = {}
    exec(SOURCES[name], scope)
    return dict(inspect.signature(scope["f"]).parameters)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_source_reads_as_the_loaded_function_does(name):
    read, loaded = from_source(name), from_function(name)
    assert [(p.name, p.kind, p.default is p.empty) for p in read.values()] == [
        (p.name, p.kind, p.default is p.empty) for p in loaded.values()
    ]


@pytest.mark.parametrize(
    "name, form",
    [
        ("verl", "verl"),
        ("verl_kwargs", "verl"),
        ("verl_format", "verl"),
        ("verl_keyword_only", "verl"),
        ("trl_accuracy", "trl"),
        ("trl_all", "trl"),
        ("trl_async", "trl"),
    ],
)
def test_the_form_is_decided_from_the_signature(name, form):
    assert reward_forms.form(from_function(name), False, "r.py:f") == form


@pytest.mark.parametrize(
    "name, match",
    [
        ("neither", r"r.py:f is neither reward function form: parameter\(s\) \['responses', 'answers'\] are not"),
        ("trl_positional_only", r"\['completions'\] are positional-only; TRL passes its arguments by keyword"),
    ],
)
def test_a_function_of_neither_form_is_one_line_naming_both(name, match):
    with pytest.raises(ValueError, match=match) as e:
        reward_forms.form(from_function(name), False, "r.py:f")
    assert "\n" not in str(e.value)


def test_what_each_form_takes_from_a_row():
    assert reward_forms.takes_ground_truth(from_function("verl"), False)
    assert not reward_forms.takes_ground_truth(from_function("verl_format"), False)  # ground_truth=None
    assert not reward_forms.takes_ground_truth(from_function("verl_kwargs"), False)
    assert reward_forms.trl_columns(from_function("trl_accuracy")) == ["solution"]
    assert reward_forms.trl_columns(from_function("trl_all")) == []


def test_a_trl_function_loads_as_a_batched_call_and_may_answer_none(tmp_path):
    f = tmp_path / "r.py"
    f.write_text(
        "def accuracy_reward(completions, solution, **kwargs):\n"
        "    return [None if s is None else float(c[0]['content'] == s) for c, s in zip(completions, solution)]\n"
    )
    fn = load(f"{f}:accuracy_reward")
    assert isinstance(fn, TRLCall)
    chat = [{"role": "user", "content": "1+1="}]
    out = fn(["s", "s"], ["2", "3"], [None, None], [None, None], [chat, chat], [{"solution": "2"}, {"solution": None}])
    assert out == [1.0, None]
    assert check_result(None, none_ok=True) == (None, {})
    with pytest.raises(ValueError, match="returned a NoneType"):  # verl's form: None is an error, as before
        check_result(None)


def test_an_async_trl_function_is_awaited(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("async def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    assert load(f"{f}:length_reward")(["s"], ["abc"], [None], [None], ["1+1="], [{}]) == [3.0]
