"""The LR-annealing study: end to end on a tiny budget, in one process and
as 2-rank DDP jobs; the aggregation and the verdict on known inputs."""
import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "workloads"))
import lr_study  # noqa: E402


def test_aggregation_and_verdict_on_known_inputs():
    cells = [{"schedule": s, "global_batch": 32, "seed": k, "steps": 10, "epochs": 1, "final_top1": v,
              "best_top1": v + 1, "best_epoch": 1}
             for s, vals in (("cosine", [90.0, 92.0, 94.0]), ("step", [80.0, 80.5, 81.0])) for k, v in enumerate(vals)]
    agg = {a["schedule"]: a for a in lr_study.aggregate(cells)}
    assert agg["cosine"]["top1_mean"] == pytest.approx(92.0)
    assert agg["cosine"]["top1_std"] == pytest.approx(2.0)            # sample std (n - 1)
    assert agg["step"]["top1_std"] == pytest.approx(0.5)
    assert agg["cosine"]["best_top1_mean"] == pytest.approx(93.0) and agg["cosine"]["seeds"] == 3
    (v,) = lr_study.verdicts(list(agg.values()))
    assert v["best"] == "cosine" and v["runner_up"] == "step" and v["lead"] == pytest.approx(11.5)
    assert v["se"] == pytest.approx(math.sqrt(4 / 3 + 0.25 / 3)) and v["significant"]
    close = [dict(c, final_top1=c["final_top1"] + (10.5 if c["schedule"] == "step" else 0)) for c in cells]
    (v,) = lr_study.verdicts(lr_study.aggregate(close))
    assert v["best"] == "cosine" and not v["significant"]           # lead 1.0 < 2 SE (2.35)


def test_budget_gives_the_largest_batch_its_steps():
    assert lr_study.epochs_for(150, 512, 1442) == 75                 # 2 whole batches per epoch
    assert lr_study.epochs_for(150, 128, 1442) == 14
    with pytest.raises(SystemExit):
        lr_study.epochs_for(150, 4096, 1442)


@pytest.mark.slow
def test_study_end_to_end_tiny(tmp_path):
    out = str(tmp_path / "lr")
    assert lr_study.main(["--batch-sizes", "32,64", "--seeds", "1", "--epochs", "2", "-o", out]) == 0
    doc = json.load(open(out + ".json"))
    assert len(doc["cells"]) == 6 and doc["meta"]["epochs"] == 2
    c = {(x["schedule"], x["global_batch"]): x for x in doc["cells"]}
    assert c[("cosine", 32)]["steps"] == 2 * (1442 // 32) and c[("cosine", 64)]["steps"] == 2 * (1442 // 64)
    assert all(x["final_top1"] > 50 for x in doc["cells"])          # it learns (chance: 10 %)
    assert os.path.getsize(out + ".html") > 1000 and "top-1" in open(out + ".md").read()
    assert len(open(out + ".csv").read().splitlines()) == 1 + 6


@pytest.mark.slow
def test_a_cell_runs_as_a_two_rank_ddp_job():
    cfg = {"schedule": "cosine", "global_batch": 64, "seed": 0, "epochs": 2, "lr": 0.2, "warmup_epochs": 0.5}
    r = lr_study.run_cell(cfg, nproc=2)
    assert r["steps"] == 2 * (1442 // 64) and r["final_top1"] > 50
