"""`scripts/reproduce_report.sh` is the matrix behind the committed report: every record in results/runs/ is one of
its runs, and each of its runs is recorded or listed as still to run (results/plan.json); every second record, in
results/runs/machine/, is one of the runs it trains again on a second kind of machine, or the record of another of
its runs with the same configuration (`same_run_as`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hf_attn.cli.reproduce import parse_reproduce_args
from hf_attn.reproduce.runner import matrix_of

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"


def script_command_lines(tmp_path: Path) -> list[list[str]]:
    """The `hf-attn` command lines the script runs, read by running it with `hf-attn` replaced by a recorder."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    fake = bin_dir / "hf-attn"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "with open(os.environ['HF_ATTN_CALLS'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HF_ATTN_CALLS": str(log)}
    r = subprocess.run(["bash", str(REPO / "scripts" / "reproduce_report.sh")], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_script_trains_every_recorded_run_and_ends_with_the_report(tmp_path):
    calls = script_command_lines(tmp_path)
    assert all(c[0] == "reproduce" for c in calls)
    *matrices, last = calls
    assert last == ["reproduce", "--report_only", "--output_dir", "results", "--readme", "README.md", "--docs", "docs"]
    names, again = set(), set()
    for argv in matrices:
        options, train_args = parse_reproduce_args(argv[1:])
        assert not options.report_only, argv
        # the second machine's matrix writes its own report; its records are copied to results/runs/machine/
        (names if options.output_dir == "results" else again).update(s.name for s in matrix_of(options, train_args))
    assert again and again <= names, "runs trained again on a second machine that the matrix does not train"
    second = [json.loads(p.read_text()) for p in (RESULTS / "runs" / "machine").glob("*.json")]
    # a second record is a run the script trains again, or (`same_run_as`) the record of another of its runs whose
    # flags give the same configuration (an experiment's arm)
    borrowed = {r["name"]: r["same_run_as"]["record"] for r in second if r.get("same_run_as")}
    assert set(borrowed) <= names and set(borrowed.values()) <= names, "second records borrowed from other runs"
    assert {r["name"] for r in second} - set(borrowed) <= again, "second records of other runs"
    recorded = {p.stem for p in (RESULTS / "runs").glob("*.json")}
    planned = set(json.loads((RESULTS / "plan.json").read_text()))
    assert recorded - names == set(), "records the script would not make"
    assert names - recorded - planned == set(), "runs of the script neither recorded nor listed as still to run"
