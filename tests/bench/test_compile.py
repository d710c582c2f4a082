"""torch.compile: a compiled training step and compiled generation give the eager results on a tiny model
(scripts/check_compile.py, run end to end here, runs the same checks over every preset, with timings), and a
training step compiles into one graph (fullgraph=True) where the docs say so. The comparisons themselves:
tests/bench/test_bench.py."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import kept_threads, load_script, run_script

from hf_attn.bench import compile_check
from hf_attn.bench.render import COMPILE_CHECKS, COMPILE_MARKERS, compile_reasons

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
    with kept_threads():
        yield load_script("check_compile")
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def results(check, tmp_path_factory):
    """{model: the JSON file scripts/check_compile.py wrote for it}."""
    out = {}
    for name, argv in MODELS.items():
        out[name] = tmp_path_factory.mktemp("compile") / f"{name}.json"
        run_script(check, [*argv, *TINY, *BACKEND, "--output", str(out[name])])
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_training_and_generation_equal_eager(check, results, name):
    (row,) = json.loads(results[name].read_text())["rows"]
    statuses = {c: row[c]["status"] for c in COMPILE_CHECKS}
    assert statuses == {"train": "ok", "greedy": "ok", "beam": "skipped", "updated": "ok"}, compile_reasons(row)
    assert row["train"]["max_rel_error"] <= 1e-4


def test_docs_block_and_json(check, results, tmp_path):
    path = results["rela-ran-gmm"]
    result = json.loads(path.read_text())
    assert result["settings"]["backend"] == "aot_eager" and len(result["settings"]["load_average_before"]) == 3
    assert result["settings"]["overrides"] == {"encoder_attention": "rela", "decoder_attention": "recurrent"}
    page = tmp_path / "speed.md"
    before, after = "# T\n\n", "\n\n## Next\n"
    page.write_text(before + COMPILE_MARKERS[0] + "\nold\n" + COMPILE_MARKERS[1] + after)
    check.main(["--docs", str(page), "--from", str(path), "--no-timings"])
    text = page.read_text()
    assert text.startswith(before + COMPILE_MARKERS[0]) and text.endswith(COMPILE_MARKERS[1] + after)
    assert "old" not in text and "| gmm-synthesis | ok | ok | ok | skipped | ok |" in text and "speedup" not in text
    assert "encoder_attention=rela, decoder_attention=recurrent" in text
    check.main(["--docs", str(page), "--from", str(path)])  # a --repeats 0 run shows no timing columns
    assert "| gmm-synthesis | ok | ok | ok | skipped | ok |" in page.read_text() and "speedup" not in page.read_text()
    timed = tmp_path / "timed.json"
    row = {**result["rows"][0], "compile_s": {"train": 90.0, "greedy": 60.0}, "train_speedup": 1.5}
    timed.write_text(json.dumps({"settings": {**result["settings"], "repeats": 3}, "rows": [row]}))
    check.main(["--docs", str(page), "--from", str(timed)])
    breaks = row["graph_breaks"]["count"]
    assert f"| gmm-synthesis | ok | ok | ok | skipped | ok | {breaks} | 90 / 60 / - / - | 1.50x | - |" in page.read_text()
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


def test_flags_become_the_package_settings(check):
    s = check.check_settings(check.parse_args([*TINY, *BACKEND, "--set", "gmm_gate_init=0.5", "--note", "busy"]))
    assert s == compile_check.CompileCheckSettings(
        base="marian", backend="aot_eager", checks=("train", "greedy", "updated"), overrides={"gmm_gate_init": 0.5},
        chunk=4, d_model=16, layers=1, heads=2, ffn=32, vocab=50, batch=3, src_len=7, tgt_len=6, decode_len=4, beams=2,
        repeats=0, threads=1, note="busy")
    assert check.check_settings(check.parse_args([])) == compile_check.CompileCheckSettings()


@pytest.mark.parametrize("preset", list(FULLGRAPH))
def test_fullgraph_training_step(check, preset):
    """The mask function's host check (is anything padded?) and a cached property's lock once broke every graph."""
    s = compile_check.CompileCheckSettings(d_model=16, layers=1, heads=2, ffn=32, vocab=50, batch=3, src_len=7,
                                           tgt_len=6, decode_len=4, chunk=4, overrides=FULLGRAPH[preset])
    model = compile_check.build_model(s, preset)
    batch = compile_check.make_batch(s)
    assert (batch["attention_mask"] == 0).any()
    want = compile_check.train_step(model, batch)
    torch._dynamo.reset()
    model.compile(backend="eager", fullgraph=True)
    got = compile_check.train_step(model, batch)
    assert compile_check.compare_train(want, got, 1e-5)["status"] == "ok"


def test_a_later_run_supersedes_an_earlier_runs_rows(check, results, tmp_path):
    """A re-check after a code change replaces the earlier row of that preset in the docs block."""
    path = results["rela-ran-gmm"]
    again = json.loads(path.read_text())
    again["settings"]["note"] = "re-checked"
    later = tmp_path / "later.json"
    later.write_text(json.dumps(again))
    page = tmp_path / "speed.md"
    page.write_text(COMPILE_MARKERS[0] + "\n" + COMPILE_MARKERS[1] + "\n")
    check.main(["--docs", str(page), "--from", str(path), str(later), "--no-timings"])
    text = page.read_text()
    assert text.count("| gmm-synthesis |") == 1 and "Note: re-checked" in text
    assert text.count("```bash") == 1  # the earlier run kept no row, so its command is left out too
