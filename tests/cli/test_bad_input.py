"""The CLI under bad input: every flag checked before any work, a diverged run fails, incomplete checkpoints are skipped,
one run per output directory, and translate/evaluate/push/reproduce give one line for bad input."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from hf_attn.cli import main
from training_helpers import TINY_ARGS

pytestmark = pytest.mark.usefixtures("one_thread")


def _one_line(capsys, progress=False) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    if progress:  # a run that got as far as training also printed progress bars (datasets' map)
        err = [x for x in err if x.startswith("hf-attn")]
    assert len(err) == 1 and err[0].startswith("hf-attn: error: "), err
    return err[0]


# every module that binds these functions at import (`from ..data import load_corpus`): patched where it is used
WORK = {"load_corpus": ("hf_attn.data", "hf_attn.data.corpus", "hf_attn.training.run", "hf_attn.rundir",
                        "hf_attn.report.records"),
        "translate_texts": ("hf_attn.generation", "hf_attn.training.run", "hf_attn.cli.translate",
                            "hf_attn.analysis.common", "hf_attn.analysis.figures", "hf_attn.analysis.viewer")}


@pytest.fixture
def no_work(monkeypatch):
    """Loading data, training a tokenizer or translating is work: a flag error must come before it."""
    def boom(*a, **k):
        raise AssertionError("work started before the flags were checked")

    # all imported before any is patched: a module first imported under the patch would keep `boom` for good
    loaded = {name: [importlib.import_module(m) for m in modules] for name, modules in WORK.items()}
    for name, modules in loaded.items():
        for module in modules:
            monkeypatch.setattr(module, name, boom)


@pytest.mark.parametrize("flags, message", [
    (["--learning_rate", "-1"], r"--learning_rate -1.0 must be a finite number > 0"),
    (["--learning_rate", "nan"], r"--learning_rate nan must be a finite number > 0"),
    (["--per_device_train_batch_size", "0"], r"--per_device_train_batch_size 0 must be an integer >= 1"),
    (["--per_device_eval_batch_size", "0"], r"--per_device_eval_batch_size 0 must be an integer >= 1"),
    (["--gradient_accumulation_steps", "0"], r"--gradient_accumulation_steps 0 must be an integer >= 1"),
    (["--encoder_attention_heads", "3"], r"--encoder_attention_heads 3 does not divide --d_model 32"),
    (["--dropout", "1.5"], r"--dropout 1.5 must be in \[0, 1\)"),
    (["--attention_dropout", "-0.1"], r"--attention_dropout -0.1 must be in \[0, 1\)"),
    (["--num_beams", "0"], r"--num_beams 0 must be an integer >= 1"),
    (["--max_steps", "0"], r"--max_steps 0 must be an integer >= 1, or -1 \(with --num_train_epochs or --minutes\)"),
    (["--max_length_ratio", "-1"], r"--max_length_ratio -1.0 must be a finite number >= 1, or 0 \(keep all\)"),
    (["--max_source_length", "1"], r"--max_source_length 1 must be an integer >= 2"),
    (["--label_smoothing_factor", "1"], r"--label_smoothing_factor 1.0 must be in \[0, 1\)"),
    (["--vocab_size", "5"], r"--vocab_size 5 must be an integer >= 16"),
    (["--generation_max_new_tokens", "0"], r"--generation_max_new_tokens 0 must be an integer >= 1"),
    (["--minutes", "-1"], r"--minutes -1.0 must be a finite number >= 0"),
    (["--push_to_hub", "true"], r"--push_to_hub needs --hub_model_id user/name"),
    # a dict-valued flag given something that is not a JSON object (issue 53, item 6: it was a TypeError traceback
    # from the scheduler's **kwargs, or json's error naming neither the flag nor the value)
    (["--lr_scheduler_kwargs", "ü∂ƒ"], r"^hf-attn: error: --lr_scheduler_kwargs ü∂ƒ is not a JSON object: give the "
                                       r"keyword arguments as one, in single quotes, e.g. --lr_scheduler_kwargs "
                                       r"'\{\"timescale\": 4000\}'$"),
    (["--lr_scheduler_kwargs", "[1, 2]"], r"--lr_scheduler_kwargs \[1, 2\] is not a JSON object: give"),
    (["--activation_checkpointing_kwargs", "7"], r"--activation_checkpointing_kwargs 7 is not a JSON object: give"),
    (["--lr_scheduler_kwargs", '{"timescale": 4'], r"^hf-attn: error: --lr_scheduler_kwargs \{\"timescale\": 4 is not "
                                                   r"a JSON object \(Expecting ',' delimiter at character 15\); give"),
    (["--fsdp_config", "{fsdp"], r"--fsdp_config \{fsdp is not a JSON object \(Expecting property name"),
    (["--cache_dir", "{file}/cache"], r"--cache_dir .* is not a writable directory"),
])
def test_bad_flags_fail_before_any_work(tmp_path, capsys, no_work, flags, message):
    (tmp_path / "file").write_text("x")
    flags = [f.replace("{file}", str(tmp_path / "file")) for f in flags]
    assert main(["train", *TINY_ARGS, "--max_steps", "2", "--output_dir", str(tmp_path / "out"), *flags]) == 2
    assert re.search(message, _one_line(capsys))


def test_read_only_cache_from_the_environment(tmp_path, capsys, no_work, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("HF_ATTN_CACHE", str(tmp_path / "file" / "cache"))
    assert main(["train", *TINY_ARGS, "--max_steps", "2", "--output_dir", str(tmp_path / "out")]) == 2
    assert re.search(r"\$HF_ATTN_CACHE .* is not a writable directory", _one_line(capsys))


@pytest.mark.slow
def test_diverged_run_fails(tmp_path, cache, capsys):
    out = tmp_path / "out"
    assert main(["train", *TINY_ARGS, "--learning_rate", "1e6", "--warmup_steps", "0", "--max_steps", "4",
                 "--logging_steps", "25", "--max_grad_norm", "0", "--cache_dir", str(cache),
                 "--output_dir", str(out)]) == 2
    line = _one_line(capsys, progress=True)
    assert re.search(r"training diverged: loss (nan|inf|-inf) at step \d of 4; lower --learning_rate \(now 1000000.0\)", line)
    assert not (out / "results.json").exists() and not (out / ".hf_attn.lock").exists()


@pytest.mark.slow
def test_results_json_is_strict(trained):
    json.loads((trained / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
    assert not (trained / ".hf_attn.lock").exists()  # released at the end of the run


@pytest.mark.slow
def test_resume_skips_an_incomplete_checkpoint(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    shutil.copytree(run / "checkpoint-6", run / "checkpoint-9")
    (run / "checkpoint-9" / "model.safetensors").unlink()  # killed while saving (an older version's layout)
    assert main(["train", *TINY_ARGS, "--max_steps", "6", "--output_dir", str(run)]) == 2
    assert "already holds checkpoint-6 (skipped incomplete checkpoint-9); pass --resume" in _one_line(capsys)
    assert main(["train", *TINY_ARGS, "--max_steps", "6", "--output_dir", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "skipping incomplete checkpoint-9" in out and f"resuming from {run / 'checkpoint-6'}" in out


@pytest.mark.slow
def test_a_second_run_in_the_same_directory_is_refused(tmp_path, capsys, no_work):
    out = tmp_path / "out"
    out.mkdir()
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".hf_attn.lock").write_text(json.dumps({"pid": first.pid, "host": socket.gethostname()}))
        assert main(["train", *TINY_ARGS, "--max_steps", "2", "--output_dir", str(out)]) == 2
    finally:
        first.kill()
        first.wait()
    assert f"is in use by process {first.pid}" in _one_line(capsys)


# ---------------------------------------------------------------------------------------- translate / evaluate
@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["translate", "evaluate"])
@pytest.mark.parametrize("flags, message", [
    (["--batch_size", "0"], r"--batch_size 0 must be an integer >= 1"),
    (["--num_beams", "0"], r"--num_beams 0 must be an integer >= 1"),
    (["--length_penalty", "nan"], r"--length_penalty nan must be a finite number"),
])
def test_translate_evaluate_flags(trained, capsys, no_work, cmd, flags, message):
    assert main([cmd, str(trained), *flags]) == 2
    assert re.search(message, _one_line(capsys))


@pytest.mark.slow
def test_translate_unwritable_output_fails_before_translating(trained, tmp_path, capsys, no_work):
    (tmp_path / "in.txt").write_text("Im Anfang war das Wort.\n")
    for bad in (tmp_path, tmp_path / "missing" / "out.txt"):
        assert main(["translate", str(trained), "--input", str(tmp_path / "in.txt"), "--output", str(bad)]) == 2
        assert re.search(r"--output .* (is a directory|cannot be written)", _one_line(capsys))


@pytest.mark.slow
def test_translate_non_utf8_input(trained, tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes(b"gut\n" + "Straße".encode("latin-1") + b"\n")
    assert main(["translate", str(trained), "--input", str(tmp_path / "in.txt")]) == 2
    assert re.search(r"--input '.*in.txt' line 2 is not UTF-8", _one_line(capsys))


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["evaluate", "translate", "analyze"])
def test_broken_model_directories(trained, tmp_path, capsys, cmd):
    only_config = tmp_path / "only_config"
    only_config.mkdir()
    shutil.copy(trained / "config.json", only_config)
    truncated = tmp_path / "truncated"
    shutil.copytree(trained, truncated, ignore=shutil.ignore_patterns("checkpoint-*"))
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    for d, why in ((only_config, "no model weights"), (truncated, "truncated or unreadable")):
        assert main([cmd, str(d)]) == 2
        assert re.search(rf"'{re.escape(str(d))}': (model weights )?{why}", _one_line(capsys))


@pytest.mark.slow
def test_push_with_a_broken_config(trained, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(trained, d, ignore=shutil.ignore_patterns("checkpoint-*"))
    (d / "config.json").write_text("{not json")
    assert main(["push", str(d), "me/model"]) == 2
    assert "config.json is not valid JSON" in _one_line(capsys)


def test_reproduce_checks_the_training_flags_first(tmp_path, capsys, monkeypatch):
    from hf_attn.reproduce import runner

    monkeypatch.setattr(runner, "run_matrix", lambda *a, **k: pytest.fail("runs started"))
    assert main(["reproduce", "--output_dir", str(tmp_path / "r"), "--runs_dir", str(tmp_path / "runs"),
                 "--", "--learning_rate", "-1"]) == 2
    assert "--learning_rate -1.0 must be a finite number > 0" in _one_line(capsys)
    assert main(["reproduce", "--seeds", "-1", "--output_dir", str(tmp_path / "r")]) == 2
    assert "--seeds -1: need seeds in [0, 4294967295]" in _one_line(capsys)
    os.environ.pop("HF_ATTN_CACHE", None)


def test_push_leaves_out_a_killed_save(tmp_path):
    from huggingface_hub.utils import filter_repo_objects

    from hf_attn.training.hub import IGNORE_PATTERNS, UPLOAD_PATTERNS

    files = ["config.json", ".tmp-checkpoint/checkpoint-3/config.json", ".tmp-checkpoint/checkpoint-3/model.safetensors",
             ".hf_attn.lock", "results.json.tmp"]
    assert list(filter_repo_objects(files, allow_patterns=UPLOAD_PATTERNS, ignore_patterns=IGNORE_PATTERNS)) == ["config.json"]


@pytest.mark.parametrize("flags, message", [
    (["--generation_num_beams", "0"], r"--generation_num_beams 0 must be an integer >= 1"),
])
def test_more_bad_flags(tmp_path, capsys, no_work, flags, message):
    assert main(["train", *TINY_ARGS, "--max_steps", "2", "--output_dir", str(tmp_path / "out"), *flags]) == 2
    assert re.search(message, _one_line(capsys))


KILL_DURING_SAVE = """
import os, signal, sys
from hf_attn.training.trainer import HfAttnSeq2SeqTrainer
save = HfAttnSeq2SeqTrainer._save_rng_state
def killed(self, output_dir):
    if self.state.global_step == 4:
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 while checkpoint-4 is being written
    return save(self, output_dir)
HfAttnSeq2SeqTrainer._save_rng_state = killed
from hf_attn.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_kill_9_during_a_save(tmp_path, cache, capsys):
    from training_helpers import offline_env

    out = tmp_path / "run"
    args = ["train", *TINY_ARGS, "--max_steps", "6", "--save_steps", "2", "--cache_dir", str(cache),
            "--output_dir", str(out)]
    p = subprocess.run([sys.executable, "-c", KILL_DURING_SAVE, *args], env=offline_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    assert not (out / "checkpoint-4").exists() and (out / "checkpoint-2" / "model.safetensors").is_file()
    assert (out / ".hf_attn.lock").is_file()  # left by the killed process: stale
    assert main(args) == 2
    cap = capsys.readouterr()
    assert "removing the stale lock" in cap.out and "process" in cap.out
    assert cap.err.strip().splitlines() == [cap.err.strip()] and "already holds checkpoint-2; pass --resume" in cap.err
    assert main([*args, "--resume"]) == 0
    assert f"resuming from {out / 'checkpoint-2'}" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["train_steps"] == 6


# ------------------------------------------------------------- the bad-input sweep of the commands other than train
@pytest.mark.parametrize("argv, message", [
    # argparse's own errors (a word for a number, a choice or an argument missing): one line, not usage + message
    (["evaluate", "DIR", "--num_beams", "abc"], r"argument --num_beams/--num-beams/--beam: invalid int value: 'abc'; "
                                                r"`hf-attn evaluate --help` lists the arguments$"),
    (["evaluate", "DIR", "--split", "bogus"], r"argument --split: invalid choice: 'bogus'"),
    (["translate", "DIR", "--batch_size", "x"], r"argument --batch_size/--batch-size: invalid int value: 'x'"),
    (["push", "DIR"], r"the following arguments are required: repo_id; `hf-attn push --help`"),
    (["convert"], r"the following arguments are required: source"),
    (["convert", "DIR", ""], r"the output directory is an empty string; give a directory name"),  # was the cwd
    (["convert", "", "out"], r"SOURCE is an empty string; give a Marian/BART model directory or Hub id"),
    (["card", "DIR", "--bogus"], r"unrecognized arguments: --bogus"),
    (["metrics", "a", "b"], r"unrecognized arguments: b"),
    (["analyze", "DIR", "--sentences", "abc"], r"argument --sentences: invalid int value: 'abc'"),
    (["view", "DIR"], r"the following arguments are required: --output/-o"),
    (["reproduce", "--jobs", "two"], r"argument --jobs: invalid int value: 'two'"),
    (["presets", "--bibtex", "bogus"], r"--bibtex: no preset 'bogus'; `hf-attn presets` lists them$"),
    (["corpora", "extra"], r"unrecognized arguments: extra; `hf-attn corpora --help`"),
    # checked before any model directory is read
    (["card", "DIR", "--repo_id", "bad id!!"], r"--repo_id 'bad id!!' is not a Hub repo id; give 'user/name'"),
    (["analyze", "DIR", "--figures", "all,bogus"], r"--figures 'bogus' is not a figure"),  # it named 'all'
    (["view", "DIR", "-o", "v.html", "--num_beams", "0"], r"--num_beams 0: need at least 1"),  # was ignored
    (["metrics", "{file}"], r"DIR '.*file' is not a writable directory \(it is a file\)"),  # was a traceback
    (["metrics", "{file}/sub"], r"DIR '.*file/sub' is not a writable directory \(Not a directory\)"),
])
def test_other_commands_give_one_line(tmp_path, capsys, argv, message):
    from training_helpers import cli_in_process

    (tmp_path / "file").write_text("x")
    code, err = cli_in_process([a.replace("{file}", str(tmp_path / "file")) for a in argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hf-attn: error: "), err
    assert re.search(message, lines[0]), lines[0]


def test_figures_all_with_names_is_every_figure():
    from hf_attn.analysis import figures

    assert figures.parse_figures("all,gmm-entropy") == list(figures.FIGURES)


@pytest.mark.parametrize("flags, message", [
    (["--only", "x"], r"--only 'x' picks experiments of an experiments file; give it with --experiments FILE"),
    (["--deadline", "nan"], r"--deadline nan: give the seconds this sitting may run, more than 0"),
    (["--deadline", "60"], r"--deadline 60 applies to a converged matrix only; give it with --converged FILE"),
    (["--experiments", "{tmp}/empty.json"], r"--experiments '.*empty.json': needs a list \"experiments\""),
    (["--experiments", "{tmp}/list.json"], r"--experiments '.*list.json': needs a list \"experiments\""),
    (["--pairs", "xx-en"], r"--pairs xx-en: unknown Bible language or translation code 'xx'"),
    (["--pairs", "de-de"], r"--pairs de-de: source and target are the same Bible translation"),
    (["--output_dir", "{tmp}/file/out"], r"--output_dir '.*file/out' cannot be written to \('.*file' is a file\)"),
    (["--runs_dir", "{tmp}/file"], r"--runs_dir '.*file' cannot be written to \('.*file' is a file\)"),
    (["--report_only", "--output_dir", "{tmp}/file"], r"--output_dir '.*file' cannot be written to"),
    (["--report_only", "--readme", "{tmp}/file"], r"--readme '.*file' has no block between <!-- reproduce-headline"),
    (["--report_only", "--readme", "{tmp}/missing.md"], r"--readme '.*missing.md' cannot be read \(No such file"),
    (["--report_only", "--docs", "{tmp}"], r"--docs '.*': the page '.*papers/.*.md' cannot be read"),
    (["--report_only", "--no_report"], r"--no_report \(train only\) and --report_only \(the report only\) together"),
])
def test_reproduce_refuses_before_any_run(tmp_path, capsys, monkeypatch, flags, message):
    """Each of these was a traceback, or trained runs (the default matrix, doomed ones) before failing or at all."""
    from hf_attn.reproduce import runner

    monkeypatch.setattr(runner, "run_matrix", lambda *a, **k: pytest.fail("runs started"))
    monkeypatch.setattr(runner, "write_report", lambda *a, **k: pytest.fail("report written"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "list.json").write_text("[]")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    try:
        assert main(["reproduce", "--output_dir", str(tmp_path / "r"), "--runs_dir", str(tmp_path / "runs"),
                     *flags]) == 2
    finally:
        os.environ.pop("HF_ATTN_CACHE", None)
    assert re.search(message, _one_line(capsys))
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_card_and_push_check_the_config_and_the_repo_id(trained, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(trained, d, ignore=shutil.ignore_patterns("checkpoint-*"))
    card = (d / "README.md").read_text()
    for bad in ("bad repo id!!", "a/b/c"):  # huggingface_hub's HFValidationError was a traceback, after the card
        assert main(["push", str(d), bad]) == 2
        assert f"REPO_ID {bad!r} is not a Hub repo id" in _one_line(capsys)
    assert (d / "README.md").read_text() == card
    assert main(["push", str(d), "me/model"]) == 2  # HF_HUB_OFFLINE=1 (conftest): was OfflineModeIsEnabled's traceback
    assert re.search(r"cannot push '.*' to 'me/model': the Hub is offline here \(HF_HUB_OFFLINE=1\)", _one_line(capsys))
    (d / "config.json").write_text("[1, 2]")  # JSON, but not an object: was AttributeError's traceback
    assert main(["card", str(d)]) == 2
    assert "config.json' holds a JSON list, not a model config" in _one_line(capsys)
    assert main(["push", str(d), "me/model"]) == 2
    assert "config.json holds a JSON list, not a model config" in _one_line(capsys)


@pytest.mark.slow
def test_convert_into_a_path_under_a_file(trained, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["convert", str(trained), str(tmp_path / "file" / "out")]) == 2  # was NotADirectoryError's traceback
    assert re.search(r"output directory '.*file/out' cannot be written to \('.*file' is a file\)", _one_line(capsys))


@pytest.mark.slow
def test_evaluate_checks_the_test_file_before_loading_the_model(trained, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["evaluate", str(trained), "--test_file", str(tmp_path / "empty.jsonl")]) == 2
    assert "has no sentence pairs" in _one_line(capsys)  # no "Loading weights" progress bar before it


@pytest.mark.slow
def test_out_of_memory_while_translating_is_one_line(trained, monkeypatch):
    """``hf-attn evaluate DIR --num_beams 100000``: torch's CPU allocator failed with a traceback."""
    from hf_attn.errors import HfAttnInputError
    from hf_attn.generation import translate_texts
    from hf_attn.rundir import load_model_dir

    model, tokenizer = load_model_dir(str(trained))

    def no_memory(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 26214400000 bytes.")

    monkeypatch.setattr(model, "generate", no_memory)
    with pytest.raises(HfAttnInputError, match=r"out of memory translating a batch of 2 sentences with 100000 beams "
                                               r"\(.*can't allocate memory.*\); lower --num_beams \(now 100000\) or "
                                               r"--batch_size \(now 32\)"):
        translate_texts(model, tokenizer, ["a", "b"], num_beams=100000, progress=False)


@pytest.mark.slow
def test_analyze_and_view_check_every_input_first(trained, tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"not": "a pair"}\n')
    assert main(["analyze", str(trained), str(tmp_path / "missing")]) == 2  # the first was analyzed before
    assert "missing' holds no config.json" in _one_line(capsys)
    assert main(["analyze", str(trained), "--sentences", "2", "--rank-null", str(tmp_path / "bad.jsonl")]) == 2
    assert re.search(r"^hf-attn: error: --rank-null '.*bad.jsonl' line 1 has no 'translation'", _one_line(capsys))
    assert main(["view", str(trained), "-o", str(tmp_path / "v.html"), "--preview", str(tmp_path / "no" / "p.png")]) == 2
    assert re.search(r"--preview '.*no/p.png' cannot be written", _one_line(capsys))  # after the page: a traceback
    assert not (tmp_path / "v.html").exists()
