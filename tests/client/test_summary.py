"""The job summary's arithmetic: steps, bytes and the exploring share per choice."""

from __future__ import annotations

import pytest

from flexcomm.client.stats import StepStats
from flexcomm.client.summary import JobSummary


def stats(step: int, family: str, param: float, collective: str, began: float, sent: int) -> StepStats:
    s = StepStats(step=step, family=family, param=param, collective=collective, version=1, bytes_sent=sent)
    s.began = began
    return s


def test_steps_bytes_seconds_and_the_exploring_share_per_choice() -> None:
    summary = JobSummary()
    summary.add(stats(0, "dense", 0.0, "dense_ring", 0.0, 400), 400, exploring=False)
    summary.add(stats(1, "topk", 0.01, "ag_topk", 0.5, 8), 400, exploring=True)
    summary.add(stats(2, "topk", 0.01, "ag_topk", 0.6, 8), 400, exploring=True)
    summary.add(stats(3, "dense", 0.0, "dense_ring", 0.7, 400), 400, exploring=False)
    d = summary.as_dict()
    assert d["steps"] == 4 and d["exploring_share"] == 0.5
    topk = d["choices"]["topk:0.01@ag_topk"]
    assert (topk["steps"], topk["bytes_sent"], topk["dense_bytes"]) == (2, 16, 800)
    assert topk["seconds"] == pytest.approx(0.2)
    # a step's wall time is known once the next one starts: the last dense step has none yet
    assert d["choices"]["dense@dense_ring"]["seconds"] == 0.5
    assert d["bytes_saved"] == 1600 - 816 and d["bytes_saved_share"] == (1600 - 816) / 1600
