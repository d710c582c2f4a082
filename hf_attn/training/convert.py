"""`hf-attn convert`: a vanilla Marian/BART (or hf-attn) checkpoint -> a complete hf-attn model directory: config
with ``auto_map``, the modeling code, safetensors weights, generation config, tokenizer and the hf-attn model card,
ready for ``from_pretrained(..., trust_remote_code=True)``, `hf-attn train --init_from` or transformers'
`run_translation.py --model_name_or_path`."""

from __future__ import annotations

from pathlib import Path

from ..errors import HfAttnInputError


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def swapped_model(source: str, preset: str, tokenizer, label: str, **overrides):
    """`swap_attention` on ``source``, checked to load and to have an embedding for every token of ``tokenizer``;
    errors are one line starting with ``label`` (the flag or path the user gave)."""
    from .. import swap_attention

    try:
        model = swap_attention(source, preset, **overrides)
    except OSError as e:
        raise HfAttnInputError(f"{label}: cannot load a model there ({_first_line(e)}); give a Marian/BART or hf-attn "
                               "model directory or Hub id") from None
    if model.config.vocab_size < len(tokenizer):
        raise HfAttnInputError(f"{label}: the model has {model.config.vocab_size} embeddings but its tokenizer "
                               f"{len(tokenizer)} tokens; give the tokenizer the model was trained with")
    return model


def convert_checkpoint(source: str, output_dir: str, preset: str = "rela-g", tokenizer: str | None = None,
                       **overrides) -> Path:
    """Swap ``preset``'s attention into the checkpoint ``source`` (a directory or Hub id; see `swap_attention`) and
    save model, tokenizer (from ``tokenizer``, default ``source``) and card to ``output_dir`` (new or empty)."""
    from ..data import load_tokenizer
    from .cards import write_model_card
    from .run import _check_preset

    _check_preset(preset)
    local = Path(source).expanduser()
    if not local.is_dir() and (local.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1):
        raise HfAttnInputError(f"{source!r}: no such model directory; give a Marian/BART or hf-attn model directory "
                               "or Hub id (user/name)")
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HfAttnInputError(f"output directory {output_dir!r} exists and is not empty; give a new or empty "
                               "directory")
    tok_source = tokenizer or source
    try:
        tok = load_tokenizer(tok_source)
    except (OSError, ValueError, TypeError) as e:
        raise HfAttnInputError(f"cannot load a tokenizer from {tok_source!r} ({_first_line(e)}); the converted "
                               "directory needs one: give --tokenizer DIR (a directory with tokenizer files)") from None
    model = swapped_model(source, preset, tok, repr(source), **overrides)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # config (auto_map), modeling code, weights, generation_config.json
    tok.save_pretrained(out)
    write_model_card(out, converted_from=source)
    return out
