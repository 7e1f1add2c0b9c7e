"""One type names what a step runs: a compression over a collective. Decisions,
step reports and the store's aggregates give theirs as `.choice`, so a policy
compares choices, not triples of fields."""

from __future__ import annotations

import pytest

from flexcomm.policy.types import Choice, Compression, Decision, StepReport
from flexcomm.store.records import aggregate_steps


@pytest.mark.parametrize("text", ["topk:0.01@ag_topk", "powersgd:2@dense_ring", "bf16@dense_tree", "dense@ps"])
def test_text_form_round_trips(text: str) -> None:
    choice = Choice.parse(text)
    assert choice.label == text
    assert Choice.parse(choice.label) == choice


@pytest.mark.parametrize(("text", "named"), [
    ("topk:0.01", "compression@collective"),
    ("topk:0.01@dense_ring", "topk runs over"),
    ("powersgd:2@ag_topk", "powersgd runs over"),
    ("zip@dense_ring", "unknown compressor family"),
    ("dense@nowhere", "unknown collective"),
])
def test_bad_text_names_what_is_wrong(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Choice.parse(text)


def test_a_pairing_the_collective_cannot_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="collective"):
        Choice(Compression("topk", 0.1), "dense_ring")


def test_decision_report_and_aggregate_name_the_same_choice() -> None:
    choice = Choice.parse("topk:0.033@art_tree")
    decision = Decision.of(choice, version=2)
    assert decision.choice == choice and decision.label == choice.label
    assert (decision.family, decision.param, decision.collective) == ("topk", 0.033, "art_tree")
    report = StepReport(step=1, family="topk", param=0.033, collective="art_tree", t_comp_s=0.0, t_sync_s=0.1,
                        gain=0.5)
    assert report.choice == choice
    (agg,) = aggregate_steps("job", [report])
    assert agg.choice == choice
    assert not choice.lossless and Choice.parse("bf16@dense_ring").lossless


def test_same_choice_compares_choice_and_root() -> None:
    a = Decision.of(Choice.parse("topk:0.01@art_ring"), root="star", version=1, reason="a")
    assert a.same_choice(Decision.of(a.choice, root="star", version=5, reason="b"))
    assert not a.same_choice(Decision.of(a.choice, root="var"))
    assert not a.same_choice(Decision.of(Choice.parse("topk:0.01@art_tree"), root="star"))


def test_a_text_parsed_again_is_the_same_object_and_a_bad_one_fails_every_time() -> None:
    # The agent parses each report's gain names; each text is parsed once.
    assert Compression.parse("topk:0.01") is Compression.parse("topk:0.01")
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^gains: 'topk:2'"):
            Compression.parse("topk:2", "gains")


def test_reports_of_one_choice_share_it_and_still_check_their_fields() -> None:
    a = StepReport(step=1, family="topk", param=0.01, collective="ag_topk", t_comp_s=0, t_sync_s=0.1, gain=0.5)
    b = StepReport(step=2, family="topk", param=0.01, collective="ag_topk", t_comp_s=0, t_sync_s=0.1, gain=0.5)
    assert a.choice is b.choice and a.compression == Compression("topk", 0.01)
    with pytest.raises(ValueError, match="param"):
        StepReport(step=3, family="powersgd", param=True, collective="dense_ring", t_comp_s=0, t_sync_s=0.1,
                   gain=0.5)
