"""Policy options as they arrive (plain values from an RPC, the CLI or TOML):
every option of every policy is checked for its type by its config's
annotations, each error naming the option, and no option makes a derived
structure large (the candidate grid is counted before it is built)."""

from __future__ import annotations

import dataclasses
import time
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexcomm.policy import make_policy
from flexcomm.policy.gravac import GravacConfig
from flexcomm.policy.moo import MAX_CANDIDATE_CRS, MooConfig, MooPolicy
from flexcomm.policy.static import StaticConfig
from flexcomm.policy.types import StepReport, check_options

CONFIGS = {"static": StaticConfig, "moo": MooConfig, "gravac": GravacConfig}

# A value of each plain kind; every field refuses those not of its kind.
PLAIN = {
    "bool": st.booleans(),
    "int": st.integers(-10**6, 10**6),
    "float": st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: not v.is_integer()),
    "str": st.text(max_size=8).filter(lambda s: "," not in s),
    "list": st.lists(st.integers(0, 3), min_size=1, max_size=3),
    "table": st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2),
}


def accepts(kind: typing.Any) -> set[str]:
    """The plain kinds a field of annotated type `kind` takes."""
    if kind is bool:
        return {"bool"}
    if kind is int:
        return {"int"}
    if kind is float:
        return {"int", "float"}
    if kind is str:
        return {"str"}
    if typing.get_origin(kind) is tuple:
        return {"str"} | ({"list", "int"} if typing.get_args(kind)[0] is int else set())
    if kind == str | None:
        return {"str"}
    raise AssertionError(f"a field of type {kind} needs a case here")


FIELDS = [(policy, f.name) for policy, config in CONFIGS.items() for f in dataclasses.fields(config)]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=st.sampled_from(FIELDS), data=st.data())
def test_a_value_of_the_wrong_type_is_refused_naming_the_option(case: tuple[str, str], data) -> None:
    policy, name = case
    kind = typing.get_type_hints(CONFIGS[policy])[name]
    wrong = data.draw(st.sampled_from(sorted(set(PLAIN) - accepts(kind))))
    value = data.draw(PLAIN[wrong])
    with pytest.raises(ValueError) as err:
        make_policy(policy, grad_bytes=1e6, nodes=2, options={name: value})
    assert str(err.value).startswith((f"{name}: ", f"{name}["))


@pytest.mark.parametrize(("policy", "options", "message"), [
    ("static", {"compression": 0.5}, "compression: expected a string, got 0.5"),
    ("static", {"compression": "topk:x"}, "compression: 'x' is not a number in 'topk:x'"),
    ("moo", {"c_low": "0.1"}, "c_low: expected a number, got '0.1'"),
    ("moo", {"ranks": ["2"]}, "ranks[0]: expected a whole number, got '2'"),
    ("moo", {"ranks": [2.5]}, "ranks[0]: expected a whole number, got 2.5"),
    ("moo", {"warmup_steps": True}, "warmup_steps: expected a whole number, got True"),
    ("moo", {"collectives": ["ag_topk", 3]}, "collectives[1]: expected a string, got 3"),
    ("moo", {"collectives": "ag_topk,ag_topk"}, "collectives: ['ag_topk', 'ag_topk'] lists one twice"),
    ("moo", {"families": "topk,topk"}, "families: ['topk', 'topk'] lists one twice"),
    ("gravac", {"window": 2.5}, "window: expected a whole number, got 2.5"),
    ("gravac", {"epsilon": None}, "epsilon: expected a number, got None"),
])
def test_wrong_types_named(policy: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        make_policy(policy, grad_bytes=1e6, nodes=2, options=options)
    assert str(err.value) == message


def test_checked_values_take_their_fields_form() -> None:
    checked = check_options({"c_low": 1, "collectives": "ag_topk, art_ring", "warmup_steps": 2}, MooConfig, "MOO")
    assert checked == {"c_low": 1.0, "collectives": ("ag_topk", "art_ring"), "warmup_steps": 2}
    assert type(checked["c_low"]) is float
    with pytest.raises(ValueError, match=r"^c_low: a whole number of 401 digits is out of range$"):
        check_options({"c_low": 10**400}, MooConfig, "MOO")
    with pytest.raises(ValueError, match=r"^options: expected a table of MOO options"):
        check_options(5, MooConfig, "MOO")  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [
    {"factor": 1.0000001},
    {"c_low": 1e-300, "factor": 1.5},
    {"c_low": 5e-324, "c_high": 1.0},
    {"c_low": 1e-9, "c_high": 1.0, "factor": 1.01},
])
@pytest.mark.parametrize("policy", ["moo", "gravac"])
def test_a_huge_candidate_grid_is_refused_before_it_is_built(policy: str, options: dict) -> None:
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        make_policy(policy, grad_bytes=1e6, nodes=2, options=options)
    assert time.perf_counter() - start < 0.5
    assert str(err.value).startswith("factor: ") and f"at most {MAX_CANDIDATE_CRS}" in str(err.value)


def test_the_largest_grid_allowed_is_built() -> None:
    config = MooConfig(c_low=0.001, c_high=0.1, factor=(0.1 / 0.001) ** (1 / (MAX_CANDIDATE_CRS - 1)),
                       families=("topk",))
    assert len(config.crs) <= MAX_CANDIDATE_CRS
    assert MooPolicy(1e6, config).choose().probes == tuple(f"topk:{c!r}" for c in config.crs)


def test_gains_and_times_of_options_no_candidate_has_are_not_kept() -> None:
    policy = MooPolicy(1e6)
    for i in range(50):
        strange = {f"topk:{0.5 + j / 1000!r}": 0.5 for j in range(63)}
        policy.observe_steps([StepReport(step=i, family="topk", param=0.3 + i / 1000, collective="ag_topk",
                                       t_comp_s=0.01, t_sync_s=0.1, gain=0.5, gains={**strange, "topk:0.1": 0.9})])
    saved = policy.state_dict()
    gains = saved["gains"]
    assert set(gains["probed"]) == {"topk:0.1"} and gains["delivered"] == {}
    assert set(gains["seen"]) == {"topk:0.1"}
    assert saved["times"]["comp"] == {} and saved["state"]["sync"] == {}
