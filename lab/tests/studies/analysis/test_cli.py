"""End to end through the CLI on a micro synthetic setting (a few steps each; numbers are not checked
for meaning, only that every stage ran and the reports agree with the pieces)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

SYN = "synthetic={n_entities: 30, n_dev: 2, pretrain_steps: 2, pretrain_batch_size: 4, hidden_size: 32, intermediate_size: 64}"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("base"))


def _run(args):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return res


def test_forgetting_cli(tmp_path, base_dir):
    out = tmp_path / "f"
    _run(
        [
            "analyze", "forgetting", SYN, f"synthetic_dir={base_dir}", f"out_dir={out}", "ift.steps=4",
            "ift.batch_size=2", "ift_rows=8", "n_checkpoints=2", "restore.steps=1", "restore.batch_size=2",
            "control_seeds=2", "threads=1", "restore_lrs=[3e-4]",
        ]
    )  # fmt: skip
    res = json.loads((out / "forgetting.json").read_text())
    # the verdict moves with the restoration lr; its sensitivity is reported beside it
    main, other = res["sensitivity"]
    assert main["lr"] == pytest.approx(1e-3) and other["lr"] == pytest.approx(3e-4)
    assert main["transition_step"] == res["transition_step"]
    assert main["transition_step_vs_control"] == res["transition_step_vs_control"]
    assert main["restored_scores"] == [c["score_restored"] for c in res["checkpoints"]]
    assert len(other["restored_scores"]) == 2 and len(other["control_scores"]) == 2
    gaps = [res["score_base"] - r for r in other["restored_scores"]]
    first = next((s for s, g in zip([1, 4], gaps, strict=True) if g > other["epsilon"]), None)
    assert other["transition_step"] == first
    md = (out / "forgetting.md").read_text()
    verdict_at = md.index("transition step (first G_s > epsilon)")
    assert md.index("sensitivity to the restoration learning rate", verdict_at) > verdict_at
    assert "lr 0.0003:" in md and "lr 0.001:" in md
    assert [c["step"] for c in res["checkpoints"]] == [1, 4]
    for c in res["checkpoints"]:
        assert c["forgetting"] == pytest.approx(res["score_base"] - c["score_tuned"])
        assert c["recovery_gap"] == pytest.approx(res["score_base"] - c["score_restored"])
        assert (c["stage"] == "actual") == (c["recovery_gap"] > res["epsilon"])
    assert (out / "forgetting.png").stat().st_size > 0 and (
        out / "ift" / "checkpoints" / "step_000004"
    ).is_dir()


def test_intervention_and_consistency_cli(tmp_path, base_dir):
    out = tmp_path / "i"
    groups = "groups=[inconsistent-golden-exp, consistent_wrong0.5-inconsistent_golden-exp, inconsistent-predict-model-exp]"
    res = _run(
        ["analyze", "intervention", SYN, f"synthetic_dir={base_dir}", f"out_dir={out}", groups,
         "ift.steps=1", "ift.batch_size=2", "threads=1"]
    )  # fmt: skip
    assert "partial correlation" in res.output
    data = json.loads((out / "intervention.json").read_text())
    rows = {g["group"]: g for g in data["groups"]}
    n = rows["inconsistent-golden-exp"]["n_items"]
    assert rows["inconsistent-golden-exp"]["own_prediction_items"] == 0
    assert rows["inconsistent-predict-model-exp"]["own_prediction_items"] == n
    assert rows["consistent_wrong0.5-inconsistent_golden-exp"]["own_prediction_items"] == round(0.5 * n)
    line = json.loads((out / "groups" / "inconsistent-predict-model-exp.jsonl").read_text().splitlines()[0])
    assert line["messages"][1]["content"].startswith(f"{'ABCD'[line['target']]}. ")
    assert line["target"] != line["answer"]
    out2 = tmp_path / "c"
    res = _run(
        [
            "analyze",
            "consistency",
            SYN,
            f"synthetic_dir={base_dir}",
            f"out_dir={out2}",
            "tuned=tiny",
            "--json",
        ]
    )
    data = json.loads(res.output)
    assert -100 <= data["consistency"] <= 100 and data["kl"] >= 0


def test_config_errors():
    res = CliRunner().invoke(app, ["analyze", "forgetting", "base=tiny"])
    assert res.exit_code == 2 and "probes" in res.output


def test_consistency_from_files_vicuna(tmp_path):
    from posttrain_lab.studies.analysis import MCQ, save_mcqs

    probes = [MCQ(f"Where is item {i}?", ("here", "there", "nowhere"), i % 3, id=str(i)) for i in range(5)]
    save_mcqs(tmp_path / "p.jsonl", probes)
    save_mcqs(tmp_path / "d.jsonl", probes[:2])
    out = tmp_path / "c"
    res = _run(
        ["analyze", "consistency", "base=tiny", "tuned=tiny", f"probes={tmp_path / 'p.jsonl'}",
         f"dev={tmp_path / 'd.jsonl'}", "shots=2", "domain=places", f"out_dir={out}", "--json"]
    )  # fmt: skip
    data = json.loads(res.output)
    assert data["tuned_style"] == "vicuna" and data["n_questions"] == 5
    per_q = json.loads((out / "consistency.json").read_text())["probes_tuned"]["results"]
    assert [r["id"] for r in per_q] == [str(i) for i in range(5)] and all(len(r["probs"]) == 3 for r in per_q)


def test_forgetting_from_files(tmp_path):
    from posttrain_lab.studies.analysis import MCQ, save_mcqs

    save_mcqs(
        tmp_path / "p.jsonl", [MCQ(f"Item {i}?", ("a", "b", "c", "d"), i % 4, id=str(i)) for i in range(4)]
    )
    chats = [
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "ok"}]}
        for i in range(4)
    ]
    (tmp_path / "ift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    (tmp_path / "text.jsonl").write_text(
        "".join(json.dumps({"text": f"Item {i} is {'abcd'[i % 4]}."}) + "\n" for i in range(4))
    )
    out = tmp_path / "f"
    _run(
        ["analyze", "forgetting", "base=tiny", f"probes={tmp_path / 'p.jsonl'}", "shots=0",
         f"ift_data={tmp_path / 'ift.jsonl'}", f"restore_data={tmp_path / 'text.jsonl'}", "ift.steps=2",
         "ift.batch_size=2", "checkpoints=[2]", "restore.steps=1", "restore.batch_size=2", "control_seeds=1",
         f"out_dir={out}"]
    )  # fmt: skip
    res = json.loads((out / "forgetting.json").read_text())
    assert [c["step"] for c in res["checkpoints"]] == [2]
    assert res["epsilon"] == 1.0  # one control seed: the floor
    # the same checkpoints restored again from the saved run: same scores (deterministic)
    out2 = tmp_path / "f2"
    _run(
        ["analyze", "forgetting", "base=tiny", f"probes={tmp_path / 'p.jsonl'}", "shots=0", f"ift_run={out / 'ift'}",
         f"restore_data={tmp_path / 'text.jsonl'}", "restore.steps=1", "restore.batch_size=2", "control_seeds=1",
         f"out_dir={out2}"]
    )  # fmt: skip
    res2 = json.loads((out2 / "forgetting.json").read_text())
    assert [c["step"] for c in res2["checkpoints"]] == [2]
    for key in ("score_tuned", "score_restored"):
        assert res2["checkpoints"][0][key] == res["checkpoints"][0][key]
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n')
    bad = CliRunner().invoke(
        app,
        ["analyze", "forgetting", "base=tiny", f"probes={tmp_path / 'p.jsonl'}", "shots=0",
         f"ift_data={tmp_path / 'bad.jsonl'}", f"restore_data={tmp_path / 'text.jsonl'}", f"out_dir={out}"],
    )  # fmt: skip
    assert bad.exit_code == 2 and "bad.jsonl: line 1" in bad.output
