"""Faults outside the code: a corrupt or truncated tokenizer, in the cache or in a run directory."""

from __future__ import annotations

import pytest
from training_helpers import bible_pairs, run_cli, train_tiny

from hf_attn.data import get_tokenizer, load_tokenizer
from hf_attn.errors import HfAttnInputError


def _texts():
    pairs = bible_pairs(200)
    return [s for s, _ in pairs] + [t for _, t in pairs]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_corrupt_cached_tokenizer_is_trained_again(tmp_path, damage, capsys):
    tok, path = get_tokenizer(_texts(), vocab_size=300, cache_dir=tmp_path)
    want = tok("Im Anfang war das Wort.").input_ids
    spm = path / "source.spm"
    data = spm.read_bytes()
    spm.write_bytes({"truncate": data[: len(data) // 3], "garbage": b"\x00not a model\xff" * 50, "empty": b""}[damage])
    with pytest.raises(HfAttnInputError, match=r"the tokenizer in .* cannot be read .*restore them"):
        load_tokenizer(path)
    again, path2 = get_tokenizer(_texts(), vocab_size=300, cache_dir=tmp_path)
    assert path2 == path and again("Im Anfang war das Wort.").input_ids == want
    assert "cannot be read; training it again" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing left aside


def test_a_corrupt_run_directory_tokenizer_is_one_line(tmp_path):
    run = train_tiny(tmp_path / "run")
    (run / "target.spm").write_bytes(b"\x08\x01garbage")
    src = tmp_path / "in.txt"
    src.write_text("Im Anfang war das Wort.\n")
    r = run_cli(["translate", str(run), "--input", str(src)])
    errors = [line for line in r.stderr.splitlines() if line.startswith("hf-attn:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1
    assert f"the tokenizer in {str(run)!r} cannot be read" in errors[0]


@pytest.mark.parametrize("where", ["checkpoint", "results"])
def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys, where):
    """ENOSPC injected into the second checkpoint's weights, or into results.json: exit 2, one line naming the
    path, and the complete checkpoint before it untouched."""
    import errno

    import safetensors.torch
    import transformers.modeling_utils

    from hf_attn import io_utils
    from hf_attn.cli import main
    from training_helpers import TINY_ARGS

    out = tmp_path / "run"
    calls = {"n": 0}
    real_save, real_json = transformers.modeling_utils.safe_save_file, io_utils.write_json

    def full_save(tensors, filename, *a, **k):
        calls["n"] += 1
        if where == "checkpoint" and "checkpoint-4" in str(filename):
            raise OSError(errno.ENOSPC, "No space left on device", str(filename))
        return real_save(tensors, filename, *a, **k)

    def full_json(path, *a, **k):
        if where == "results" and str(path).endswith("results.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_json(path, *a, **k)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_save)
    monkeypatch.setattr(safetensors.torch, "save_file", full_save)
    monkeypatch.setattr("hf_attn.training.run.write_json", full_json)
    rc = main(["train", "--preset", "rela-g", *TINY_ARGS, "--max_steps", "6", "--save_steps", "2",
               "--save_total_limit", "3", "--output_dir", str(out), "--cache_dir", str(tmp_path / "tok")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-attn:")]
    assert rc == 2 and len(err) == 1 and "no space left on the device while writing" in err[0]
    assert (str(out / "results.json") if where == "results" else "checkpoint-4") in err[0]
    from hf_attn.training.checkpoints import is_complete

    assert is_complete(out / "checkpoint-2")
    if where == "checkpoint":
        assert not (out / "checkpoint-4").exists()


@pytest.mark.slow
def test_two_matrices_on_one_runs_dir_train_each_run_once(tmp_path):
    """Two `hf-attn reproduce` started together on the same --runs_dir / --output_dir: every run is trained by one
    of them (the other skips it), both finish, and the report is whole."""
    import subprocess
    import sys

    from training_helpers import REPO, TINY_ARGS, offline_env, write_jsonl

    train = write_jsonl(tmp_path / "train.jsonl", bible_pairs(160))
    test = write_jsonl(tmp_path / "test.jsonl", bible_pairs(8, "test"))
    cmd = [sys.executable, "-m", "hf_attn.cli", "reproduce", "--presets", "softmax,rela-g,rela-i", "--pairs", "de-en",
           "--steps", "20", "--seeds", "1", "--output_dir", str(tmp_path / "results"), "--runs_dir",
           str(tmp_path / "runs"), "--sentences", "4", "--bootstrap", "100", "--threads", "1", "--",
           *TINY_ARGS, "--train_file", str(train), "--validation_file", str(test), "--test_file", str(test)]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=offline_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    trained = sum(log.read_text().count("[hf-attn] training ") for log in (tmp_path / "runs").glob("*.log"))
    assert trained == 3, outs
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 3
    assert "being trained by" in outs[0] + outs[1]
    report = (tmp_path / "results" / "REPORT.md").read_text()
    assert report.startswith("# hf-attn reproduction report") and report.count("# hf-attn reproduction report") == 1
