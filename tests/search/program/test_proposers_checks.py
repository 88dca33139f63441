"""Proposers: reply parsing errors, the request budget's state round trip, exhausted retries,
and the ensemble's state, without any network access."""

import pytest

from graded.search.program.program import Program
from graded.search.program.proposers import (
    EnsembleProposer,
    OpenAIProposer,
    ProposalError,
    ProposerError,
    apply_diffs,
    parse_function,
)

BEST = Program(("def priority(x):\n    return x\n",))


def _openai(**kwargs):
    return OpenAIProposer(base_url="http://127.0.0.1:9", model="m", **kwargs)


def test_an_empty_search_section_is_refused():
    with pytest.raises(ProposalError, match=r"a SEARCH section is empty"):
        apply_diffs(BEST, [("  \n", "x")])


def test_a_reply_without_a_function_is_refused():
    with pytest.raises(ProposalError, match=r"the reply defines no function"):
        parse_function("```python\nx = 1\n```", "priority")


def test_whole_function_replies_need_a_single_block():
    two = Program(("def a():\n    return 1\n", "def b():\n    return 2\n"))
    with pytest.raises(ProposalError, match=r"several evolvable blocks need SEARCH/REPLACE diffs"):
        OpenAIProposer.parse("def a():\n    return 3\n", two)


def test_a_diff_that_breaks_the_block_is_refused():
    reply = "<<<<<<< SEARCH\n    return x\n=======\n    return (x\n>>>>>>> REPLACE\n"
    with pytest.raises(ProposalError, match=r"the proposed block does not parse: "):
        OpenAIProposer.parse(reply, BEST)


def test_budget_and_rejections_round_trip_through_state():
    p = _openai()
    p.budget.used, p.rejected = 7, {"the reply has no text": 2}
    q = _openai()
    q.load_state(p.state())
    assert q.budget.used == 7 and q.rejected == {"the reply has no text": 2}
    assert q.rejected is not p.rejected


def test_retries_that_give_no_usable_reply_stop_the_search(monkeypatch):
    p = _openai(retries=1)
    replies = iter(["", "no code here"])
    monkeypatch.setattr(p, "complete", lambda prompt: next(replies))
    with pytest.raises(ProposerError, match=r"no usable reply in 2 requests \(rejections: "
                                            r"\{'the reply has no text': 1, 'the reply contains "
                                            r"no function': 1\}\)"):
        p.propose([BEST])


@pytest.mark.parametrize("proposers, weights, shown", [([], [], "0 proposers and 0 weights"),
                                                       (["p"], [1, 2], "1 proposers and 2")])
def test_ensemble_needs_one_weight_per_proposer(proposers, weights, shown):
    with pytest.raises(ValueError, match=rf"{shown}.*expected one weight per proposer"):
        EnsembleProposer(proposers, weights)


def test_ensemble_state_restores_its_generator_and_members():
    a, b = _openai(), _openai()
    ens = EnsembleProposer([a, b], [1.0, 3.0], seed=5)
    a.budget.used, b.rejected = 2, {"r": 1}
    ens.rng.random(3)
    state = ens.state()
    after = ens.rng.random(4).tolist()
    c, d = _openai(), _openai()
    other = EnsembleProposer([c, d], [1.0, 3.0], seed=99)
    other.load_state(state)
    assert other.rng.random(4).tolist() == after
    assert c.budget.used == 2 and d.rejected == {"r": 1}
    with pytest.raises(ValueError):  # a state for another number of members
        EnsembleProposer([_openai()], [1.0]).load_state(state)
