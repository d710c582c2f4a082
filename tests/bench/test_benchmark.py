"""scripts/benchmark.py end to end on tiny models: ratios against stock transformers SDPA and hf-attn softmax measured
in one run, --long mode with its plot, --profile, --compile, the docs block generated from the JSON, and its flag
checks; scripts/gmm_budget.py on the benchmark's settings. The parts: tests/bench/test_bench.py."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from conftest import kept_threads, load_script, run_script

from hf_attn.bench.render import BENCHMARK_MARKERS
from hf_attn.bench.results import BenchSettings

ROOT = Path(__file__).resolve().parents[2]
START, END = BENCHMARK_MARKERS
# one torch thread (the script's default is 2, which on the test workers' busy cores waits at every operator)
TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--ffn", "32", "--vocab", "50", "--repeats", "1",
        "--threads", "1"]


@pytest.fixture(scope="module")
def bench():
    with kept_threads():
        yield load_script("benchmark")


SENTENCE = [*TINY, "--batch", "4", "--src-len", "6", "--tgt-len", "5", "--decode-batch", "2", "--decode-src-len", "5",
            "--decode-len", "3"]
LONG = ["--presets", "softmax", "--long", "8,24", "--long-batch", "1", *TINY]


@pytest.fixture(scope="module")
def sentence_json(bench, tmp_path_factory):
    """Marian, one hf-attn preset beside softmax, peak memory in fresh subprocesses."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    run_script(bench, ["--presets", "rela-g,ran-d", *SENTENCE, "--output", str(out)])
    return out


@pytest.fixture(scope="module")
def long_json(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "long.json"
    run_script(bench, [*LONG, "--no-memory", "--output", str(out)])
    return out


@pytest.mark.slow
def test_sentence_level_both_reference_columns(sentence_json):
    result = json.loads(sentence_json.read_text())
    rows = {r["preset"]: r for r in result["rows"]}
    assert list(rows) == ["stock-sdpa", "softmax", "rela-g", "ran-d"]
    for kind in ("train", "decode"):
        assert rows["stock-sdpa"][f"{kind}_ratio_vs_stock"] == 1.0
        assert rows["softmax"][f"{kind}_ratio_vs_softmax"] == 1.0
    for r in rows.values():
        assert r["train_median_s"] > 0 and r["decode_median_s"] > 0 and r["train_peak_mem_mib"] > 0
        assert r["train_ratio_vs_stock"] > 0 and r["decode_ratio_vs_softmax"] > 0
        assert 0 < r["train_flop_ratio_vs_stock"] and 0 < r["decode_flop_ratio_vs_stock"]
    # softmax does stock's matrix products, no more: its FLOP bound is exactly 1
    assert rows["softmax"]["train_flop_ratio_vs_stock"] == rows["softmax"]["decode_flop_ratio_vs_stock"] == 1.0
    assert result["settings"]["command"].startswith("python scripts/benchmark.py --presets rela-g,ran-d")
    table = sentence_json.with_suffix(".md").read_text()
    assert "| rela-g |" in table and "train vs stock SDPA" in table and "decode vs hf-attn softmax" in table
    assert "decode FLOP bound" in table
    # the attention share: measured on stock only, a fraction, and the bound it gives is in the table's header
    for kind in ("train", "decode"):
        share = rows["stock-sdpa"][f"{kind}_attention_share"]
        assert 0 < share < 1 and f"{kind}_attention_share" not in rows["softmax"], (kind, share)
        assert f"{share:.0%} of its {kind} time" in table and f"{1 / (1 - share):.2f}x" in table


def test_bart_base(bench, tmp_path):
    out = tmp_path / "bart.json"
    run_script(bench, ["--base", "bart", "--presets", "ran-d", *SENTENCE, "--no-memory", "--output", str(out)])
    result = json.loads(out.read_text())
    assert result["settings"]["base"] == "bart"
    assert [r["preset"] for r in result["rows"]] == ["stock-sdpa", "softmax", "ran-d"]
    assert all(r["decode_ratio_vs_stock"] > 0 and "train_peak_mem_mib" not in r for r in result["rows"])


def test_long_mode_rows_memory_and_plot(long_json):
    rows = json.loads(long_json.read_text())["long_rows"]
    assert [(r["length"], r["preset"]) for r in rows] == [
        (8, "stock-sdpa"), (8, "softmax"), (24, "stock-sdpa"), (24, "softmax")
    ]
    for r in rows:
        assert r["fwd_bwd_median_s"] > 0 and r["tokens_per_s"] > 0 and r["peak_mem_mib"] is None  # --no-memory
        assert r["fwd_bwd_ratio_vs_stock" if r["preset"] == "stock-sdpa" else "fwd_bwd_ratio_vs_softmax"] == 1.0
    png = long_json.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 24 | softmax |" in long_json.with_suffix(".md").read_text()


@pytest.mark.slow
def test_docs_block_is_replaced_exactly(bench, sentence_json, long_json, tmp_path):
    page = tmp_path / "speed.md"
    before, after = "# Title\n\n## Speed\n\nintro\n\n", "\n\n## Next\n\ntext <!-- not a marker -->\n"
    page.write_text(before + START + "\nold hand-typed table 0.93x\n" + END + after)
    run_script(bench, ["--docs", str(page), "--from", str(sentence_json), str(long_json)])
    text = page.read_text()
    assert text.startswith(before + START + "\n") and text.endswith(END + after)
    block = text[len(before) + len(START): -len(END + after)]
    assert "old hand-typed table" not in block and block.count("```bash") == 2
    assert "| rela-g |" in block and "train vs stock SDPA" in block and "train vs hf-attn softmax" in block
    assert "| 24 | softmax |" in block
    # run again: the same block (idempotent, nothing outside it moves)
    run_script(bench, ["--docs", str(page), "--from", str(sentence_json), str(long_json)])
    assert page.read_text() == text


@pytest.mark.slow
def test_docs_page_without_markers_is_one_clear_error(bench, sentence_json, tmp_path):
    page = tmp_path / "speed.md"
    page.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no block between <!-- benchmark:start -->"):
        run_script(bench, ["--docs", str(page), "--from", str(sentence_json)])
    assert page.read_text() == "# no markers\n"
    with pytest.raises(SystemExit, match="is not a benchmark result"):
        run_script(bench, ["--docs", str(page), "--from", str(page)])


@pytest.mark.slow
def test_rejects_unknown_preset(monkeypatch, capsys):
    """The script as a program (its __main__ block, in this process: a fresh interpreter would only import torch,
    transformers and hf_attn again)."""
    script = ROOT / "scripts" / "benchmark.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--presets", "nope"])
    with pytest.raises(SystemExit) as exited, kept_threads():
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code == 2 and "unknown preset 'nope'" in capsys.readouterr().err


def test_flags_default_to_the_package_settings(bench):
    """The script's defaults are `BenchSettings`'s: the documented setting (docs/speed.md), whichever way a run is started."""
    assert bench.bench_settings(bench.parse_args(["--device", "cpu"])) == BenchSettings()
    s = bench.bench_settings(bench.parse_args(["--presets", "gmm,softmax", "--long", "8,16", "--no-decode"]))
    assert s.presets == ("softmax", "gmm") and s.long == (8, 16) and s.calls == ("train",)


def test_rejects_bad_lengths(bench, capsys):
    for bad in ("128,x", "1"):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(["--long", bad])
        assert e.value.code == 2 and "--long" in capsys.readouterr().err


def test_profile_tables_say_where_the_time_goes(bench, tmp_path):
    """--profile: profiled calls per model; the table names each preset's extra operators against stock."""
    out = tmp_path / "profile.json"
    run_script(bench, ["--presets", "rela-g", *SENTENCE, "--no-memory", "--profile", "--output", str(out)])
    rows = {r["preset"]: r for r in json.loads(out.read_text())["rows"]}
    for r in rows.values():
        for kind in ("train", "decode"):
            prof = r[f"{kind}_profile"]
            assert prof["wall_s"] > 0 and 0 < prof["op_s"] and sum(prof["ops"].values()) <= prof["op_s"] + 1e-9
            assert list(prof["ops"].values()) == sorted(prof["ops"].values(), reverse=True)
    assert any("scaled_dot_product" in op for op in rows["stock-sdpa"]["train_profile"]["ops"])
    # rela-g's attention is several operators where stock's is one SDPA call
    assert rows["rela-g"]["decode_profile"]["op_calls"] > rows["stock-sdpa"]["decode_profile"]["op_calls"] > 0
    table = out.with_suffix(".md").read_text()
    assert "Where the time goes" in table and "| rela-g | train |" in table and "| softmax | decode |" in table

    long_out = tmp_path / "long_profile.json"
    run_script(bench, [*LONG, "--no-memory", "--profile", "--output", str(long_out)])
    assert "| softmax (L=24) | fwd_bwd |" in long_out.with_suffix(".md").read_text()


def test_gmm_budget_gives_shares_of_stock_time(tmp_path):
    """scripts/gmm_budget.py: GMM's parts timed against stock in the same rounds, per training step and decode."""
    budget = load_script("gmm_budget")
    out = tmp_path / "budget.json"
    result = run_script(budget, ["--rounds", "2", "--output", str(out), *SENTENCE])
    layers, new_tokens = 1, 3
    for kind, calls in (("train", layers), ("decode", layers * new_tokens)):
        shares = result[kind]["shares"]
        assert {"ffn", "mixture", "attend", "sdpa", "attend - sdpa"} <= set(shares)
        assert all(v > 0 for k, v in shares.items() if k != "attend - sdpa")
        assert result[kind]["calls"]["ffn"] == calls
    # GMM's extra tensors in one layer: 4 FFNs (weight, mean, sigma, gate) x (hidden, out) x (weight, bias)
    assert result["train"]["calls"]["adamw (16 tensors)"] == 1
    assert json.loads(out.read_text())["settings"]["preset"] == "gmm"


def test_gmm_budget_rejects_a_preset_without_gmm(capsys):
    budget = load_script("gmm_budget")
    with pytest.raises(SystemExit):
        budget.main(["--preset", "rela-g", "--rounds", "1"])
    err = capsys.readouterr().err
    assert "--preset 'rela-g' does not use GMM cross-attention" in err and "gmm-strict" in err


def test_gmm_budget_table_rows_match_their_parts():
    budget = load_script("gmm_budget")
    shares = {"ffn": 0.05, "mixture": 0.02, "attend": 0.09, "sdpa": 0.03, "attend - sdpa": 0.06}
    result = {"settings": {"base": "marian", "d_model": 256, "layers": 3, "heads": 4, "rounds": 5},
              "train": {"shares": {**shares, "adamw (48 tensors)": 0.006}, "reference_median_s": 0.5},
              "decode": {"shares": {**shares, "attend - sdpa": 0.08}, "reference_median_s": 0.6}}
    rows = {line.split(" | ")[0][2:]: line for line in budget.render(result).splitlines() if line.startswith("| ")}
    assert rows["attend - sdpa"] == "| attend - sdpa | 6.0% | 8.0% |"
    assert rows["adamw (48 tensors)"] == "| adamw (48 tensors) | 0.6% |  |"


def test_compile_times_compiled_against_compiled(bench, tmp_path):
    """--compile BACKEND compiles every model in place, stock included, before its untimed warm-up calls; the FLOP
    and memory columns (measured on eager models) are left out. The cheap `eager` backend still runs dynamo."""
    config, counters = torch._dynamo.config, torch._dynamo.utils.counters
    limits = config.recompile_limit, config.accumulated_recompile_limit
    counters.clear()
    out = tmp_path / "compiled.json"
    try:
        run_script(bench, ["--presets", "softmax", *SENTENCE, "--compile", "eager", "--output", str(out)])
        # the hf-attn models share one class, hence dynamo's per-function graph cache: its limit grows with them
        assert config.recompile_limit >= 16 * 2
    finally:
        config.recompile_limit, config.accumulated_recompile_limit = limits
    result = json.loads(out.read_text())
    assert result["settings"]["compile"] == "eager" and result["settings"]["no_memory"]
    assert result["compile_fallbacks"] == []
    rows = {r["preset"]: r for r in result["rows"]}
    assert list(rows) == ["stock-sdpa", "softmax"]
    for r in rows.values():
        assert r["train_median_s"] > 0 and r["decode_median_s"] > 0 and "train_flop_ratio_vs_stock" not in r
        assert r["train_warmup_s"] > 0 and r["decode_warmup_s"] > 0
    assert counters["stats"]["unique_graphs"] > 0  # dynamo captured graphs
    table = out.with_suffix(".md").read_text()
    assert 'compiled in place with model.compile(backend="eager")' in table and "| softmax | " in table
    assert "untimed calls s (compiling)" in table and "FLOP bound" not in table and "WARNING" not in table


def test_compile_option_errors(bench, capsys):
    for bad, needle in ((["--compile", "inductr"], "not a torch.compile backend"),
                        (["--compile", "--long", "8"], "leave it out with --long"),
                        (["--compile", "--presets", "gmm,rela-g"], "one preset beside softmax per run, not 2")):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2 and needle in capsys.readouterr().err
    assert bench.parse_args(["--compile", "--presets", "gmm"]).compile == "inductor"


