"""torch.compile: a compiled training step and compiled generation give the eager results on a tiny model
(scripts/check_compile.py runs the same checks over every preset, with timings), and a training step compiles into
one graph (fullgraph=True) where the documentation says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]

# tiny model; chunk 4 sends ReLA and ReLUFormer through the block-wise path (attention_blockwise.py)
TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--ffn", "32", "--vocab", "50", "--batch", "3",
        "--src-len", "7", "--tgt-len", "6", "--decode-len", "4", "--beams", "2", "--chunk", "4", "--repeats", "0",
        "--threads", "1", "--checks", "train,greedy,updated"]  # (beam search: scripts/check_compile.py, every preset)
# aot_eager: dynamo's capture and AOTAutograd's forward/backward graphs, where the model's own code matters; inductor's
# C++ code generation takes minutes per model on CPU (scripts/check_compile.py runs it)
BACKEND = ["--backend", "aot_eager"]
# one model with a variant at each site, in CI's time budget: GMM with its synthesis network (attention_gmm), ReLA
# block-wise (attention_rela, attention_blockwise) and RAN (attention_ran); scripts/check_compile.py checks every
# preset, and test_fullgraph_training_step below covers ReLUFormer and calibration
MODELS = {
    "rela-ran-gmm": ["--presets", "gmm-synthesis", "--set", "encoder_attention=rela",
                     "--set", "decoder_attention=recurrent"],
}


@pytest.fixture(scope="module")
def check():
    module = load_script("check_compile")
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def results(check, tmp_path_factory):
    """{model: the JSON file scripts/check_compile.py wrote for it}."""
    out, threads = {}, torch.get_num_threads()
    try:
        for name, argv in MODELS.items():
            out[name] = tmp_path_factory.mktemp("compile") / f"{name}.json"
            check.main([*argv, *TINY, *BACKEND, "--output", str(out[name])])
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_training_and_generation_equal_eager(check, results, name):
    (row,) = json.loads(results[name].read_text())["rows"]
    statuses = {c: row[c]["status"] for c in check.CHECKS}
    assert statuses == {"train": "ok", "greedy": "ok", "beam": "skipped", "updated": "ok"}, check._reason(row)
    assert row["train"]["max_rel_error"] <= 1e-4


def test_a_wrong_gradient_or_token_is_a_mismatch(check):
    """The comparisons are not vacuous: one changed gradient entry, or one changed token, is reported."""
    grads = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([1e-14])}
    assert check.compare_train((3.0, grads), (3.0, dict(grads)), 1e-4)["status"] == "ok"
    assert check.compare_train((3.0, grads), (3.0, {**grads, "b": torch.tensor([2e-14])}), 1e-4)["status"] == "ok"
    bad = check.compare_train((3.0, grads), (3.0, {**grads, "w": torch.tensor([1.0, -2.001])}), 1e-4)
    assert bad["status"] == "mismatch" and bad["worst"] == "w"
    assert check.compare_train((3.0, grads), (3.0, {"w": grads["w"]}), 1e-4)["status"] == "mismatch"
    assert check.compare_train((3.0, grads), (float("nan"), grads), 1e-4)["status"] == "mismatch"
    ids = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 1]])
    assert check.compare_ids(ids, ids.clone()) == {"status": "ok"}
    other = ids.clone()
    other[1, 2] = 9
    assert check.compare_ids(ids, other) == {"status": "mismatch", "reason": "row 1: [1, 7, 2, 1] vs [1, 7, 9, 1]"}


def test_docs_block_and_json(check, results, tmp_path):
    path = results["rela-ran-gmm"]
    result = json.loads(path.read_text())
    assert result["settings"]["backend"] == "aot_eager" and len(result["settings"]["load_average_before"]) == 3
    assert result["settings"]["overrides"] == {"encoder_attention": "rela", "decoder_attention": "recurrent"}
    readme = tmp_path / "speed.md"
    before, after = "# T\n\n", "\n\n## Next\n"
    readme.write_text(before + check.BLOCK_START + "\nold\n" + check.BLOCK_END + after)
    check.main(["--docs", str(readme), "--from", str(path), "--no-timings"])
    text = readme.read_text()
    assert text.startswith(before + check.BLOCK_START) and text.endswith(check.BLOCK_END + after)
    assert "old" not in text and "| gmm-synthesis | ok | ok | ok | skipped | ok |" in text and "speedup" not in text
    assert "encoder_attention=rela, decoder_attention=recurrent" in text
    check.main(["--docs", str(readme), "--from", str(path)])  # a --repeats 0 run shows no timing columns
    assert "| gmm-synthesis | ok | ok | ok | skipped | ok |" in readme.read_text() and "speedup" not in readme.read_text()
    timed = tmp_path / "timed.json"
    row = {**result["rows"][0], "compile_s": {"train": 90.0, "greedy": 60.0}, "train_speedup": 1.5}
    timed.write_text(json.dumps({"settings": {**result["settings"], "repeats": 3}, "rows": [row]}))
    check.main(["--docs", str(readme), "--from", str(timed)])
    breaks = row["graph_breaks"]["count"]
    assert f"| gmm-synthesis | ok | ok | ok | skipped | ok | {breaks} | 90 / 60 / - / - | 1.50x | - |" in readme.read_text()
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="no block between <!-- compile:start -->"):
        check.main(["--docs", str(tmp_path / "plain.md"), "--from", str(path)])


# fullgraph: one graph per training forward. Not RAN or the Synthesizer (their right-padding check reads the mask on
# the host), nor sparsemax / entmax15 (the entmax package's autograd functions do not inline), nor attention
# calibration's training step (its perturbed pass switches requires_grad off and on, which dynamo does not trace)
FULLGRAPH = {
    "softmax": dict(encoder_attention="rela", decoder_attention="reluformer", rela_chunk=4, reluformer_query_chunk=4),
    "gmm-synthesis": dict(encoder_attention="hard-gaussian"),
}


@pytest.mark.parametrize("preset", list(FULLGRAPH))
def test_fullgraph_training_step(check, preset):
    """The mask function's host check (is anything padded?) and a cached property's lock once broke every graph."""
    args = check.parse_args(TINY)
    sizes = {**check.model_sizes(args), **FULLGRAPH[preset]}
    model = check.build("marian", preset, **sizes)
    batch = check.make_batch(args.vocab, args.batch, args.src_len, args.tgt_len)
    assert (batch["attention_mask"] == 0).any()
    want = check.train_step(model, batch)
    torch._dynamo.reset()
    model.compile(backend="eager", fullgraph=True)
    got = check.train_step(model, batch)
    assert check.compare_train(want, got, 1e-5)["status"] == "ok"


def test_a_later_run_supersedes_an_earlier_runs_rows(check, results, tmp_path):
    """A re-check after a code change replaces the earlier row of that preset in the docs block."""
    path = results["rela-ran-gmm"]
    again = json.loads(path.read_text())
    again["settings"]["note"] = "re-checked"
    later = tmp_path / "later.json"
    later.write_text(json.dumps(again))
    readme = tmp_path / "speed.md"
    readme.write_text(check.BLOCK_START + "\n" + check.BLOCK_END + "\n")
    check.main(["--docs", str(readme), "--from", str(path), str(later), "--no-timings"])
    text = readme.read_text()
    assert text.count("| gmm-synthesis |") == 1 and "Note: re-checked" in text
    assert text.count("```bash") == 1  # the earlier run kept no row, so its command is left out too


def test_docs_page_holds_the_block_the_committed_results_give(check, tmp_path, monkeypatch):
    """The compile block of the Speed page is what `--docs` writes from the JSON files its first line names."""
    page = ROOT / check.DOCS_PAGE
    text = page.read_text()
    assert text.count(check.BLOCK_START) == 1 and text.count(check.BLOCK_END) == 1
    command = re.search(r"Generated by `(python scripts/check_compile.py [^`]*)`", text).group(1).split()
    assert command[2:4] == ["--docs", check.DOCS_PAGE]
    copy = tmp_path / "speed.md"
    copy.write_text(text)
    monkeypatch.chdir(ROOT)
    check.main(["--docs", str(copy), *command[4:]])
    assert copy.read_text() == text
    assert check.BLOCK_START not in (ROOT / "README.md").read_text()
