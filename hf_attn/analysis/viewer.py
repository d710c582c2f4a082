"""``hf-attn view``: one self-contained HTML file to look at the attention of one or more models, sentence by sentence.

    hf-attn view runs/softmax runs/rela-g --sentences 20 --output attention.html
    hf-attn view runs/gmm --text "Im Anfang war das Wort." --output gmm.html

For each sentence (the first ``--sentences`` pairs of the first run's test split, or ``--text``) and each model, one
teacher-forced forward pass (on the reference; on the model's own translation for ``--text``) gives the attention
weights of every site (encoder, decoder, cross) and layer. The statistics come from `stats` (sparsity, null rate,
entropy per head; the null rows), the variants' internal maps from `gmm`, `calibration` and `ran`:

* ReLA / ReLUFormer (unnormalised ReLU weights): the null rows (all weights exactly 0) and every row's sum;
* GMM cross-attention: the K components (mu, sigma, weight) and the gate of every target token, and the
  dot-product (alpha) and mixture (beta) maps beside the fused weights;
* attention calibration: the mask m, the original attention a and the calibrated a * exp(1 - m);
* RAN and the Synthesizer: the learned, input-independent position maps.

Weights are stored as integers ``round(w * 1000)`` (3 decimals); a weight that is not exactly 0 never rounds to 0,
so 0 in the file means an exact zero. The data are JSON, deflated and base64-encoded into the page, which inflates
them with the browser's DecompressionStream: no network, no CDN, one file (about 0.04-0.15 MB per sentence and
model of the default 3+3-layer size and up to 64 tokens).

Any Marian or BART directory can be viewed: an hf-attn model, or a stock ``MarianMTModel`` /
``BartForConditionalGeneration`` (loaded with eager attention, so that it returns its softmax weights), with its
tokenizer beside it. What the viewer cannot show (another model type, no tokenizer, a model that returns no attention
weights) is refused with one line before any page is written.

Side by side, the models must share one tokenizer (the same vocabulary): their heat maps then have the same axes
and can be compared cell by cell. Models with different tokenizers go into separate files.
"""

from __future__ import annotations

import base64
import html
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import HfAttnInputError
from ..generation import decoding_settings, translate_texts
from ..io_utils import check_output_file
from ..modeling.bases import BASES
from ..modeling.hyperparameters import SITES
from ..rundir import check_model_files, load_model_dir, read_run_args, run_pairs
from .calibration import calibration_maps, calibration_modules
from .common import pyplot, save_figure
from .gmm import gmm_modules, gmm_parameters
from .ran import learned_attention, learned_modules
from .stats import collect_attentions, entropy, null_rate, null_rows, sparsity_rate

ASSETS = Path(__file__).with_name("viewer_assets")
SCALE = 1000  # weights stored as round(w * SCALE): 3 decimals
ROW_SUM_VARIANTS = ("rela", "reluformer")  # unnormalised ReLU weights: the rows do not sum to 1
FAMILIES = {  # the viewer's variant families, by attention variant (softmax: the baselines' family)
    "softmax": "softmax", "sparsemax": "softmax", "entmax15": "softmax", "rela": "rela", "gmm": "gmm",
    "reluformer": "reluformer", "calibrated": "calibration", "recurrent": "ran", "synthesizer": "ran",
    "hard-gaussian": "ran",
}
VIEWABLE_TYPES = {base.name: base.model_types for base in BASES.values()}  # stock and hf-attn model_type per base
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "source.spm", "vocab.json", "spiece.model")
RUN_VIEWER_SENTENCES = 5  # what `hf-attn train` writes into the run directory
VIEWER_FILE, PREVIEW_FILE = "viewer.html", "viewer_preview.png"


@dataclass
class ViewedModel:
    """A model, its tokenizer and the name its panel carries."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    path: str = ""
    translations: list[str] = field(default_factory=list)


# ---- numbers into the page --------------------------------------------------------------------------------------------
def quantize(w: torch.Tensor) -> list:
    """``round(w * SCALE)`` as nested lists of ints; a weight that is not exactly 0 keeps at least +-1, so 0 means an
    exact zero (ReLA's and sparsemax's zeros stay distinct from small weights)."""
    w = w.detach().double().cpu()
    q = torch.round(w * SCALE)
    q = torch.where((q == 0) & (w != 0), torch.sign(w), q)
    return q.long().tolist()


def rounded(x: torch.Tensor, digits: int = 3) -> list:
    """Floats rounded to ``digits`` decimals, as nested lists (NaN becomes None)."""
    x = x.detach().double().cpu()
    values = torch.round(x * 10**digits) / 10**digits
    return _nan_to_none(values.tolist())


def _nan_to_none(v):
    if isinstance(v, list):
        return [_nan_to_none(x) for x in v]
    return None if v != v else v


# ---- what one model does on one sentence ------------------------------------------------------------------------------
def attention_layout(model) -> dict[str, list[str]]:
    """``{site: [variant per layer]}``; a stock Marian/BART model (no hf-attn config) is softmax everywhere."""
    if hasattr(model.config, "attention_layout"):
        return model.config.attention_layout()
    cfg = model.config
    return {"encoder": ["softmax"] * cfg.encoder_layers, "decoder": ["softmax"] * cfg.decoder_layers,
            "cross": ["softmax"] * cfg.decoder_layers}


def layer_view(variant: str, w: torch.Tensor, keep: torch.Tensor, detail: dict | None) -> dict:
    """One layer of one sentence (``w`` [1, H, T, S], ``keep`` [1, 1, T, S]): the weights, the per-head statistics
    and null rows of `stats`, and the variant's own quantities (``detail``: its `gmm_parameters` /
    `calibration_maps` record)."""
    keep = keep.expand_as(w)
    out = {
        "variant": variant,
        "weights": quantize((w * keep)[0]),
        "null_rows": null_rows(w, keep)[0].int().tolist(),
        "stats": {"sparsity": rounded(sparsity_rate(w, keep)), "null_rate": rounded(null_rate(w, keep)),
                  "entropy": rounded(entropy(w, keep))},
        "maps": {},
    }
    if variant in ROW_SUM_VARIANTS:
        out["row_sums"] = rounded((w * keep).sum(-1)[0])
    if detail is not None and variant == "gmm":
        out["weights_label"] = "fused weights gamma (what the model attends with)"
        out["maps"] = {label: quantize(detail[key][0]) for key, label in
                       (("alpha", "dot-product alpha"), ("beta", "Gaussian mixture beta"))
                       if detail.get(key) is not None}
        out["components"] = {k: rounded(detail[k][0], 2) for k in ("mu", "sigma", "weights")}
        if detail.get("gate") is not None:
            out["gate"] = rounded(detail["gate"][0])
    elif detail is not None and variant == "calibrated":
        out["weights_label"] = "combined weights (what the model attends with)"
        out["maps"] = {"original attention a": quantize(detail["attention"][0]),
                       "calibrated a * exp(1 - m)": quantize(detail["calibrated"][0]),
                       "mask m": quantize(detail["mask"][0])}
        if detail.get("gate") is not None:
            out["gate"] = rounded(detail["gate"][0])
    return out


@torch.no_grad()
def sentence_view(model, tokenizer, source: str, target: str, max_tokens: int) -> dict:
    """Every site and layer of ``model`` on one pair, teacher-forced on ``target`` (see `layer_view`)."""
    device = next(model.parameters()).device
    enc = tokenizer(source, text_target=target, return_tensors="pt", truncation=True, max_length=max_tokens)
    batch = {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device),
             "labels": enc["labels"].to(device)}
    attn = collect_attentions(model, **batch)
    check_attentions(model, attn)
    details = {}
    if gmm_modules(model):
        details.update({("cross", i): rec for i, rec in gmm_parameters(model, **batch).items()})
    if calibration_modules(model):
        details.update({("cross", i): rec for i, rec in calibration_maps(model, **batch).items()})
    layout = attention_layout(model)
    decoder_inputs = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    return {
        "source_tokens": tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist()),
        "target_tokens": tokenizer.convert_ids_to_tokens(batch["labels"][0].tolist()),
        "decoder_tokens": tokenizer.convert_ids_to_tokens(decoder_inputs[0].tolist()),
        "sites": {site: [layer_view(layout[site][i], w, sa.keep, details.get((site, i)))
                         for i, w in enumerate(sa.weights)] for site, sa in attn.items()},
    }


def check_attentions(model, attn: dict) -> None:
    """One line when the forward pass returned no attention weights for a site (an attention implementation such as
    SDPA or FlashAttention computes none): the page would have nothing to draw."""
    missing = [site for site in SITES if not (site in attn and attn[site].weights)]
    if missing:
        impl = getattr(model.config, "_attn_implementation", None)
        raise HfAttnInputError(
            f"the model ({type(model).__name__}, attention implementation {impl!r}) returned no attention weights for "
            f"the {', '.join(missing)} site(s); load it with attn_implementation=\"eager\" (`hf-attn view` does so for "
            "the stock Marian and BART models it loads)")


def position_maps(model, lengths: dict[str, int]) -> dict:
    """RAN's / the Synthesizer's learned position maps (`ran.learned_attention`), ``{site: {layer: [H, n, n]}}`` with
    n the longest input of that site among the viewed sentences; {} for a model without such layers."""
    modules = learned_modules(model)
    out = {}
    for site in modules:
        n = lengths.get(site, 0)
        if n:
            out[site] = {str(i): quantize(m) for i, m in learned_attention(model, length=n)[site].items()}
    return out


# ---- the page's data ----------------------------------------------------------------------------------------------
def check_tokenizers(models: list[ViewedModel]) -> None:
    """One line when side-by-side models do not share a tokenizer (their heat maps would not share their axes)."""
    first = models[0]
    vocab = first.tokenizer.get_vocab()
    for other in models[1:]:
        if other.tokenizer.get_vocab() != vocab:
            raise HfAttnInputError(
                f"{other.path or other.name!r} has another tokenizer than {first.path or first.name!r} "
                f"({len(other.tokenizer.get_vocab()):,} vs {len(vocab):,} tokens, or different ids): side by side the "
                "heat maps must share their token axes; view these models in separate files")


def viewer_data(models: list[ViewedModel], sources: list[str], references: list[str | None], description: str = "",
                max_tokens: int = 64, progress: bool = False) -> dict:
    """Everything the page shows, as JSON-ready data: ``{"models": [...], "sentences": [...], ...}``. Each model's
    ``translations`` (one per source) must be filled in; a pair without a reference is teacher-forced on each
    model's own translation."""
    from tqdm.auto import tqdm

    if not models:
        raise HfAttnInputError("no model to view; give at least one model directory")
    if not sources:
        raise HfAttnInputError("no sentence to view; give --sentences N (N >= 1) or --text \"...\"")
    check_tokenizers(models)
    sentences = [{"source": s, "reference": r, "forced_on": "reference" if r else "translation", "models": []}
                 for s, r in zip(sources, references)]
    lengths: list[dict[str, int]] = [{} for _ in models]
    steps = tqdm(total=len(models) * len(sources), desc="attention viewer", unit="sentence", disable=not progress)
    for m, vm in enumerate(models):
        vm.model.eval()
        for s, sent in enumerate(sentences):
            target = sent["reference"] or vm.translations[s]
            view = sentence_view(vm.model, vm.tokenizer, sent["source"], target, max_tokens)
            view["translation"] = vm.translations[s]
            sent["models"].append(view)
            lengths[m]["encoder"] = max(lengths[m].get("encoder", 0), len(view["source_tokens"]))
            lengths[m]["decoder"] = max(lengths[m].get("decoder", 0), len(view["target_tokens"]))
            steps.update()
    steps.close()
    model_info = []
    for vm, n in zip(models, lengths):
        layout = attention_layout(vm.model)
        variants = sorted({v for site in layout.values() for v in site})
        model_info.append({
            "name": vm.name, "path": vm.path, "preset": getattr(vm.model.config, "preset", None) or "stock",
            "layout": layout, "families": sorted({FAMILIES.get(v, v) for v in variants}),
            "position_maps": position_maps(vm.model, n),
        })
    return {"format": 1, "scale": SCALE, "description": description, "models": model_info, "sentences": sentences}


def render_html(data: dict, title: str = "hf-attn attention viewer") -> str:
    """The self-contained page: the template with its CSS, script and the deflated, base64-encoded JSON inline."""
    payload = zlib.compress(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), 9)
    page = (ASSETS / "viewer.html").read_text(encoding="utf-8")
    parts = {
        "{{title}}": html.escape(title),
        "{{style}}": (ASSETS / "viewer.css").read_text(encoding="utf-8"),
        "{{script}}": (ASSETS / "viewer.js").read_text(encoding="utf-8"),
        "{{data}}": base64.b64encode(payload).decode("ascii"),
    }
    for key, value in parts.items():
        page = page.replace(key, value)
    return page


def read_viewer_data(path: str | Path) -> dict:
    """The data of a page written by `render_html` (for tests and for re-plotting)."""
    text = Path(path).read_text(encoding="utf-8")
    start = text.index('id="viewer-data">') + len('id="viewer-data">')
    blob = text[start:text.index("</script>", start)].strip()
    return json.loads(zlib.decompress(base64.b64decode(blob)).decode("utf-8"))


def dequantize(values, scale: int = SCALE) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32) / scale


def write_preview(data: dict, path: str | Path) -> Path:
    """A PNG of the first sentence's cross-attention, mean over heads, of the first model's top layer (exact zeros
    grey): the picture a model card embeds. Needs matplotlib."""
    import numpy as np

    plt = pyplot()
    sent = data["sentences"][0]
    view = sent["models"][0]
    layers = view["sites"]["cross"]
    w = dequantize(layers[-1]["weights"], data["scale"]).mean(0).numpy()
    src, tgt = view["source_tokens"], view["target_tokens"]
    shown = np.ma.masked_where(w == 0, w)
    cmap = plt.get_cmap("Blues").with_extremes(bad="#d9d9d9")
    fig, ax = plt.subplots(figsize=(min(0.32 * len(src) + 2.4, 12), min(0.3 * len(tgt) + 1.8, 10)))
    im = ax.imshow(shown, cmap=cmap, aspect="auto", vmin=0, interpolation="nearest")
    ax.set_xticks(range(len(src)), src, rotation=70, ha="right", fontsize=7)
    ax.set_yticks(range(len(tgt)), tgt, fontsize=7)
    ax.set_xlabel("source token")
    ax.set_ylabel("target token (predicted)")
    fig.colorbar(im, ax=ax, fraction=0.04)
    return Path(save_figure(fig, path, preview_title(data["models"][0], len(layers), bool((w == 0).any()))))


def preview_title(model: dict, layer: int, zeros: bool) -> str:
    """The preview's title: the model's name, its preset in brackets when the name differs from it (a run directory
    named after its preset says it once), the layer, and the grey cells' meaning when there are any."""
    who = model["name"] if model["name"] == model["preset"] else f"{model['name']} ({model['preset']})"
    return f"{who}: cross-attention, layer {layer}, mean over heads" + ("; grey = exactly 0" if zeros else "")


# ---- entry points -------------------------------------------------------------------------------------------------
def check_view_options(dirs: list[Path], output: Path, sentences: int | None, text: str | None,
                       max_tokens: int, test_file: str | None = None, num_beams: int | None = None,
                       preview: Path | None = None) -> None:
    """Validate `hf-attn view`'s input before loading anything: one line naming the value and the fix."""

    if sentences is not None and text is not None:
        raise HfAttnInputError("give --sentences N (pairs of the run's test split) or --text \"...\", not both")
    if text is not None and test_file:
        raise HfAttnInputError("give --text \"...\" (one sentence) or --test_file FILE (its pairs), not both")
    if sentences is not None and sentences < 1:
        raise HfAttnInputError(f"--sentences {sentences}: need at least 1, e.g. --sentences 20")
    if text is not None and not text.strip():
        raise HfAttnInputError("--text is empty; give the source sentence to view, e.g. --text \"Im Anfang war das Wort.\"")
    if max_tokens < 2:
        raise HfAttnInputError(f"--max_tokens {max_tokens}: need at least 2 (a token and the end of sentence)")
    if num_beams is not None and num_beams < 1:  # 0 is not "the model's beam": that is leaving the flag out
        raise HfAttnInputError(f"--num_beams {num_beams}: need at least 1, or leave it out for the model's beam")
    if not dirs:
        raise HfAttnInputError("no model directory given; give one, or two to compare them side by side")
    names = [str(d) for d in dirs]
    if len(set(names)) < len(names):
        raise HfAttnInputError(f"{next(n for n in names if names.count(n) > 1)!r} is given twice; give each model once")
    for d in dirs:
        if not Path(d).is_dir():
            raise HfAttnInputError(f"{str(d)!r} is not a directory; give a model directory written by `hf-attn train` "
                                   "or save_pretrained")
        check_model_files(str(d))
        check_viewable(Path(d), max_tokens)
    if text is None:
        read_run_args(dirs[0])  # a broken run_args.json fails here, with its own line
    check_output_file(output, "--output")
    if preview is not None:
        check_output_file(preview, "--preview")


def check_viewable(d: Path, max_tokens: int) -> str:
    """The ``model_type`` of the model in ``d`` (from its config.json), or one line when the viewer cannot show it:
    a model type other than Marian / BART (stock or hf-attn), no tokenizer beside the model, or fewer positions than
    ``max_tokens``."""
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        model_type = config.get("model_type") if isinstance(config, dict) else None
    except (OSError, ValueError) as e:
        raise HfAttnInputError(f"{str(d / 'config.json')!r} cannot be read as JSON ({type(e).__name__}); give a "
                               "directory written by `hf-attn train` or save_pretrained") from None
    valid = [t for types in VIEWABLE_TYPES.values() for t in types]
    if model_type not in valid:
        raise HfAttnInputError(f"{str(d)!r} holds a {model_type or 'untyped'} model: the viewer shows Marian and BART "
                               f"encoder-decoder models, stock or hf-attn (model_type {', '.join(valid)}); convert a "
                               "Marian/BART checkpoint with `hf-attn convert`, or view this one with its own tools")
    if not any((d / name).is_file() for name in TOKENIZER_FILES):
        raise HfAttnInputError(f"{str(d)!r} holds no tokenizer (no tokenizer_config.json); the viewer needs the "
                               "model's tokens: save it beside the model with tokenizer.save_pretrained(DIR)")
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and max_tokens > positions:
        raise HfAttnInputError(f"--max_tokens {max_tokens} exceeds the {positions} positions of {str(d)!r} "
                               f"(max_position_embeddings); give --max_tokens {positions} or less")
    return model_type


def load_viewed(d: Path, name: str) -> ViewedModel:
    """The model and tokenizer of ``d``; a stock model is switched to eager attention (SDPA, which it loads with,
    returns no attention weights)."""
    model, tokenizer = load_model_dir(str(d))
    if model.config.model_type in {types[0] for types in VIEWABLE_TYPES.values()}:  # stock Marian / BART
        model.set_attn_implementation("eager")
    return ViewedModel(name, model.eval(), tokenizer, str(d))


def panel_names(dirs: list[Path]) -> list[str]:
    """Short distinct names for the panels: the directory names, with their parent when two are equal."""
    names = [Path(d).resolve().name for d in dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{Path(d).resolve().parent.name}/{Path(d).resolve().name}" for d in dirs]


def write_viewer(dirs: list[Path], output: Path, sentences: int | None = None, text: str | None = None,
                 test_file: str | None = None, split: str = "test", max_tokens: int = 64, num_beams: int | None = None,
                 preview: Path | None = None, progress: bool = True) -> Path:
    """`hf-attn view`: load each model directory, pick the sentences (``text``, else the first ``sentences`` pairs
    (default 20) of the first directory's run split or of ``test_file``), translate them, and write the page to
    ``output`` (and the PNG preview to ``preview`` when given). Returns ``output``."""

    dirs = [Path(d) for d in dirs]
    output = Path(output)
    check_view_options(dirs, output, sentences, text, max_tokens, test_file, num_beams, preview)
    if text is not None:
        sources, references, description = [text.strip()], [None], "--text"
    else:
        n = sentences or 20
        if not test_file and not read_run_args(dirs[0]):
            raise HfAttnInputError(f"{str(dirs[0])!r} has no run_args.json to find its test split; give --text \"...\" "
                                   "or --test_file FILE")
        sources, references, description, _ = run_pairs(str(dirs[0]), split, test_file, max_samples=n)
        sources, references = sources[:n], references[:n]
        if not sources:
            raise HfAttnInputError(f"the {description} has no sentence pairs; give --text \"...\" or --test_file FILE")
    models = []
    for d, name in zip(dirs, panel_names(dirs)):
        models.append(load_viewed(d, name))
        check_tokenizers(models)  # before translating with the next model
    for vm in models:
        beams, penalty = decoding_settings(vm.model, num_beams, None)
        vm.translations = translate_texts(vm.model, vm.tokenizer, sources, num_beams=beams, length_penalty=penalty,
                                          max_source_length=max_tokens, progress=progress and len(sources) > 8,
                                          desc=f"translating ({vm.name})")
    data = viewer_data(models, sources, references, description, max_tokens, progress=progress)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_html(data, f"hf-attn attention: {', '.join(m.name for m in models)}"), encoding="utf-8")
    if preview is not None:
        write_preview(data, preview)
    return output


def write_run_viewer(out_dir: Path, model, tokenizer, sources: list[str], references: list[str],
                     translations: list[str], sentences: int = RUN_VIEWER_SENTENCES, description: str = "",
                     max_tokens: int = 64) -> list[Path]:
    """What `hf-attn train` leaves in its run directory: ``viewer.html`` on the first ``sentences`` test pairs and
    ``viewer_preview.png`` (when matplotlib is installed). Returns the files written."""
    out_dir = Path(out_dir)
    n = min(sentences, len(sources))
    if n == 0:
        return []
    vm = ViewedModel(out_dir.resolve().name, model, tokenizer, str(out_dir), list(translations[:n]))
    data = viewer_data([vm], list(sources[:n]), list(references[:n]), description, max_tokens)
    page = out_dir / VIEWER_FILE
    page.write_text(render_html(data, f"hf-attn attention: {vm.name}"), encoding="utf-8")
    written = [page]
    try:
        written.append(write_preview(data, out_dir / PREVIEW_FILE))
    except ImportError:  # matplotlib is an optional extra: the page alone
        pass
    return written
