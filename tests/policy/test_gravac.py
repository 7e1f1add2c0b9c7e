"""GraVAC: raises compression while the gain holds, settles, steps back."""

from __future__ import annotations

import pytest

from flexcomm.policy import make_policy, policy_from_state
from flexcomm.policy.gravac import SETTLED, GravacConfig, GravacPolicy
from flexcomm.policy.types import Compression, StepReport


def drive(policy: GravacPolicy, steps: int, gain, t_sync) -> list[float]:
    """`steps` steps; gain(cr) and t_sync(cr) by the Top-k CR each runs (1: dense)."""
    crs = []
    for i in range(steps):
        d = policy.decide()
        cr = d.compression.cr
        crs.append(cr)
        policy.observe_steps([StepReport(step=i, family=d.family, param=d.param, collective=d.collective,
                                       t_comp_s=0.001, t_sync_s=t_sync(cr), gain=gain(cr) if cr < 1 else 1.0,
                                       t_compute_s=0.01,
                                       gains={n: gain(Compression.parse(n).cr) for n in d.probes})])
    return crs


def test_compresses_more_while_gain_stays_above_epsilon() -> None:
    policy = GravacPolicy(GravacConfig(epsilon=0.5, omega=0.01, window=3))
    crs = drive(policy, 40, gain=lambda c: 0.9, t_sync=lambda c: 1.0 * c + 0.001)
    assert crs[0] == 1.0  # dense warm-up
    assert policy.phase == SETTLED and policy.decide().param == 0.001
    assert crs == sorted(crs, reverse=True)  # never less compression while searching


def test_settles_before_the_gain_drops_below_epsilon() -> None:
    gains = {0.1: 0.95, 0.033: 0.85, 0.011: 0.75, 0.004: 0.6, 0.001: 0.4}
    policy = GravacPolicy(GravacConfig(epsilon=0.7, window=3))
    drive(policy, 60, gain=gains.__getitem__, t_sync=lambda c: c + 0.001)
    assert policy.phase == SETTLED and policy.decide().param == 0.011


def test_settles_when_throughput_stops_growing() -> None:
    policy = GravacPolicy(GravacConfig(epsilon=0.1, omega=0.05, window=3))
    # Sync time flat below cr 0.033: compressing further buys no throughput.
    drive(policy, 60, gain=lambda c: 0.9, t_sync=lambda c: max(c, 0.033))
    assert policy.phase == SETTLED and policy.decide().param in (0.033, 0.011)


def test_steps_back_when_the_settled_gain_falls() -> None:
    policy = GravacPolicy(GravacConfig(epsilon=0.5, window=3))
    drive(policy, 40, gain=lambda c: 0.9, t_sync=lambda c: c + 0.001)
    settled = policy.decide().param
    drive(policy, 3, gain=lambda c: 0.3 if c <= settled else 0.9, t_sync=lambda c: c)
    assert policy.decide().param > settled


def test_state_round_trip() -> None:
    policy = make_policy("gravac", grad_bytes=1e6, nodes=2, options={"window": 2})
    drive(policy, 9, gain=lambda c: 0.9, t_sync=lambda c: c)
    back = policy_from_state(policy.state_dict())
    assert back.decide() == policy.decide()


@pytest.mark.parametrize(("options", "field"), [
    ({"epsilon": 1.5}, "epsilon"), ({"omega": -0.1}, "omega"), ({"window": 0}, "window"),
    ({"collective": "dense_ring"}, "collective"), ({"speed": 3}, "speed"),
])
def test_bad_options(options: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_policy("gravac", grad_bytes=1e6, nodes=2, options=options)
