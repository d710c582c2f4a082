"""The retrofit matrix of `hf-attn reproduce --retrofit` (`reproduce/retrofit.py`): the committed pre-registration,
its runs and their order, a child's step 0 and its record (a tiny parent and child trained in-process), and the
report's Retrofit section (synthetic translations; no training)."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path

import pytest
from reproduce.test_seeds import REAL, REFS, _degrade, figures_built_not_rendered

from hf_attn.errors import HfAttnInputError
from hf_attn.plans.matrix import RunSpec
from hf_attn.plans.retrofit import STEP0_HYPS, load_retrofit, parent_ready, retrofit_specs, step_zero_dir
from hf_attn.report import report as rep
from hf_attn.report.records import SeedComparisons
from hf_attn.report.records import test_data_name as split_name  # not a test: pytest would collect the name
from hf_attn.report.retrofit_report import BLOCK_END, BLOCK_START, retrofit_section, retrofit_sentence, \
    update_python_page
from hf_attn.reproduce.run_extras import step_zero
from hf_attn.reproduce.runner import _next_ready, run_one

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "retrofit.json"
TINY = Path(__file__).with_name("retrofit_tiny.json")


def test_the_committed_file_preregisters_parents_children_and_a_compute_matched_scratch_group():
    cfg = load_retrofit(COMMITTED)
    specs = retrofit_specs(cfg)
    parents, children = specs[:3], specs[3:]
    assert [s.name for s in parents] == [f"de-en_1200steps_seed{s}_softmax" for s in (42, 43, 44)]
    assert len(children) == 18 and {s.parent for s in children} == {p.name for p in parents}
    assert [s.preset for s in children[:6]] == ["softmax", "rela-g", "gmm", "reluformer", "ran-d", "calibration-gate"]
    assert all(c.seed == int(c.parent.split("seed")[1].split("_")[0]) and c.steps == 600 for c in children)
    assert children[1].name.startswith("de-en_1200steps_seed42_softmax+600steps_x") and children[1].name.endswith("_rela-g")
    argv = children[1].train_argv(Path("/runs") / children[1].name, False)
    assert argv[argv.index("--init_from") + 1] == f"/runs/{children[1].name}.step0"
    # parent + child = the committed from-scratch group's budget, for every child preset and seed
    for preset in cfg["children"]["presets"] + [cfg["children"]["control"]]:
        for seed in cfg["seeds"]:
            assert (ROOT / "results" / "runs" / f"de-en_1800steps_seed{seed}_{preset}.json").is_file(), (preset, seed)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("parent"), "needs the keys"),
    (lambda c: c["children"].update(steps=0), "positive integer \"steps\""),
    (lambda c: c["children"]["train_args"].extend(["--init_from", "x"]), "must not give --init_from"),
    (lambda c: c["children"].update(presets=["no-such-preset"]), "no-such-preset"),
    (lambda c: c["rules"][0].update(a="rela-g@nowhere"), "PRESET@child or PRESET@scratch"),
    (lambda c: c.update(advice=["swap"]), '"advice" must map each paper to a sentence'),
    (lambda c: c.update(advice={"ReLA": ""}), '"advice" must map each paper to a sentence'),
])
def test_a_bad_file_is_one_line(tmp_path, edit, message):
    cfg = json.loads(COMMITTED.read_text())
    edit(cfg)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(HfAttnInputError, match=message) as e:
        load_retrofit(path)
    assert "\n" not in str(e.value)


class _Bar:
    def update(self, n):
        pass


def _recorded(out: Path, name: str, status="complete"):
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "runs" / f"{name}.json").write_text(json.dumps({"status": status}))


def test_a_child_waits_for_its_parent_and_a_failed_parent_fails_its_children(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    specs = retrofit_specs(load_retrofit(COMMITTED))
    parent, child, other = specs[0], specs[3], specs[9]  # seed 42's parent, its control; a child of seed 43
    assert parent_ready(parent, runs, out) == "ready" and parent_ready(child, runs, out) is None
    queue, failed = [child, other], []
    assert _next_ready(queue, runs, out, failed, _Bar(), idle=False) is None and queue == [child, other]
    _recorded(out, parent.name)  # recorded, but its model is not in runs_dir: the child cannot start
    assert parent_ready(child, runs, out) == "failed"
    (runs / parent.name).mkdir(parents=True)
    (runs / parent.name / "results.json").write_text("{}")
    assert _next_ready(queue, runs, out, failed, _Bar(), idle=False) == child and queue == [other]
    _recorded(out, other.parent, status="failed")
    assert _next_ready(queue, runs, out, failed, _Bar(), idle=True) is None and failed == [other.name]
    queue = [specs[15]]  # seed 44's control, its parent never recorded and nothing running: dropped with a line
    assert _next_ready(queue, runs, out, failed, _Bar(), idle=True) is None and queue == []
    assert f"{specs[15].name}: waits for its parent {specs[2].name}" in capsys.readouterr().out


def test_a_child_starts_from_its_parent_swapped_scored_at_step_0(tmp_path, one_thread, monkeypatch):
    """A tiny parent and its rela-g child, in-process: the step-0 model is saved and scored once, the child trains
    from it, its record holds step 0 and its validation-BLEU curve starts at step 0."""
    monkeypatch.setenv("HF_ATTN_CACHE", str(tmp_path / "cache"))
    specs = retrofit_specs(load_retrofit(TINY))
    parent, child = specs[0], specs[2]
    assert child.preset == "rela-g" and child.parent == parent.name
    runs, out = tmp_path / "runs", tmp_path / "out"
    run_one(parent, runs, out, sentences=4)
    record = run_one(child, runs, out, sentences=4)
    step0 = record["retrofit"]["step0"]
    assert record["retrofit"]["parent"] == parent.name and set(step0) >= {"bleu", "chrf", "bleu_signature"}
    hyps = (out / "runs" / f"{child.name}{STEP0_HYPS}").read_text().splitlines()
    assert len(hyps) == 8  # the child's test split (--max_predict_samples 8)
    assert record["results"]["init_from"] == str(step_zero_dir(child, runs))
    assert json.loads((step_zero_dir(child, runs) / "config.json").read_text())["preset"] == "rela-g"
    curve = record["results"]["curves"]["validation_bleu"]["curve"]
    assert [p[0] for p in curve] == [0, 2, 4]  # step 0: the swapped parent before any update
    before = (step_zero_dir(child, runs) / "step0.json").stat().st_mtime_ns
    assert step_zero(child, runs) == (step0, hyps)
    assert (step_zero_dir(child, runs) / "step0.json").stat().st_mtime_ns == before  # done once


def _record(out: Path, spec: RunSpec, hyps: list[str], step0: list[str] | None = None, curve=None) -> dict:
    import sacrebleu

    rec = copy.deepcopy(json.loads(REAL.read_text()))
    rec.update(name=spec.name, setup=spec.setup, spec=asdict(spec) | {"train_args": list(spec.train_args)})
    rec["results"].update(bleu=round(sacrebleu.corpus_bleu(hyps, [REFS]).score, 2),
                          chrf=round(sacrebleu.corpus_chrf(hyps, [REFS]).score, 2))
    rec["results"]["curves"]["validation_bleu"] = {"curve": curve or []}
    (out / "references").mkdir(parents=True, exist_ok=True)
    for suffix in (".txt", ".src.txt"):
        (out / "references" / f"{split_name(rec)}{suffix}").write_text("\n".join(REFS) + "\n")
    (out / "runs").mkdir(exist_ok=True)
    if step0 is not None:
        rec["retrofit"] = {"parent": spec.parent, "step0": {"bleu": round(sacrebleu.corpus_bleu(step0, [REFS]).score, 2),
                                                            "chrf": 0.0}}
        (out / "runs" / f"{spec.name}{STEP0_HYPS}").write_text("\n".join(step0) + "\n")
    (out / "runs" / f"{spec.name}.json").write_text(json.dumps(rec))
    (out / "runs" / f"{spec.name}.hyp.txt").write_text("\n".join(hyps) + "\n")
    return rec | {"hypotheses": hyps}


def test_the_report_section_judges_the_rules_and_keeps_children_out_of_the_groups(tmp_path, monkeypatch):
    cfg = json.loads(COMMITTED.read_text())
    cfg.update(seeds=[1, 2, 3])
    cfg["children"]["presets"] = ["rela-g"]
    out = tmp_path / "results"
    out.mkdir()
    (out / "retrofit.json").write_text(json.dumps(cfg))
    specs = retrofit_specs(load_retrofit(out / "retrofit.json"))
    records = []
    for s in specs:
        if not s.parent:  # parents: good
            records.append(_record(out, s, _degrade(0.1, s.seed)))
        elif s.preset == "softmax":  # the control: as good, its step 0 is the parent itself
            records.append(_record(out, s, _degrade(0.1, s.seed + 10), _degrade(0.1, s.seed), [[0, 20.0], [600, 22.0]]))
        else:  # rela-g: ruined by the swap, much worse than the control after fine-tuning
            records.append(_record(out, s, _degrade(0.5, s.seed + 20), _degrade(0.9, s.seed), [[0, 1.0], [600, 9.0]]))
    for seed in (1, 2, 3):  # rela-g from scratch at 1,800 steps: worse still
        records.append(_record(out, RunSpec("rela-g", "de", "en", 1800, seed), _degrade(0.7, seed + 30)))
    md, data = retrofit_section(out, records, SeedComparisons(out, 200))
    text = "\n".join(md)
    row = next(r for r in data["rows"] if r["preset"] == "rela-g")
    assert row["step0_vs_parent"]["ci"][1] < 0 and row["vs_control"]["ci"][1] < 0 and row["vs_scratch"]["ci"][0] > 0
    verdicts = {r["claim"].split(":")[0]: r["verdict"] for r in data["rules"]}
    assert verdicts == {"rela-g retrofits": "not met", "rela-g beats scratch": "met"}
    assert "| `softmax` | 1, 2, 3 |" in text and "(control)" in text and (out / "plots" / "retrofit.png").is_file()
    sentence = retrofit_sentence(data, "REPORT.md#retrofit")  # the README's and docs/python.md's one sentence
    assert sentence.endswith("fine-tuned for 600 steps, `rela-g` ends below the control and `rela-g` ends above the "
                             "same preset trained from scratch for 1,800 steps.")
    assert "[the report's section](REPORT.md#retrofit)" in sentence
    assert retrofit_sentence({**data, "rules": [{**data["rules"][0], "verdict": "not enough seeds"}]}, "x") is None
    page = tmp_path / "python.md"
    page.write_text(f"# Python\n{BLOCK_START}\nold\n{BLOCK_END}\ntail\n")
    update_python_page(tmp_path, {**data, "advice": {"ReLA": "fine-tune longer."}})
    command = ("hf-attn train --init_from DIR --max_steps 600 --learning_rate 5e-4 --warmup_steps 100 "
               "--lr_scheduler_kwargs '{\"timescale\": 1200}' --eval_bleu_every 100 --eval_bleu_sentences 200")
    assert page.read_text() == (f"# Python\n{BLOCK_START}\n\n{sentence.replace('REPORT.md', '../results/REPORT.md')}"
                                f"\n\n- **ReLA**: fine-tune longer.\n\nThe fine-tuning measured there, for a model DIR "
                                f"that `hf-attn convert` swapped: `{command}`.\n\n{BLOCK_END}\ntail\n")
    # the whole report, for its text: its figures are the section's above and the per-seed plots of the seeds tests
    figures_built_not_rendered(monkeypatch)
    rep.write_report(out, n_samples=200)
    report = (out / "REPORT.md").read_text()
    assert "## Retrofit" in report and "[Retrofit](#retrofit)" in report
    assert "+600steps" not in report.split("## Retrofit")[0] and "Across seeds: de->en, 600 steps" not in report
