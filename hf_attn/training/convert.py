"""`hf-attn convert`: a vanilla Marian/BART (or hf-attn) checkpoint -> a complete hf-attn model directory: config
with ``auto_map``, the modeling code, safetensors weights, generation config, tokenizer and the hf-attn model card,
ready for ``from_pretrained(..., trust_remote_code=True)``, `hf-attn train --init_from` or transformers'
`run_translation.py --model_name_or_path`."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi, ModelCard, constants

from ..data import load_tokenizer
from ..errors import HfAttnInputError
from ..io_utils import check_creatable_dir
from ..swap import swap_attention
from .cards import write_model_card
from .validate import check_preset


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def swapped_model(source: str, preset: str, tokenizer, label: str, **overrides):
    """`swap_attention` on ``source``, checked to load and to have an embedding for every token of ``tokenizer``;
    errors are one line starting with ``label`` (the flag or path the user gave)."""
    try:
        model = swap_attention(source, preset, **overrides)
    except OSError as e:
        raise HfAttnInputError(f"{label}: cannot load a model there ({_first_line(e)}); give a Marian/BART or hf-attn "
                               "model directory or Hub id") from None
    if model.config.vocab_size < len(tokenizer):
        raise HfAttnInputError(f"{label}: the model has {model.config.vocab_size} embeddings but its tokenizer "
                               f"{len(tokenizer)} tokens; give the tokenizer the model was trained with")
    return model


TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "source.spm", "vocab.json", "sentencepiece.bpe.model")


def _a_path(name: str) -> bool:
    """Whether ``name`` can only be a local path (absolute, relative with ``.``/``~``, or more than one ``/``),
    never a Hub id (user/name)."""
    return Path(name).expanduser().is_absolute() or name.startswith((".", "~")) or name.count("/") > 1


def check_source(name: str, label: str, what: str, fix: str, hub: bool = True) -> None:
    """A model or tokenizer source must be a directory or a Hub id: a path that is missing or a file is one line
    starting with ``label`` (the flag and value the user gave) and ending with ``fix``, before transformers tries it
    as a Hub id; with ``hub``, a Hub id must also be reachable (`check_hub`)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return
    if _a_path(name) or path.exists():
        raise HfAttnInputError(f"{label}: {'a file, not a' if path.exists() else 'no such'} {what}; {fix}")
    if hub:
        check_hub(name)


def check_hub(repo_id: str, timeout: float = 5.0) -> None:
    """A Hub id must be reachable before anything is loaded: offline (HF_HUB_OFFLINE=1) or unreachable within
    ``timeout`` seconds, one line at once, instead of transformers' retries (about a minute) and a misleading
    tokenizer error."""
    fix = ("convert a local directory instead (`hf-attn convert DIR OUTPUT_DIR`), after downloading it where the "
           f"Hub is reachable: `hf download {repo_id} --local-dir DIR`")
    if constants.HF_HUB_OFFLINE:
        raise HfAttnInputError(f"{repo_id!r} is not a local directory and the Hub is offline (HF_HUB_OFFLINE=1); {fix}")
    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - connection, DNS, timeout, 404 and 401 errors come in many classes
        what = "no such model on the Hub" if "404" in str(e) or "RepositoryNotFound" in type(e).__name__ else \
            f"the Hub cannot be reached ({type(e).__name__})"
        raise HfAttnInputError(f"{repo_id!r} is not a local directory and {what}; {fix}") from None


def source_languages(source: str, tokenizer) -> list[str]:
    """The languages a converted card names: the source's own card (its YAML ``language:`` list, read from the
    directory or, for a Hub id, downloaded), else the tokenizer's ``source_lang`` / ``target_lang`` (Marian) or
    ``src_lang`` / ``tgt_lang`` (mBART-style); empty when neither says."""
    local = Path(source).expanduser()
    try:  # a broken YAML header reads as no metadata, as in `cards.existing_card`
        card = ModelCard((local / "README.md").read_text(encoding="utf-8", errors="replace"),
                         ignore_metadata_errors=True) if local.is_dir() else ModelCard.load(source)
    except Exception:  # noqa: BLE001 - no card in the directory or on the Hub, or no network: the tokenizer says
        card = None
    langs = card.data.language if card is not None else None
    langs = [langs] if isinstance(langs, str) else langs
    if isinstance(langs, list) and langs and all(isinstance(x, str) for x in langs):
        return list(dict.fromkeys(langs))
    pairs = [(getattr(tokenizer, a, None), getattr(tokenizer, b, None))
             for a, b in (("source_lang", "target_lang"), ("src_lang", "tgt_lang"))]
    for src, tgt in pairs:
        if isinstance(src, str) and isinstance(tgt, str) and src and tgt:
            return list(dict.fromkeys(x.split("_")[0] for x in (src, tgt)))
    return []


def convert_checkpoint(source: str, output_dir: str, preset: str = "rela-g", tokenizer: str | None = None,
                       **overrides) -> Path:
    """Swap ``preset``'s attention into the checkpoint ``source`` (a directory or Hub id; see `swap_attention`) and
    save model, tokenizer (from ``tokenizer``, default ``source``) and card to ``output_dir`` (new or empty)."""
    check_preset(preset)
    local = Path(source).expanduser()
    check_source(source, repr(source), "model directory",
                 "give a Marian/BART or hf-attn model directory or Hub id (user/name)", hub=False)  # Hub: below
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HfAttnInputError(f"output directory {output_dir!r} exists and is not empty; give a new or empty "
                               "directory")
    check_creatable_dir(out, "output directory")
    if not local.is_dir():
        check_hub(source)
    tok_source = tokenizer or source
    if tokenizer:
        check_source(tokenizer, f"--tokenizer {tokenizer!r}", "directory",
                     "give a directory with tokenizer files, or a Hub id (user/name)")
    if Path(tok_source).expanduser().is_dir() and not any(
            (Path(tok_source).expanduser() / f).is_file() for f in TOKENIZER_FILES):
        raise HfAttnInputError(f"{tok_source!r} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); the converted "
                               "directory needs one: give --tokenizer DIR (a directory with tokenizer files)")
    try:
        tok = load_tokenizer(tok_source)
    except HfAttnInputError:
        raise  # already one line naming the directory
    except (OSError, ValueError, TypeError) as e:
        raise HfAttnInputError(f"cannot load a tokenizer from {tok_source!r} ({_first_line(e)}); the converted "
                               "directory needs one: give --tokenizer DIR (a directory with tokenizer files)") from None
    model = swapped_model(source, preset, tok, repr(source), **overrides)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # what `check_creatable_dir` cannot see beforehand (a read-only or virtual file system)
        raise HfAttnInputError(f"output directory {output_dir!r} cannot be created ({e.strerror or e}); choose a "
                               "directory you can write to") from None
    # what the card says of the model's origin, kept in config.json so that it survives later saves (a Trainer's)
    model.config.hf_attn_card = {"converted_from": source, "base_model": source if not local.is_dir() else None,
                                 "languages": source_languages(source, tok)}
    model.save_pretrained(out)  # config (auto_map), modeling code, weights, generation_config.json
    tok.save_pretrained(out)
    write_model_card(out, converted_from=source)
    return out
