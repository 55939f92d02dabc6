"""One micro run through the real call path: posttrain scpg pretrain -> finetune -> eval."""

import json

from typer.testing import CliRunner

from posttrain.cli import app

SYN = [
    "data.synthetic.n_train=24",
    "data.synthetic.n_val=2",
    "data.synthetic.n_test=6",
    "data.synthetic.n_pretrain=24",
    "data.synthetic.few_shot_k=2",
]


def _last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_pretrain_finetune_eval(tmp_path):
    r = CliRunner()
    stage = ["batch_size=4", "micro_batch_size=2", "optimizer.lr=1e-3", "optimizer.warmup_steps=0"]
    res = r.invoke(
        app,
        [
            "scpg", "pretrain", "model.device=cpu", f"out_dir={tmp_path / 'pre'}", "linearize=slash", *SYN,
            *(f"stage{i}.{s}" for i in (1, 2) for s in stage), "stage1.steps=2", "stage1.checkpoint_every=2",
            "stage2.steps=1", "--no-progress",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    pre = _last_json(res.output)
    assert pre["stage1"]["steps"] == 2 and pre["stage2"]["steps"] == 1 and pre["nonterminals_added"] > 5
    assert (tmp_path / "pre" / "stage1" / "checkpoints" / "latest").is_file()  # SFT's checkpoints
    assert not (tmp_path / "pre" / "stage2" / "checkpoints").exists()
    assert (tmp_path / "pre" / "model" / "config.json").is_file()
    assert (tmp_path / "pre" / "stage2" / "metrics.jsonl").is_file()  # SFT's run folder

    res = r.invoke(
        app,
        [
            "scpg", "finetune", f"model.name={tmp_path / 'pre'}", "model.device=cpu", "format=triplet_sentencetree",
            "steps=1", "batch_size=4", f"out_dir={tmp_path / 'ft'}", *SYN, "--no-progress",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    ft = _last_json(res.output)
    assert ft["mode"] == "full_fine_tune" and ft["steps"] == 1 and ft["format"] == "triplet_sentencetree"

    res = r.invoke(
        app,
        [
            "scpg", "eval", f"model.name={tmp_path / 'ft'}", "model.device=cpu", "decode.num_beams=2",
            "decode.max_length=12", *SYN, "--no-progress",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    ev = _last_json(res.output)
    report = json.loads((tmp_path / "ft" / "eval-test" / "eval.json").read_text())
    assert report["format"] == "triplet_sentencetree" and report["decode"]["num_beams"] == 2
    assert set(ev["subsets"]) == {"overall", "hardest", "few_shot"} and ev["subsets"]["overall"]["n"] == 6
    assert "tree_f1" in ev["subsets"]["overall"]
    assert "| overall |" in (tmp_path / "ft" / "eval-test" / "eval.md").read_text()
    assert report["metrics"] == "posttrain"
    res = r.invoke(
        app,
        [
            "scpg", "eval", f"model.name={tmp_path / 'ft'}", "model.device=cpu", "decode.num_beams=2",
            "decode.max_length=12", *SYN, "--no-progress", "metrics=sgcp", f"out={tmp_path / 'ev-sgcp'}",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    sg = json.loads((tmp_path / "ev-sgcp" / "eval.json").read_text())
    assert sg["metrics"] == "sgcp" and "metrics `sgcp`" in (tmp_path / "ev-sgcp" / "eval.md").read_text()
    b = sg["subsets"]["overall"]["bleu4"]
    assert b == round(b, 2)  # multi-bleu prints 2 decimals

    res = r.invoke(app, ["scpg", "finetune", "format=bart", "--no-progress"])
    assert res.exit_code == 2 and "format" in res.output
