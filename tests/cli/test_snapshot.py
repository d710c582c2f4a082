"""hf_attn/cli/snapshot.json: `hf-attn presets` and `hf-attn train`'s unknown flags without loading torch (the
module sets are checked in test_habits.py). The committed copy is current, says what the registry and the parser
say, and a copy that does not match the code is never used."""

from __future__ import annotations

import json

import pytest

from hf_attn.cli import main, presets, presets_text, snapshot
from hf_attn.cli.flags import unknown_flags_line


def test_the_committed_snapshot_is_current_and_says_what_the_code_says():
    fix = "run `python scripts/write_cli_snapshot.py` and commit hf_attn/cli/snapshot.json"
    written = snapshot.written_with_other_transformers()
    if written:  # another transformers of pyproject's range: the commands answer from the registry
        pytest.skip(f"the snapshot was written with transformers {written} and this environment has "
                    f"{snapshot.transformers_version()}: its key (which holds transformers' version) cannot match here")
    assert snapshot.current_snapshot() is not None, f"the snapshot's key differs from the code's: {fix}"
    assert json.loads(snapshot.SNAPSHOT.read_text()) == snapshot.build_snapshot(), fix


def test_a_snapshot_that_does_not_match_the_code_is_not_used(tmp_path, monkeypatch, capsys):
    stale = json.loads(snapshot.SNAPSHOT.read_text())
    stale.update(key="0" * 64, list="a stale list", train_flags={"marian": ["--output_dir"], "bart": []})
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(stale))
    monkeypatch.setattr(snapshot, "SNAPSHOT", path)
    assert snapshot.current_snapshot() is None
    assert presets.run([]) == 0
    assert capsys.readouterr().out.strip() == presets_text.presets_texts()["list"]
    snapshot.unknown_train_flags(["--max_steps", "3"])  # not refused from the stale flag list


@pytest.mark.parametrize("args", [["--no_such_flag"], ["--lerning_rate", "1", "--preset", "rela-g"],
                                  ["--base", "bart", "--d_modl", "8", "--xyz=1"]])
def test_unknown_flags_get_the_same_line_with_and_without_the_snapshot(args, monkeypatch, capsys):
    assert main(["train", *args]) == 2
    fast = capsys.readouterr().err.strip()
    monkeypatch.setattr(snapshot, "current_snapshot", lambda: None)
    assert main(["train", *args, "--output_dir", "unused"]) == 2
    slow = capsys.readouterr().err.strip()
    assert fast == slow and fast.count("\n") == 0 and "`hf-attn train --help` lists every flag" in fast, (fast, slow)


def test_the_unknown_flags_line():
    options = ["-h", "--help", "--learning_rate", "--learning-rate", "--max_steps", "--max-steps", "--d_model"]
    assert unknown_flags_line(["--max_step", "3", "--learning-rate=1", "--", "-2,2"], options) is None  # abbreviation
    line = unknown_flags_line(["--lerning_rate", "1", "--zzz", "--zzz"], options)
    assert line == ("hf-attn train has no flags --lerning_rate (did you mean --learning_rate?), --zzz; "
                    "`hf-attn train --help` lists every flag")
