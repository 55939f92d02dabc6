"""RolloutBatch / Episodes with environment tokens inside the completion: the action mask is kept
apart from the attention mask through construction, concat, select, device moves and log-probs;
advantage inputs follow their rows."""

from __future__ import annotations

import pytest
import torch

from posttrain.models import load_model_and_tokenizer, sequence_logprobs
from posttrain.rollout import Episodes, RolloutBatch, RolloutEngine


def _two_turn() -> RolloutBatch:
    # row 0: policy 5 6 | env 7 8 | policy 9 ; row 1: policy 5 | env 7 | policy 6 2 (EOS)
    return RolloutBatch.from_token_lists(
        [[3, 4], [4]],
        [[5, 6, 7, 8, 9], [5, 7, 6, 2]],
        pad_token_id=0,
        group_ids=[0, 0],
        finish_reasons=["length", "stop"],
        actions=[[1, 1, 0, 0, 1], [1, 0, 1, 1]],
        logprobs=[[-1.0, -2.0, -9.0, -9.0, -3.0], [-1.5, -9.0, -2.5, -0.5]],
    )


def test_from_token_lists_masks_and_lengths():
    b = _two_turn()
    assert b.prompt_ids.tolist() == [[3, 4], [0, 4]]
    assert b.completion_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert b.action_mask.tolist() == [[1, 1, 0, 0, 1], [1, 0, 1, 1, 0]]
    assert b.lengths.tolist() == [5, 4] and b.action_lengths.tolist() == [3, 3]
    # sampling log-probs are kept on actions only (the environment sampled nothing)
    assert b.logprobs.tolist() == [[-1.0, -2.0, 0.0, 0.0, -3.0], [-1.5, 0.0, -2.5, -0.5, 0.0]]
    assert b.completion_lists() == [[5, 6, 7, 8, 9], [5, 7, 6, 2]]
    _, attn, act = b.model_inputs()
    assert attn.tolist() == [[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0]]  # env tokens attended
    assert act.tolist() == [[0, 0, 1, 1, 0, 0, 1], [0, 0, 1, 0, 1, 1, 0]]  # only actions scored


def test_single_turn_batches_default_to_all_completion_tokens_as_actions():
    b = RolloutBatch.from_token_lists(
        [[1]], [[5, 6]], pad_token_id=0, group_ids=[0], finish_reasons=["stop"], logprobs=[[-1.0, -2.0]]
    )
    assert b.action_mask is b.completion_mask and b.action_lengths.tolist() == [2]


def test_concat_select_to_keep_action_masks():
    plain = RolloutBatch.from_token_lists(
        [[1, 2, 3]], [[5]], pad_token_id=0, group_ids=[1], finish_reasons=["stop"], logprobs=[[-0.1]]
    )
    c = RolloutBatch.concat([_two_turn(), plain])
    assert c.action_mask.tolist() == [[1, 1, 0, 0, 1], [1, 0, 1, 1, 0], [1, 0, 0, 0, 0]]
    assert c.completion_mask.tolist()[2] == [1, 0, 0, 0, 0]
    s = c.select([1, 2])
    assert s.action_mask.tolist() == [[1, 0, 1, 1, 0], [1, 0, 0, 0, 0]]
    moved = s.to("cpu")
    assert torch.equal(moved.action_mask, s.action_mask)
    assert torch.equal(moved.model_inputs()[2], s.model_inputs()[2])


def test_bad_action_masks_are_refused_with_row_and_position():
    with pytest.raises(
        ValueError, match="action_mask marks row 1, completion position 3, where completion_mask is 0"
    ):
        RolloutBatch(
            torch.ones(2, 1, dtype=torch.long),
            torch.ones(2, 1, dtype=torch.long),
            torch.ones(2, 4, dtype=torch.long),
            torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
            None,
            ["stop", "stop"],
            torch.tensor([0, 0]),
            0,
            action_mask=torch.tensor([[1, 0, 1, 1], [1, 0, 1, 1]]),
        )
    with pytest.raises(ValueError, match=r"actions\[1\] has 2 entries for a completion of 3 tokens"):
        RolloutBatch.from_token_lists(
            [[1], [1]],
            [[5], [5, 6, 7]],
            pad_token_id=0,
            group_ids=[0, 0],
            finish_reasons=["stop", "stop"],
            actions=[[1], [1, 0]],
        )


def test_sequence_logprobs_scores_actions_after_env_tokens_like_one_plain_forward():
    model, _ = load_model_and_tokenizer("tiny", seed=0)
    b = _two_turn()
    ids, attn, act = b.model_inputs()
    with torch.no_grad():
        lp, ent = sequence_logprobs(model, ids, attn, response_mask=act)
        for i in range(len(b)):
            keep = attn[i].bool()
            seq = ids[i][keep]
            logits = model(input_ids=seq[None]).logits[0, :-1].float()
            ref = torch.log_softmax(logits, -1).gather(1, seq[1:, None]).squeeze(1)
            a = act[i][keep][1:].bool()
            torch.testing.assert_close(lp[i][keep][1:][a], ref[a], rtol=0, atol=2e-5)
            assert (lp[i][~act[i].bool()] == 0).all() and (ent[i][~act[i].bool()] == 0).all()
    # the old way (env tokens hidden from attention) shifts positions and is refused
    hidden = torch.cat([b.prompt_mask, b.action_mask], dim=1)
    with pytest.raises(ValueError, match="row 0, position 6, but the preceding token is padding"):
        sequence_logprobs(model, ids, hidden, response_mask=act)


def test_episodes_advantage_inputs_follow_rows_through_select_and_concat():
    a = _two_turn()
    ep_a = Episodes(
        a,
        ["x", "y"],
        ["ex0", "ex0"],
        advantage_inputs={
            "turn_reward": torch.tensor([1.0, 2.0]),
            "turn_index": torch.tensor([[0, 0, 0, 0, 1], [0, 0, 1, 1, 0]]),
        },
    )
    b = RolloutBatch.from_token_lists(
        [[1]], [[5, 6]], pad_token_id=0, group_ids=[7], finish_reasons=["stop"], logprobs=[[-1.0, -2.0]]
    )
    ep_b = Episodes(
        b,
        ["z"],
        ["ex1"],
        advantage_inputs={"turn_reward": torch.tensor([3.0]), "turn_index": torch.tensor([[0, 0]])},
    )
    merged = Episodes.concat([ep_a, ep_b])
    assert merged.batch.group_ids.tolist() == [0, 0, 1]
    assert merged.advantage_inputs["turn_reward"].tolist() == [1.0, 2.0, 3.0]
    # per-token inputs are right-padded with 0 to the merged completion width
    assert merged.advantage_inputs["turn_index"].tolist() == [
        [0, 0, 0, 0, 1],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ]
    picked = merged.select([2, 0])
    assert picked.advantage_inputs["turn_reward"].tolist() == [3.0, 1.0]
    assert picked.advantage_inputs["turn_index"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
    assert picked.texts == ["z", "x"] and picked.batch.action_mask.tolist()[1] == [1, 1, 0, 0, 1]
    with pytest.raises(
        ValueError, match=r"part 1 has keys \[\] but part 0 has \['turn_index', 'turn_reward'\]"
    ):
        Episodes.concat([ep_a, Episodes(b, ["z"], ["ex1"])])
    with pytest.raises(
        ValueError,
        match=r"advantage_inputs\['turn_reward'\] must be a tensor with one row per sequence \(2 rows\), got shape \(3,\)",
    ):
        Episodes(a, ["x", "y"], ["e", "e"], advantage_inputs={"turn_reward": torch.zeros(3)})


def test_engine_interface_declares_pad_token_id():
    class NoPad(RolloutEngine):
        def generate(self, prompt_ids, n_per_prompt, params):
            raise NotImplementedError

    with pytest.raises(TypeError, match="pad_token_id"):
        NoPad()
