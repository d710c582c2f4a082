"""The machine behind each result: every group's table says which machines its runs used, a run recorded again on
another kind of machine (runs/machine/<name>.json) is compared with its first record against the seed spread, and
a group that has a CPU record of every run uses the CPU records alone."""

from __future__ import annotations

import json
import re

import pytest
from reproduce.test_seeds import _degrade, _matrix, _record, figures_built_not_rendered

from hf_attn.errors import HfAttnInputError
from hf_attn.report import report as rep
from hf_attn.report.machines import (device_kind, load_second_records, machine_effect_section, machines_line,
                                     one_kind_per_group)

CPU, GPU = "x86_64 CPU, 1 threads x 1 process(es)", "NVIDIA H200 x1"


def rec(preset, seed, device, bleu=10.0, status="complete"):
    return {"name": f"de-en_600steps_seed{seed}_{preset}", "status": status,
            "spec": {"preset": preset, "source": "de", "target": "en", "steps": 600, "seed": seed, "base": "marian",
                     "train_args": []},
            "results": {"device": device, "bleu": bleu} if status == "complete" else None}


def test_device_kind():
    assert device_kind(rec("softmax", 1, CPU)) == "CPU"
    assert device_kind(rec("softmax", 1, "x86_64 CPU, 2 threads x 1 process(es), malloc keeps freed memory")) == "CPU"
    assert device_kind(rec("softmax", 1, GPU)) == "NVIDIA H200"
    assert device_kind(rec("softmax", 1, None, status="failed")) == "unknown machine"


def test_machines_line_counts_runs_per_machine_and_names_the_runs_of_each_kind():
    one = [rec("softmax", s, CPU) for s in (1, 2)]
    assert machines_line(one) == f"Machine: all 2 runs on {CPU}."
    assert machines_line(one[:1]) == f"Machine: the one run on {CPU}."
    two_cpus = one + [rec("gmm", 1, "x86_64 CPU, 2 threads x 1 process(es)")]
    assert machines_line(two_cpus) == (f"Machines: 2 runs on {CPU}; 1 run on x86_64 CPU, 2 threads x 1 process(es).")
    mixed = one + [rec("gmm", s, GPU) for s in (2, 1)]
    line = machines_line(mixed)
    assert line.startswith(f"Machines: 2 runs on {GPU}; 2 runs on {CPU}. Two kinds of machine (CPU: `softmax` seeds "
                           "1, 2; NVIDIA H200: `gmm` seeds 1, 2)")
    assert line.endswith("([Machine effect](#machine-effect)).")
    assert "(results/REPORT.md#machine-effect)" in machines_line(mixed, "results/REPORT.md#machine-effect")


def test_a_group_uses_one_kind_where_that_kind_has_every_run():
    first = [rec("softmax", 1, CPU), rec("softmax", 2, GPU, 12.0), rec("gmm", 1, CPU), rec("gmm", 2, GPU, 9.0)]
    # no second records: the first ones, mixed
    chosen, others = one_kind_per_group(first, [])
    assert chosen == first and others == []
    # a CPU record of one GPU run only: still mixed, the CPU record is compared, not used
    half = [rec("softmax", 2, CPU, 11.0)]
    chosen, others = one_kind_per_group(first, half)
    assert chosen == first and others == half
    # CPU records of both GPU runs: the group is all CPU, the GPU records are the ones left out
    second = half + [rec("gmm", 2, CPU, 8.5)]
    chosen, others = one_kind_per_group(first, second)
    assert [device_kind(r) for r in chosen] == ["CPU"] * 4 and [r["name"] for r in chosen] == [r["name"] for r in first]
    assert {id(r) for r in others} == {id(first[1]), id(first[3])}
    # a group already of one kind keeps its first records, and its GPU seconds are compared
    cpu_only = [rec("softmax", 1, CPU), rec("softmax", 2, CPU)]
    gpu_second = [rec("softmax", 2, GPU, 13.0)]
    assert one_kind_per_group(cpu_only, gpu_second) == (cpu_only, gpu_second)


@pytest.mark.parametrize("second, message", [
    ([rec("gmm", 5, CPU)], r"runs/machine/de-en_600steps_seed5_gmm.json has no runs/de-en_600steps_seed5_gmm.json"),
    ([rec("softmax", 1, "x86_64 CPU, 2 threads x 1 process(es)")], "both trained on CPU")])
def test_a_second_record_must_be_of_a_recorded_run_on_another_kind(second, message):
    with pytest.raises(HfAttnInputError, match=message):
        one_kind_per_group([rec("softmax", 1, CPU)], second)


def test_machine_effect_sets_each_difference_against_the_seed_spread():
    first = [rec("softmax", 1, CPU, 10.0), rec("softmax", 2, GPU, 12.0), rec("softmax", 3, CPU, 11.0)]
    chosen, others = one_kind_per_group(first, [rec("softmax", 2, CPU, 11.5)])
    md, rows = machine_effect_section(chosen, others)
    text = "\n".join(md)
    assert "| de->en, 600 steps, marian | softmax | 2 | 11.5 (CPU) | 12.0 (NVIDIA H200) | +0.5 | 0.8 | CPU |" in text
    assert rows == [{"name": "de-en_600steps_seed2_softmax", "group": "de->en, 600 steps, marian", "preset": "softmax",
                     "seed": 2, "bleu": {"CPU": 11.5, "NVIDIA H200": 12.0}, "difference": 0.5, "seed_sd": 0.76,
                     "used": "CPU"}]
    assert "Mean absolute difference between the two machines: 0.5 BLEU over 1 run; the same presets' standard " \
           "deviation across seeds: 0.8 to 0.8; 1 of 1 differences are within their preset's seed sd." in text
    md, rows = machine_effect_section(first, [])
    assert rows == [] and "No run has a second record yet" in "\n".join(md)


def test_a_second_record_from_an_experiment_arm_says_which_record_it_is():
    first = [rec("softmax", s, CPU, 10.0 + s) for s in (1, 2, 3)]
    arm = dict(rec("softmax", 2, GPU, 14.0), same_run_as={"record": "de-en_600steps_seed2_xabc_softmax",
                                                          "flags": ["--label_smoothing_factor", "0.1"],
                                                          "why": "0.1 is the default"})
    md, rows = machine_effect_section(*one_kind_per_group(first, [arm]))
    text = "\n".join(md)
    assert rows[0]["difference"] == 2.0 and "0 of 1 differences are within" in text
    assert ("- `de-en_600steps_seed2_softmax` on NVIDIA H200: the record of `de-en_600steps_seed2_xabc_softmax` "
            "(--label_smoothing_factor 0.1): 0.1 is the default.") in text


def _set_device(path, device):
    data = json.loads(path.read_text())
    data["results"]["device"] = device
    path.write_text(json.dumps(data))


def test_report_states_machines_and_switches_a_complete_group_to_the_cpu(tmp_path, monkeypatch):
    out = tmp_path / "results"
    _matrix(out, write=True)  # softmax seeds 1, 2, 3, 7 and rela-g 1, 2, 3 on the CPU; one flagged rela-g run
    for seed in (2, 3):
        _set_device(out / "runs" / f"de-en_600steps_seed{seed}_softmax.json", GPU)
    text = rep.write_report(out, 50).read_text()
    across = text.split("## Across seeds: de->en, 600 steps, marian\n", 1)[1]
    assert re.search(r"Machines: 2 runs on NVIDIA H200 x1; 5 runs on .*CPU.*`softmax` seeds 2, 3\)", across)
    assert "## Machine effect" in text and "No run has a second record yet" in text
    softmax_gpu = next(x for x in across.splitlines() if x.startswith("| softmax |"))

    # the CPU records of the two GPU runs, with other translations
    (out / "runs" / "machine").mkdir()
    for seed in (2, 3):
        r = _record(out, "softmax", seed, _degrade(0.3, seed + 100))
        (out / "runs" / "machine" / f"{r['name']}.json").write_text(json.dumps({k: v for k, v in r.items()
                                                                                 if k != "hypotheses"}))
        (out / "runs" / "machine" / f"{r['name']}.hyp.txt").write_text("\n".join(r["hypotheses"]) + "\n")
    assert len(load_second_records(out)) == 2
    figures_built_not_rendered(monkeypatch)  # the first report's figures again, with the CPU scores: its text is read
    text = rep.write_report(out, 50).read_text()
    across = text.split("## Across seeds: de->en, 600 steps, marian\n", 1)[1]
    assert "Machine: all 7 runs on" in across.split("##", 1)[0]
    assert next(x for x in across.splitlines() if x.startswith("| softmax |")) != softmax_gpu  # the CPU scores
    effect = text.split("## Machine effect", 1)[1].split("\n## ", 1)[0]
    assert effect.count("| de->en, 600 steps, marian | softmax |") == 2 and effect.count("| CPU |") == 2
    machines = text.split("## Machines\n", 1)[1]
    assert "de-en_600steps_seed2_softmax (the record the tables leave out)" in machines
    summary = json.loads((out / "report.json").read_text())
    assert [r["seed"] for r in summary["machine_effect"]] == [2, 3]
