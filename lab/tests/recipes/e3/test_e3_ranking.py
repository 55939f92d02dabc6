"""E3's end-of-epoch ranking (arXiv:2505.18573; authors' ``update_rank``) through the sampler's real
plan/observe path: questions are ranked by MEAN reward (E3's own budgets make sum and mean disagree),
and unvisited questions tie with the seen mean-0 ones at the hard end (``unseen: tail``, the default).
Each test kills a mutant that passed the rest of the suite (rank by sum; ``hardest`` / ``zero`` default)."""

from __future__ import annotations

from posttrain.hooks.base import GroupOutcome
from posttrain.tasks.base import Example
from posttrain_lab.recipes.e3.hooks import UNSEEN, E3Sampler


def _examples(*ids: str) -> list[Example]:
    return [Example(id=i, prompt=f"question {i}", answer="1") for i in ids]


def _one_epoch(sampler: E3Sampler, rewards: dict[str, list[float]]) -> None:
    """Plan the whole first epoch, observe ``rewards`` per question id (absent ids: never scored),
    then plan once more so the finished epoch is ranked."""
    plan = sampler.plan(0, len(sampler.examples), 8)
    outcomes = [
        GroupOutcome(ex, rewards[ex.id], [r > 0.5 for r in rewards[ex.id]], [5] * len(rewards[ex.id]))
        for ex in plan.examples
        if ex.id in rewards
    ]
    sampler.observe(outcomes, 0)
    sampler.plan(1, 1, 8)


def test_questions_are_ranked_by_mean_reward_not_by_sum():
    # a: 4 rollouts, all right (mean 1, sum 4); b: 12 rollouts, half right (mean 0.5, sum 6);
    # c: 8 rollouts, all wrong. By mean a is the easiest; by sum b would be.
    s = E3Sampler(_examples("a", "b", "c"), seed=0)
    _one_epoch(s, {"a": [1.0] * 4, "b": [1.0, 0.0] * 6, "c": [0.0] * 8})
    assert s.ranks == {"a": 0.0, "b": 1 / 3, "c": 2 / 3}


def test_unvisited_questions_tie_with_mean_zero_ones_at_the_tail_by_default():
    # q0 and q9 never scored; q3 seen at mean 0; q1 mean 1, q2 mean 0.5 (ids break ties)
    ex = _examples("q0", "q1", "q2", "q3", "q9")
    s = E3Sampler(ex, seed=0)
    assert s.unseen == "tail"
    _one_epoch(s, {"q1": [1.0] * 4, "q2": [1.0, 0.0] * 2, "q3": [0.0] * 4})
    assert s.ranks == {"q1": 0.0, "q2": 0.2, "q0": 0.4, "q3": 0.6, "q9": 0.8}
    assert [s.rank_of(q) for q in ("q0", "q9")] == [0.4, 0.8]  # not both the single top rank 0.8

    hardest = E3Sampler(ex, seed=0, unseen="hardest")
    _one_epoch(hardest, {"q1": [1.0] * 4, "q2": [1.0, 0.0] * 2, "q3": [0.0] * 4})
    assert [hardest.rank_of(q) for q in ("q0", "q9", "q3")] == [0.8, 0.8, 0.4]
    zero = E3Sampler(ex, seed=0, unseen="zero")
    _one_epoch(zero, {"q1": [1.0] * 4, "q2": [1.0, 0.0] * 2, "q3": [0.0] * 4})
    assert [zero.rank_of(q) for q in ("q0", "q9")] == [UNSEEN, UNSEEN]


def test_before_the_first_epoch_ends_nothing_is_ranked():
    s = E3Sampler(_examples("a", "b", "c", "d"), seed=0)
    s.plan(0, 2, 8)
    assert s.ranks == {} and s.rank_of("a") == UNSEEN


def test_ties_keep_the_dataset_order_as_the_authors_stable_sort():
    """The authors' update_rank sorts the dataset's (index, stats) items with a stable sort, so equal
    means keep the dataset's order; here the dataset order (z, m, a) is not the id order (a, m, z):
    z and a tie at mean 0 with m unvisited (mean 0 under unseen: tail)."""
    s = E3Sampler(_examples("z", "m", "a", "e"), seed=0)
    _one_epoch(s, {"z": [0.0] * 4, "a": [0.0] * 4, "e": [1.0] * 4})
    assert s.ranks == {"e": 0.0, "z": 0.25, "m": 0.5, "a": 0.75}
