"""The attention viewer without a browser: its data for every variant, the overlays' values, the page, the CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from viewer_helpers import REFERENCES, SOURCES, VARIANT_PRESETS, WordTokenizer, tiny_viewer_data, viewed

from hf_attn.analysis import viewer
from hf_attn.analysis.stats import collect_attentions
from hf_attn.cli import main
from hf_attn.errors import HfAttnInputError


def dq(values) -> torch.Tensor:
    return viewer.dequantize(values)


def layers(data, site, model=0, sentence=0):
    return data["sentences"][sentence]["models"][model]["sites"][site]


def test_every_variant_has_a_family():
    from hf_attn import ATTENTION_VARIANTS

    assert set(viewer.FAMILIES) == set(ATTENTION_VARIANTS) == set(VARIANT_PRESETS)
    assert set(viewer.FAMILIES.values()) == {"softmax", "rela", "gmm", "reluformer", "calibration", "ran"}


def test_quantize_keeps_exact_zeros_apart_from_small_weights():
    w = torch.tensor([0.0, 1e-7, -1e-7, 0.0004, 0.0006, 0.25, 1.5, -0.3])
    assert viewer.quantize(w) == [0, 1, -1, 1, 1, 250, 1500, -300]


@pytest.mark.parametrize("variant, preset", sorted(VARIANT_PRESETS.items()))
def test_every_variant_gives_a_viewer(variant, preset, tmp_path):
    data = tiny_viewer_data(preset)
    model = data["models"][0]
    assert model["preset"] == preset and viewer.FAMILIES[variant] in model["families"]
    used = {v for site in model["layout"].values() for v in site}
    assert variant in used
    for sentence in data["sentences"]:
        view = sentence["models"][0]
        S, T = len(view["source_tokens"]), len(view["target_tokens"])
        assert len(view["decoder_tokens"]) == T
        for site, (rows, cols) in {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}.items():
            for layer in view["sites"][site]:
                w = dq(layer["weights"])
                assert w.shape == (4, rows, cols)
                assert len(layer["null_rows"]) == 4 and len(layer["null_rows"][0]) == rows
                assert set(layer["stats"]) == {"sparsity", "null_rate", "entropy"}
                assert all(len(v) == 4 for v in layer["stats"].values())
                if site == "decoder":  # later positions are hidden, stored as 0
                    assert (w.triu(1) == 0).all()
    page = tmp_path / "v.html"
    page.write_text(viewer.render_html(data), encoding="utf-8")
    assert viewer.read_viewer_data(page) == json.loads(json.dumps(data))


def test_rela_null_rows_are_exactly_the_all_zero_rows():
    data = tiny_viewer_data("rela-g", sentences=4)
    nulls = 0
    for s in range(4):
        for site in ("encoder", "decoder", "cross"):
            for layer in layers(data, site, sentence=s):
                w = torch.tensor(layer["weights"])
                visible = torch.ones_like(w[0], dtype=torch.bool)
                if site == "decoder":
                    visible = visible.tril()
                all_zero = ((w == 0) | ~visible).all(-1)
                assert torch.equal(torch.tensor(layer["null_rows"], dtype=torch.bool), all_zero)
                nulls += int(all_zero.sum())
                # sparsity per head: the share of exact zeros among the visible entries
                zeros = ((w == 0) & visible).sum((1, 2)).float() / visible.sum()
                assert torch.allclose(torch.tensor(layer["stats"]["sparsity"]), zeros, atol=1e-3)
                assert "row_sums" in layer
    assert nulls > 0  # the random rela-g model does switch heads off: the check above saw null rows


def test_exact_zeros_match_the_model():
    model = viewed("rela-g")
    data = viewer.viewer_data([model], SOURCES[:1], REFERENCES[:1])
    enc = WordTokenizer()(SOURCES[0], text_target=REFERENCES[0])
    attn = collect_attentions(model.model, **enc)
    for site, sa in attn.items():
        for i, w in enumerate(sa.weights):
            stored = torch.tensor(layers(data, site)[i]["weights"])
            real = (w * sa.keep)[0]
            assert torch.equal(stored == 0, real == 0)
            assert torch.allclose(dq(stored.tolist()), real, atol=1e-3)


def test_gmm_components_gate_and_maps():
    from hf_attn.analysis.gmm import gmm_parameters

    model = viewed("gmm")
    data = viewer.viewer_data([model], SOURCES[:1], REFERENCES[:1])
    enc = WordTokenizer()(SOURCES[0], text_target=REFERENCES[0])
    records = gmm_parameters(model.model, **enc)
    J = enc["input_ids"].shape[1]
    for i, layer in enumerate(layers(data, "cross")):
        assert layer["variant"] == "gmm"
        comps = layer["components"]
        mu, sigma, weight = (torch.tensor(comps[k]) for k in ("mu", "sigma", "weights"))
        assert mu.shape == sigma.shape == weight.shape == records[i]["mu"][0].shape  # [H, T, K]
        assert ((mu >= 0) & (mu <= J)).all() and (sigma > 0).all()
        assert torch.allclose(weight.sum(-1), torch.ones(()), atol=0.03)
        assert torch.allclose(torch.tensor(layer["gate"]), records[i]["gate"][0], atol=1e-3)
        assert set(layer["maps"]) == {"dot-product alpha", "Gaussian mixture beta"}
        assert torch.allclose(dq(layer["maps"]["Gaussian mixture beta"]), records[i]["beta"][0], atol=1e-3)
        assert torch.allclose(dq(layer["weights"]), records[i]["gamma"][0], atol=1e-3)  # the fused weights
    assert "components" not in layers(data, "decoder")[0]


def test_calibration_mask_and_maps():
    data = tiny_viewer_data("calibration-gate")
    for layer in layers(data, "cross"):
        maps = {k: dq(v) for k, v in layer["maps"].items()}
        assert set(maps) == {"original attention a", "calibrated a * exp(1 - m)", "mask m"}
        m, a = maps["mask m"], maps["original attention a"]
        assert ((m >= 0) & (m <= 1)).all()
        assert torch.allclose(maps["calibrated a * exp(1 - m)"], a * torch.exp(1 - m), atol=5e-3)
        assert torch.allclose(a.sum(-1), torch.ones(()), atol=0.02)  # softmax rows
        assert len(layer["gate"]) == 4
    assert layers(data, "encoder")[0]["maps"] == {}


def test_ran_position_maps():
    data = tiny_viewer_data("ran-all", sentences=3)
    maps = data["models"][0]["position_maps"]
    assert set(maps) == {"encoder", "decoder"} and set(maps["encoder"]) == {"0", "1"}
    longest = max(len(s["models"][0]["source_tokens"]) for s in data["sentences"])
    enc = dq(maps["encoder"]["0"])
    assert enc.shape == (4, longest, longest)
    assert torch.allclose(enc.sum(-1), torch.ones(()), atol=0.02)  # softmax over positions
    dec = dq(maps["decoder"]["1"])
    assert (dec.triu(1) == 0).all() and torch.allclose(dec.sum(-1), torch.ones(()), atol=0.02)
    assert tiny_viewer_data("softmax")["models"][0]["position_maps"] == {}


def test_reluformer_row_sums():
    data = tiny_viewer_data("reluformer")
    for site in ("encoder", "decoder", "cross"):
        for layer in layers(data, site):
            assert torch.allclose(torch.tensor(layer["row_sums"]), dq(layer["weights"]).sum(-1), atol=0.02)
    assert "row_sums" not in layers(tiny_viewer_data("softmax"), "cross")[0]


def test_side_by_side_needs_one_tokenizer():
    data = tiny_viewer_data("softmax", "rela-g")
    assert [m["name"] for m in data["models"]] == ["softmax", "rela-g"]
    assert all(len(s["models"]) == 2 for s in data["sentences"])
    a, b = data["sentences"][0]["models"]
    assert a["source_tokens"] == b["source_tokens"] and a["target_tokens"] == b["target_tokens"]
    other = viewed("rela-g", tokenizer=WordTokenizer(offset=7))
    with pytest.raises(HfAttnInputError, match="another tokenizer.*separate files"):
        viewer.viewer_data([viewed("softmax"), other], SOURCES[:1], REFERENCES[:1])


def test_page_is_self_contained(tmp_path):
    page = viewer.render_html(tiny_viewer_data("gmm"), "a <title> & more")
    assert "http://" not in page and "https://" not in page
    assert "<script src" not in page and "<link" not in page and "{{" not in page
    assert "<title>a &lt;title&gt; &amp; more</title>" in page


def test_preview_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = viewer.write_preview(tiny_viewer_data("rela-g"), tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_preview_title_names_the_preset_once_when_the_run_is_named_after_it():
    assert viewer.preview_title({"name": "rela-g", "preset": "rela-g"}, 3, True) == (
        "rela-g: cross-attention, layer 3, mean over heads; grey = exactly 0")
    assert viewer.preview_title({"name": "run7", "preset": "gmm"}, 2, False) == (
        "run7 (gmm): cross-attention, layer 2, mean over heads")


# ---- a trained run: train writes the viewer, the card links it, the CLI writes more -------------------------------------
@pytest.mark.slow
def test_train_writes_the_viewer_and_the_card_links_it(trained):
    data = viewer.read_viewer_data(trained / "viewer.html")
    assert len(data["sentences"]) == viewer.RUN_VIEWER_SENTENCES
    assert data["sentences"][0]["forced_on"] == "reference"
    hyps = (trained / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    assert [s["models"][0]["translation"] for s in data["sentences"]] == hyps[: viewer.RUN_VIEWER_SENTENCES]
    assert (trained / "viewer_preview.png").is_file()
    card = (trained / "README.md").read_text(encoding="utf-8")
    assert "](viewer_preview.png)" in card and "](viewer.html)" in card


@pytest.mark.slow
def test_card_links_the_viewer_only_when_there_is_one(trained, tmp_path):
    from hf_attn.training.cards import write_model_card

    d = tmp_path / "run"
    shutil.copytree(trained, d, ignore=shutil.ignore_patterns("checkpoint-*", "viewer*"))
    card = write_model_card(d).read_text(encoding="utf-8")
    assert "viewer.html" not in card and "$viewer_section" not in card and "## Attention\n" not in card
    shutil.copy(trained / "viewer.html", d)
    card = write_model_card(d).read_text(encoding="utf-8")
    assert "](viewer.html)" in card and "viewer_preview.png" not in card
    (d / "results.json").unlink()  # a directory without a run: the directory card links it too
    (d / "README.md").unlink()
    assert "](viewer.html)" in write_model_card(d).read_text(encoding="utf-8")


@pytest.mark.slow
def test_view_cli(trained, tmp_path, capsys):
    out = tmp_path / "a.html"
    assert main(["view", str(trained), "--sentences", "3", "--output", str(out), "--preview",
                 str(tmp_path / "a.png")]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    data = viewer.read_viewer_data(out)
    assert len(data["sentences"]) == 3 and data["models"][0]["preset"] == "rela-g"
    assert (tmp_path / "a.png").is_file()
    assert main(["view", str(trained), "--text", "Im Anfang war das Wort.", "--output", str(out)]) == 0
    data = viewer.read_viewer_data(out)
    sentence = data["sentences"][0]
    assert sentence["reference"] is None and sentence["forced_on"] == "translation"
    assert sentence["source"] == "Im Anfang war das Wort."
    side = tmp_path / "side.html"
    assert main(["view", str(trained), str(tmp_path / "copy"), "--output", str(side), "--sentences", "1"]) == 2
    shutil.copytree(trained, tmp_path / "copy", ignore=shutil.ignore_patterns("checkpoint-*"))
    capsys.readouterr()
    assert main(["view", str(trained), str(tmp_path / "copy"), "--output", str(side), "--sentences", "1"]) == 0
    assert [m["name"] for m in viewer.read_viewer_data(side)["models"]] == [trained.name, "copy"]


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["{missing}"], "is not a directory"),
    (["{empty}"], "holds no config.json"),
    (["{run}", "--sentences", "0"], "--sentences 0: need at least 1"),
    (["{run}", "--text", "  "], "--text is empty"),
    (["{run}", "{run}"], "is given twice"),
    (["{run}", "--max_tokens", "1"], "--max_tokens 1"),
    (["{bare}"], "no run_args.json to find its test split; give --text"),
    (["{run}", "--text", "Wort", "--test_file", "{missing}"], "not both"),
])
def test_view_bad_input_gives_one_line(trained, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    bare = tmp_path / "bare"  # a save_pretrained directory: no run_args.json
    shutil.copytree(trained, bare, ignore=shutil.ignore_patterns("checkpoint-*", "run_args.json"))
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "run": trained, "bare": bare}
    argv = ["view", *[a.format(**{k: str(v) for k, v in paths.items()}) for a in args],
            "--output", str(tmp_path / "out.html")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hf-attn: error:") and message in err
    assert not (tmp_path / "out.html").exists()


@pytest.fixture(scope="module")
def stock_marian(tmp_path_factory):
    from viewer_helpers import stock_model_dir

    root = tmp_path_factory.mktemp("stock")
    return stock_model_dir("marian", root / "stock-marian", root / "tokenizers")


def test_stock_model_loads_with_eager_attention(stock_marian):
    """A stock directory loads with SDPA, which returns no weights: the viewer switches it to eager."""
    vm = viewer.load_viewed(stock_marian, "stock")
    assert vm.model.config._attn_implementation == "eager"
    view = viewer.sentence_view(vm.model, vm.tokenizer, SOURCES[0], REFERENCES[0], 64)
    assert [len(view["sites"][s]) for s in ("encoder", "decoder", "cross")] == [2, 2, 2]
    vm.model.set_attn_implementation("sdpa")  # what the page showed before: no weights -> one line, no page
    with pytest.raises(HfAttnInputError, match="returned no attention weights for the encoder, decoder, cross"):
        viewer.sentence_view(vm.model, vm.tokenizer, SOURCES[0], REFERENCES[0], 64)


@pytest.mark.parametrize("case, message", [
    ("t5", "holds a t5 model: the viewer shows Marian and BART"),
    ("untyped", "holds a untyped model"),
    ("no-tokenizer", "holds no tokenizer"),
    ("max-tokens", "--max_tokens 100 exceeds the 64 positions"),
    ("empty-text", "--text is empty"),
])
def test_view_refuses_what_it_cannot_show_in_one_line(stock_marian, tmp_path, capsys, case, message):
    d = tmp_path / case
    shutil.copytree(stock_marian, d)
    config = json.loads((d / "config.json").read_text())
    if case in ("t5", "untyped"):
        config["model_type"] = "t5" if case == "t5" else None
        (d / "config.json").write_text(json.dumps(config))
    if case == "no-tokenizer":
        for name in viewer.TOKENIZER_FILES:
            (d / name).unlink(missing_ok=True)
    extra = ["--max_tokens", "100"] if case == "max-tokens" else []
    text = "" if case == "empty-text" else "und gott sprach"
    out = tmp_path / "out.html"
    assert main(["view", str(d), "--text", text, "--output", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hf-attn: error:") and message in err, err
    assert not out.exists()
