"""hf-attn models with transformers' example script run_translation.py (docs/transformers-scripts.md, "Using
transformers' example scripts"): `hf-attn convert` writes a complete model directory, the script's essential path (tests/
translation_example.py: stock Seq2SeqTrainer, label smoothing, predict_with_generate, evaluate.load("sacrebleu"))
trains and scores it offline with hf-attn's metric, and `hf-attn card` brings the hf-attn card back over the one
the Trainer wrote."""

from __future__ import annotations

import json
import time
import re
import subprocess
import sys
from pathlib import Path

import pytest
from training_helpers import bible_pairs, cli_in_process, offline_env, write_jsonl

import hf_attn
from hf_attn.training.cards import TRAINER_START

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "transformers-scripts.md").read_text()
pytestmark = pytest.mark.usefixtures("one_thread")


def readme_command() -> list[str]:
    """The page's run_translation.py command line, as arguments."""
    block = PAGE.split("# Using transformers' example scripts", 1)[1]
    cmd = re.search(r"python run_translation.py ((?:.*\\\n)*.*)", block).group(1)  # to the first unbroken line
    return cmd.replace("\\\n", " ").split()


@pytest.fixture(scope="module")
def converted(trained, tmp_path_factory):
    """`hf-attn convert` in this process (a fresh interpreter would add its imports and prove nothing more)."""
    from hf_attn.cli import main

    out = tmp_path_factory.mktemp("conv") / "rela-g-to-gmm"
    assert main(["convert", str(trained), str(out), "--preset", "gmm"]) == 0
    return out


@pytest.mark.slow
def test_convert_writes_a_complete_directory(converted, trained):
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["hf_attn_card"]["converted_from"] == str(trained)
    run = json.loads((trained / "results.json").read_text())
    langs = [run["source_lang"], run["target_lang"]]
    assert cfg["hf_attn_card"]["languages"] == langs  # from the source's card
    # one parameter count: the run's card (results.json, counted at training) and a directory card (from
    # config.json) count the same thing
    from hf_attn.training.cards import _param_count

    assert _param_count(trained) == json.loads((trained / "results.json").read_text())["params"]
    assert cfg["preset"] == "gmm" and cfg["auto_map"]["AutoModelForSeq2SeqLM"].endswith("HfAttnMarianMTModel")
    for name in ("model.safetensors", "generation_config.json", "tokenizer_config.json", "modeling_hf_attn.py",
                 "attention_gmm.py", "gmm_mixture.py", "README.md"):
        assert (converted / name).is_file(), name
    card = (converted / "README.md").read_text()
    assert "- hf-attn" in card and "- gmm" in card and "Converted from `" in card and "Not trained since" in card
    assert "language:\n" + "".join(f"- {x}\n" for x in langs) in card
    assert not re.search(r"\$[a-z_]+", card), re.findall(r"\$[a-z_]+", card)


def test_converted_languages_come_from_the_card_else_the_tokenizer(tmp_path):
    from types import SimpleNamespace

    from hf_attn.training.convert import source_languages

    marian = SimpleNamespace(source_lang="deu_Latn", target_lang="eng")
    assert source_languages(str(tmp_path), marian) == ["deu", "eng"]  # no card: the tokenizer's pair
    assert source_languages(str(tmp_path), SimpleNamespace(src_lang="ru_RU", tgt_lang="en_XX")) == ["ru", "en"]
    assert source_languages(str(tmp_path), SimpleNamespace()) == []
    (tmp_path / "README.md").write_text("---\nlanguage:\n- de\n- en\nlicense: mit\n---\n# a model\n")
    assert source_languages(str(tmp_path), marian) == ["de", "en"]  # the card wins
    (tmp_path / "README.md").write_text("---\nlanguage: fr\n---\n")
    assert source_languages(str(tmp_path), marian) == ["fr"]
    (tmp_path / "README.md").write_text("---\nlanguage: [unclosed\n---\n")  # a broken card: the tokenizer
    assert source_languages(str(tmp_path), marian) == ["deu", "eng"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["not-empty", "no-tokenizer", "no-source", "hub-offline", "source-file",
                                  "tokenizer-missing", "tokenizer-hub-offline"])
def test_convert_misuse_is_one_line(case, trained, tmp_path, capsys):
    src, out, flags = str(trained), tmp_path / "out", []
    if case == "not-empty":
        out.mkdir()
        (out / "x").write_text("x")
    elif case == "no-tokenizer":
        src = tmp_path / "bare"
        src.mkdir()
        for name in ("config.json", "model.safetensors"):
            (src / name).write_bytes((trained / name).read_bytes())
    elif case == "hub-offline":
        src = "Helsinki-NLP/opus-mt-de-en"  # the tests run with HF_HUB_OFFLINE=1
    elif case == "source-file":
        src = trained / "config.json"
    elif case == "tokenizer-missing":
        flags = ["--tokenizer", str(tmp_path / "missing")]
    elif case == "tokenizer-hub-offline":
        flags = ["--tokenizer", "Helsinki-NLP/opus-mt-de-en"]
    else:
        src = str(tmp_path / "missing")
    started = time.time()
    code, err = cli_in_process(["convert", str(src), str(out), "--preset", "gmm", *flags], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err[-2000:]
    expected = {"not-empty": "exists and is not empty", "no-tokenizer": "holds no tokenizer files",
                "no-source": "no such model directory", "hub-offline": "the Hub is offline",
                "source-file": "a file, not a model directory", "tokenizer-missing": "--tokenizer '",
                "tokenizer-hub-offline": "the Hub is offline"}[case]
    if case == "tokenizer-missing":
        assert "no such directory; give a directory with tokenizer files" in err
    assert expected in err and "NoneType" not in err
    assert time.time() - started < 40  # at once, not after the Hub client's retries


@pytest.mark.slow
def test_card_of_a_stock_model_is_one_line(tmp_path, capsys):
    from transformers import MarianConfig, MarianMTModel

    stock = tmp_path / "stock"
    MarianMTModel(MarianConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=16,
                               decoder_ffn_dim=16, encoder_attention_heads=2, decoder_attention_heads=2,
                               pad_token_id=0, decoder_start_token_id=0, max_position_embeddings=32)).save_pretrained(stock)
    code, err = cli_in_process(["card", str(stock)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err[-2000:]
    assert "holds a marian model, without hf-attn attention" in err and "hf-attn convert" in err
    assert not (stock / "README.md").exists()


@pytest.mark.slow
def test_run_translation_path_with_a_converted_model(converted, trained, tmp_path, capsys):
    """The page's command, with a tiny budget, in a fresh process that imports no hf_attn before the metric (the
    `hf-attn metrics` and `hf-attn card` steps around it run in this process: they only write files)."""
    work = tmp_path / "work"
    work.mkdir()
    assert cli_in_process(["metrics", str(work)], capsys)[0] == 0
    pairs = bible_pairs(48)
    write_jsonl(work / "train.json", pairs[:32])
    write_jsonl(work / "valid.json", pairs[32:40])
    write_jsonl(work / "test.json", pairs[40:48])
    args = readme_command()
    args[args.index("--model_name_or_path") + 1] = str(converted)
    args[args.index("--output_dir") + 1] = "out"
    tiny = ["--max_steps", "3", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
            "--max_source_length", "64", "--max_target_length", "32", "--save_strategy", "no", "--report_to", "none",
            "--disable_tqdm", "true", "--use_cpu", "true"]
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "translation_example.py"), *args, *tiny], cwd=work,
                       env=offline_env(HF_EVALUATE_OFFLINE="1"), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    out = work / "out"
    results = json.loads((out / "all_results.json").read_text())
    assert {"eval_bleu", "predict_bleu", "train_loss"} <= set(results), results
    assert len((out / "generated_predictions.txt").read_text().splitlines()) == 8
    assert "generated_from_trainer" in (out / "README.md").read_text()  # the Trainer's card replaced ours

    assert cli_in_process(["card", str(out)], capsys)[0] == 0
    card = (out / "README.md").read_text()
    assert "- hf-attn" in card and "- gmm" in card and TRAINER_START in card and "fine-tuned version of" in card
    # what the card knew before the Trainer survives it (kept in config.json): the origin, and one parameter count,
    # the same the converted model's card gives
    assert f"Converted from `{trained}`" in card and "Origin: not recorded" not in card
    run = json.loads((trained / "results.json").read_text())
    assert f"language:\n- {run['source_lang']}\n- {run['target_lang']}\n" in card
    count = re.search(r"([\d,]+) trainable parameters \(tied embeddings counted once\)", card).group(1)
    assert count in (converted / "README.md").read_text()
    assert cli_in_process(["card", str(out)], capsys)[0] == 0
    assert (out / "README.md").read_text() == card  # idempotent: the Trainer's summary is kept, not lost

    # the Trainer's output is a complete remote-code directory: it loads where hf_attn cannot be imported
    load = ("import sys\nclass Block:\n    def find_spec(self, name, *a, **k):\n"
            "        if name.split('.')[0] == 'hf_attn': raise ImportError('blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n"
            f"m = AutoModelForSeq2SeqLM.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
            f"t = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
            "print(type(m).__name__, m.config.preset)\n")
    q = subprocess.run([sys.executable, "-c", load], cwd=tmp_path, env=offline_env(PYTHONPATH=""),
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0 and "HfAttnMarianMTModel gmm" in q.stdout, q.stderr[-3000:]


@pytest.mark.slow
def test_offline_metric_through_evaluate_load_by_name(tmp_path, capsys):
    assert cli_in_process(["metrics", str(tmp_path)], capsys)[0] == 0  # (writes the files; the fresh process reads them)
    code = ("import evaluate\nm = evaluate.load('sacrebleu')\n"
            "r = m.compute(predictions=['the cat sat on the mat'], references=[['the cat sat on the mat']])\n"
            "print(round(r['score'], 1), r['signature'])\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=offline_env(HF_EVALUATE_OFFLINE="1"),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("100.0 nrefs:1"), p.stderr[-2000:]


def presets_with_an_auxiliary_objective() -> list[str]:
    """From each variant's `training_objective` hook on each preset's config."""
    out = []
    for name in hf_attn.PRESETS:
        config = hf_attn.HfAttnMarianConfig.from_preset(name)
        used = {v for layout in config.attention_layout().values() for v in layout}
        if any(hf_attn.ATTENTION_VARIANTS[v].training_objective(config) for v in used):
            out.append(name)
    return out


def test_docs_list_the_presets_that_need_hf_attn_trainer_under_label_smoothing():
    block = PAGE.split("<!-- aux-objective-presets:start -->", 1)[1].split("<!-- aux-objective-presets:end -->")[0]
    assert re.findall(r"`([\w-]+)`", block) == presets_with_an_auxiliary_objective()
