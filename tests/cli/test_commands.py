"""The `hf-attn` CLI: train (Bible, files, BART, warm start, dashes), evaluate, translate, presets, one-line
errors for broken input, and resuming an interrupted run."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import fields

import pytest
import torch

import hf_attn
from hf_attn.analysis.options import AnalyzeOptions, option_defaults
from hf_attn.analysis.report import analyze_dirs
from hf_attn.cli import main
from hf_attn.cli.analyze import analyze_parser, parse_options
from training_helpers import TINY_ARGS, bible_pairs, cli_in_process, run_cli, write_jsonl


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


def test_presets_command(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(hf_attn.PRESETS)
    for line, (name, p) in zip(lines, hf_attn.PRESETS.items()):
        assert line.split()[0] == name and line.endswith(p.description)


def test_corpora_command(capsys):
    assert main(["corpora"]) == 0
    out = capsys.readouterr().out
    assert "Elberfelder 1932" in out and "World English Bible 2000" in out and len(out.splitlines()) == 32


@pytest.mark.slow
def test_train_writes_a_hub_ready_directory(trained):
    files = {p.name for p in trained.iterdir()}
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json", "vocab.json",
                 "source.spm", "target.spm", "README.md", "results.json", "run_args.json", "test_translations.txt"):
        assert name in files, name
    cfg = json.loads((trained / "config.json").read_text())
    assert cfg["preset"] == "rela-g" and "AutoModelForSeq2SeqLM" in cfg["auto_map"]
    for ref in set(cfg["auto_map"].values()):
        assert (trained / (ref.split(".")[0] + ".py")).is_file()
    r = json.loads((trained / "results.json").read_text())
    assert r["train_steps"] == 6 and r["test_sentences"] == 8 and r["num_beams"] == 2
    assert 0 <= r["bleu"] <= 100 and 0 < r["chrf"] <= 100 and r["tokens_per_second"] > 0 and r["peak_rss_mib"] > 0
    assert r["device"].endswith("malloc keeps freed memory") == sys.platform.startswith("linux")  # bench/memory.py
    assert r["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert r["sizes"]["train"] <= 200 and r["data"]["source_code"] == "e" and r["data"]["target_code"] == "4"
    assert r["attention_layout"] == {"encoder": ["rela"], "decoder": ["rela"], "cross": ["rela"]}
    assert r["training"]["embedding_init_std"] == round(32 ** -0.5, 6)  # d_model**-0.5 by default
    from safetensors.torch import load_file

    emb = load_file(str(trained / "model.safetensors"))["model.shared.weight"]
    assert abs(emb.std().item() - 32 ** -0.5) < 0.03, emb.std()  # 6 steps barely move it from N(0, d**-0.5)
    assert {"checkpoint-3", "checkpoint-6"} <= files
    card = (trained / "README.md").read_text()
    assert not re.search(r"\$[a-z_]+", card), re.findall(r"\$[a-z_]+", card)
    for text in ("rela-g", "Zhang, Titov & Sennrich 2021", str(r["bleu"]), r["bleu_signature"], "trust_remote_code=True",
                 "Elberfelder 1932", "| label smoothing | 0.1 |", "| init | N(0, 0.02), token embeddings N(0, 0.176777) x sqrt(d_model) |",
                 "## Limits"):
        assert text in card, text
    assert card.startswith("---\nlanguage:\n- de\n- en\n")
    gen = json.loads((trained / "generation_config.json").read_text())
    assert gen["num_beams"] == 2 and gen["decoder_start_token_id"] == cfg["pad_token_id"]


@pytest.mark.slow
def test_evaluate_rescores_the_same(trained, capsys):
    r = json.loads((trained / "results.json").read_text())
    assert main(["evaluate", str(trained), "--max_samples", "8"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["sentences"] == 8 and out["bleu"] == r["bleu"] and out["chrf"] == r["chrf"]


@pytest.mark.slow
def test_translate_file_and_stdin(trained, tmp_path, capsys, monkeypatch):
    import io

    from hf_attn.data import read_bible_pair

    src = [x["translation"]["de"] for x in read_bible_pair("e", "4")["test"][:3]]
    (tmp_path / "in.txt").write_text("\n".join(src) + "\n")
    assert main(["translate", str(trained), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]) == 0
    hyps = (tmp_path / "out.txt").read_text().splitlines()
    expected = (trained / "test_translations.txt").read_text().splitlines()[:3]
    assert hyps == expected
    monkeypatch.setattr("sys.stdin", io.StringIO(src[0] + "\n"))
    capsys.readouterr()
    assert main(["translate", str(trained)]) == 0
    assert capsys.readouterr().out.splitlines() == expected[:1]


def _bad_jsonl(tmp_path):
    f = tmp_path / "wrong.jsonl"
    f.write_text('{"src": "a", "tgt": "b"}\n')
    return str(f)


def _empty(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    return str(f)


@pytest.mark.slow
def test_analyze_reports_and_plots(trained, tmp_path, capsys):
    out, plots = tmp_path / "attention.json", tmp_path / "plots"
    assert main(["analyze", str(trained), "--sentences", "5", "--output", str(out), "--plot_dir", str(plots)]) == 0
    printed = capsys.readouterr().out
    rep = json.loads(out.read_text())[str(trained)]
    assert rep["sentences"] == 5 and rep["preset"] == "rela-g" and "test split" in rep["data"]
    for site in ("encoder", "decoder", "cross"):
        f = rep["sites"][site]
        assert 0 <= f["sparsity"] <= 1 and 0 <= f["null_rate"] <= f["sparsity"] + 1e-9 and f["entropy"] >= 0
        assert 0 < f["top_p_mass"] <= 1 + 1e-6 and len(rep["layers"][site]) == 1
        assert f"{trained.name:<28} {site:<8} {f['sparsity']:>8.3f}" in printed
    assert (plots / f"{trained.name}_attention.png").stat().st_size > 1000
    same = analyze_dirs(AnalyzeOptions((str(trained),), sentences=5))[str(trained)]  # the library call, no parser
    assert all(same["sites"][site] == pytest.approx(rep["sites"][site]) for site in rep["sites"])
    assert main(["analyze", str(trained), "--sentences", "0"]) == 2
    assert "--sentences 0: need at least 1" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "none")]) == 2
    assert "holds no config.json" in capsys.readouterr().err


def test_analyze_flags_are_the_options_fields_with_their_defaults(capsys):
    namespace = analyze_parser().parse_args(["runs/a"])
    assert vars(namespace) == {**option_defaults(), "model_dirs": ["runs/a"]}
    assert list(vars(namespace)) == [f.name for f in fields(AnalyzeOptions)]
    assert parse_options(["runs/a", "runs/b", "--speed_beams", "2,3", "--top_p_values", "0.5", "--seed", "7"]) == \
        AnalyzeOptions(("runs/a", "runs/b"), speed_beams=(2, 3), top_p_values=(0.5,), seed=7)
    for value, message in (("0", "'0': need values > 0"), ("1,x", "'1,x': need comma-separated int values")):
        assert main(["analyze", "runs/a", "--speed_beams", value]) == 2  # argparse's error, as the CLI's one line
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"hf-attn: error: argument --speed_beams: {message}") and len(err.splitlines()) == 1
        assert err.endswith("; `hf-attn analyze --help` lists the arguments")


@pytest.mark.parametrize("make_args, message", [
    (lambda d: ["--train_file", str(d / "missing.jsonl")], r"--train_file '.*missing.jsonl': no such file"),
    (lambda d: ["--train_file", _bad_jsonl(d)], r"line 1 has no 'translation' object \(found: \['src', 'tgt'\]\)"),
    (lambda d: ["--train_file", _empty(d)], r"training split of .* is empty"),
    (lambda d: ["--source", "xx"], r"unknown Bible language or translation code 'xx'"),
    (lambda d: ["--output_dir", str(d / "file.txt" / "out")], r"--output_dir .* is not a writable directory"),
    (lambda d: ["--preset", "rela-x"], r"--preset 'rela-x' is not a preset .*valid: softmax"),
    (lambda d: ["--resume"], r"--resume: .* holds no checkpoint"),
    (lambda d: ["--encoder_attention", "nope"], r"encoder_attention='nope' is not an attention variant"),
    (lambda d: ["--embedding_init_std", "-1"], r"--embedding_init_std -1.0 must be a finite number >= 0"),
    (lambda d: ["--init_from", str(d / "missing")], r"--init_from '.*missing': no such directory; give a trained model"),
    (lambda d: ["--init_from", str(d / "file.txt")], r"--init_from '.*file.txt': a file, not a directory"),
    (lambda d: ["--tokenizer_name", "./no-tok"], r"--tokenizer_name './no-tok': no such directory; give a directory"),
    (lambda d: ["--init_from", "nobody/nothing"], r"the tokenizer 'nobody/nothing' cannot be loaded .* not a local "
                                                  r"directory: download it"),  # the tests run offline
])
def test_broken_input_gives_one_error_line(tmp_path, capsys, make_args, message):
    (tmp_path / "file.txt").write_text("x")
    args = ["train", "--max_steps", "1", "--output_dir", str(tmp_path / "out"), *make_args(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hf-attn: error: "), err
    assert re.search(message, err[0]), err[0]


@pytest.mark.slow
def test_error_line_from_the_console(tmp_path, capsys):
    p = run_cli(["train", "--source", "de", "--target", "klingon", "--output_dir", str(tmp_path / "o")])
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert "unknown Bible language or translation code 'klingon'" in p.stderr
    code, err = cli_in_process(["evaluate", str(tmp_path / "nothing")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "holds no config.json" in err


@pytest.mark.slow
def test_existing_run_needs_resume(trained, capsys):
    assert main(["train", *TINY_ARGS, "--max_steps", "2", "--output_dir", str(trained)]) == 2
    assert "already holds checkpoint-6; pass --resume" in capsys.readouterr().err


@pytest.mark.slow
def test_interrupted_run_resumes(tmp_path, cache):
    from hf_attn.errors import HfAttnInputError
    from hf_attn.cli.train_args import parse_train_args
    from hf_attn.training.run import train
    from hf_attn.training.trainer import InterruptAfterSteps

    # about 13 steps per epoch: checkpoint-14 lies in the second epoch (a mid-epoch resume used another
    # data order than the uninterrupted run from the second epoch on)
    common = ["--preset", "rela-g", *TINY_ARGS, "--max_steps", "16", "--save_steps", "7", "--dropout", "0.1",
              "--cache_dir", str(cache)]
    out = tmp_path / "run"
    h, t, o, g = parse_train_args(common + ["--output_dir", str(out)])
    with pytest.raises(HfAttnInputError, match="interrupted at step 15; resume from checkpoint-14 with the same command plus --resume"):
        train(h, t, o, g, extra_callbacks=[InterruptAfterSteps(15)])
    assert not (out / "model.safetensors").exists()
    assert 1 < json.loads((out / "checkpoint-14" / "trainer_state.json").read_text())["epoch"] < 2
    assert main(["train", *common, "--output_dir", str(out), "--resume"]) == 0
    state = json.loads((out / "checkpoint-16" / "trainer_state.json").read_text())
    assert state["global_step"] == 16
    # the resumed run equals an uninterrupted one: same weights (optimizer, scheduler, RNG and data order restored)
    ref = tmp_path / "ref"
    assert main(["train", *common, "--output_dir", str(ref)]) == 0
    from safetensors.torch import load_file

    a, b = load_file(out / "model.safetensors"), load_file(ref / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # resuming a run whose last checkpoint already holds --max_steps (stopped during test decoding) trains no more
    assert main(["train", *common, "--output_dir", str(out), "--resume"]) == 0
    assert not (out / "checkpoint-17").exists()
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["train_steps"] == 16
    assert resumed["curves"]["train_loss"] == json.loads((ref / "results.json").read_text())["curves"]["train_loss"]
    assert resumed["training"]["embedding_init_std"] == round(32 ** -0.5, 6)  # reported like the original run
    c = load_file(out / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], c[k])


@pytest.mark.slow
def test_files_dashes_and_bart(tmp_path, cache):
    pairs = bible_pairs(80)
    train_f = write_jsonl(tmp_path / "train.jsonl", pairs[:70])
    valid_f = write_jsonl(tmp_path / "valid.jsonl", pairs[70:75])
    (tmp_path / "test.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[75:]))
    out = tmp_path / "bart"
    args = ["train", "--preset", "softmax", "--base", "bart", *[a.replace("_", "-") for a in TINY_ARGS],
            "--train-file", str(train_f), "--validation-file", str(valid_f), "--test-file", str(tmp_path / "test.tsv"),
            "--max-steps", "2", "--output-dir", str(out), "--cache-dir", str(cache),
            "--max-source-length", "400", "--max-target-length", "400", "--max-length-ratio", "0",  # keep all 70
            "--embedding-init-std", "0"]
    assert main(args) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["base"] == "bart" and r["model_class"] == "HfAttnBartForConditionalGeneration"
    assert r["sizes"] == {"train": 70, "validation": 5, "test": 5, "train_before_filtering": 70}
    assert r["model_config"]["d_model"] == 32 and r["source_lang"] == "de"
    assert r["training"]["embedding_init_std"] == 0.02  # 0: the model's own init_std (BART's 0.02)
    assert (out / "tokenizer.json").is_file()
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["decoder_start_token_id"] == 2 and gen["forced_bos_token_id"] == 0
    assert "A **BART** translation model" in (out / "README.md").read_text()


@pytest.mark.slow
def test_init_from_a_vanilla_marian(tmp_path, cache, trained):
    from transformers import MarianConfig, MarianMTModel

    from hf_attn.data import load_tokenizer

    tok = load_tokenizer(trained)
    cfg = MarianConfig(vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                       pad_token_id=tok.pad_token_id, decoder_start_token_id=tok.pad_token_id, eos_token_id=0,
                       activation_function="swish")  # as the opus-mt models
    vanilla = tmp_path / "vanilla"
    MarianMTModel(cfg).save_pretrained(vanilla)
    tok.save_pretrained(vanilla)
    out = tmp_path / "warm"
    assert main(["train", "--preset", "rela-g", *TINY_ARGS, "--init_from", str(vanilla), "--max_steps", "2",
                 "--output_dir", str(out)]) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["init_from"] == str(vanilla) and r["preset"] == "rela-g" and r["model_config"]["d_model"] == 32
    assert json.loads((out / "config.json").read_text())["model_type"] == "hf_attn_marian"
    # a preset only chooses attention: the checkpoint keeps its swish feed-forward and its dropout, and the run is
    # not labelled with the from-scratch recipe
    assert r["model_config"]["activation_function"] == "swish"
    assert (r["model_config"]["attention_dropout"], r["model_config"]["activation_dropout"]) == (0.0, 0.0)
    assert r["recipe"] is None
