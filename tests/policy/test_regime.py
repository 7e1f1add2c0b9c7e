"""The critical-regime detector (policy.regime) and what it does to the MOO's choice."""

from __future__ import annotations

import json

import pytest

from flexcomm.policy.moo import MooConfig, MooPolicy
from flexcomm.policy.regime import CriticalRegime
from flexcomm.policy.types import Compression
from support.policy_sim import LAYOUT, Job, gain_of

SLOW = (1e-3, 20e6)
REFERENCE = "topk:0.011"  # the simulated job's Top-k 0.1 loses nothing (gain_of)
REFERENCE_ERROR = 1 - gain_of(Compression.parse(REFERENCE))


def readings(regime: CriticalRegime, norms: list[float]) -> list[bool | None]:
    out = []
    for n in norms:
        regime.observe(n)
        out.append(regime.critical)
    return out


def test_unknown_until_a_norm_is_read_then_training_s_start_is_critical() -> None:
    regime = CriticalRegime(window=3, change=0.5)
    assert readings(regime, [0.0, 0.0]) == [None, None]  # steps that read no norm
    # critical until two windows compare, the second's last reading included
    assert readings(regime, [1.0] * 9) == [True] * 5 + [False] * 4
    assert regime.describe() == ""


def test_a_window_whose_mean_moved_by_the_change_makes_the_next_one_critical() -> None:
    regime = CriticalRegime(window=2, change=0.5)
    readings(regime, [1.0] * 4)
    assert regime.critical is False
    assert readings(regime, [0.6, 0.6]) == [False, False]  # moved 40%: not enough
    assert readings(regime, [0.3, 0.3]) == [False, True]  # halved
    assert "50%" in regime.describe()
    assert readings(regime, [0.3, 0.3]) == [True, False]  # settled again


def test_window_0_never_reads_a_regime() -> None:
    regime = CriticalRegime(window=0)
    assert readings(regime, [1.0, 0.1, 10.0]) == [None] * 3


def test_the_state_round_trips_and_takes_the_settings_as_they_are_now() -> None:
    regime = CriticalRegime(window=2, change=0.5)
    readings(regime, [1.0, 1.0, 0.2])
    state = json.loads(json.dumps(regime.state_dict()))
    back = CriticalRegime.from_state(state, window=4, change=0.3)
    assert (back.window, back.change) == (4, 0.3)
    assert (back.previous, back.total, back.count, back.critical) == (1.0, 0.2, 1, True)


def moo(**options) -> MooPolicy:
    return MooPolicy(LAYOUT.grad_bytes, MooConfig(**{"quality_reference": REFERENCE, **options}), LAYOUT)


def error_of(label: str) -> float:
    return 1 - gain_of(Compression.parse(label.split("@")[0]))


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_a_critical_regime_holds_the_choice_to_its_share_of_the_reference_s_error(share: float) -> None:
    moving = Job(moo(critical_share=share))
    moving.run(300, *SLOW, grad_norm=lambda step: 0.4 ** (step // 5))  # falls 60% each window
    assert moving.policy.regime.critical
    held = [error_of(label) for label in moving.decisions[100:]]
    assert max(held) <= share * REFERENCE_ERROR + 1e-9


def test_out_of_a_critical_regime_the_run_spends_what_it_saved_in_it() -> None:
    steady, job = Job(moo(critical_share=0.5)), Job(moo(critical_share=0.5))
    steady.run(300, *SLOW, grad_norm=lambda step: 1.0)
    job.run(300, *SLOW, grad_norm=lambda step: 0.4 ** (step // 5))  # falls 60% each window
    assert "critical regime" in job.policy.choose().reason
    saved = job.policy.budget.saved
    assert saved > steady.policy.budget.saved + 10 * REFERENCE_ERROR  # what the critical steps left unspent
    job.run(300, *SLOW, grad_norm=lambda step: 1e-30)  # the norm settles
    assert job.policy.regime.critical is False
    after = [error_of(label) for label in job.decisions[-250:]]
    assert max(after) > 0.5 * REFERENCE_ERROR and "critical regime" not in job.policy.choose().reason
    assert job.policy.budget.saved < saved


def test_a_job_that_reads_no_norm_decides_as_without_the_detector() -> None:
    unread, off = Job(moo()), Job(moo(critical_window=0))
    for job in (unread, off):
        job.run(150, *SLOW)
        job.run(150, 50e-6, 10e9)
    off_read = Job(moo(critical_window=0))
    off_read.run(150, *SLOW, grad_norm=lambda step: 0.4 ** step)
    off_read.run(150, 50e-6, 10e9, grad_norm=lambda step: 0.4 ** step)
    assert unread.decisions == off.decisions == off_read.decisions
    assert unread.policy.regime.critical is None


def test_the_moo_keeps_its_regime_across_a_restart() -> None:
    job = Job(moo())
    job.run(40, *SLOW, grad_norm=lambda step: 0.4 ** (step // 5))
    again = moo()
    again.load_state_dict(json.loads(json.dumps(job.policy.state_dict())))
    assert again.regime == job.policy.regime and again.regime.critical


@pytest.mark.parametrize(("option", "value"), [("critical_share", 1.5), ("critical_share", -0.1),
                                                ("critical_window", -1), ("critical_window", 2.5),
                                                ("critical_change", 0)])
def test_bad_settings_name_themselves(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=option):
        MooConfig(**{option: value})
