"""SentencePiece tokenizers trained on the training split, saved as a `MarianTokenizer` or a BART-style fast
tokenizer, and cached on disk (``$HF_ATTN_CACHE`` or ``~/.cache/hf_attn``) so a second run reuses them.

* Marian layout (as the OPUS-MT models): one joint SentencePiece model serves both sides; ``</s>`` = 0,
  ``<unk>`` = 1, the pieces, then ``<pad>`` = last id (also the decoder start token). A source sentence
  encodes as ``pieces </s>``, and so does a target.
* BART layout: ``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3, the pieces, ``<mask>`` last; sentences
  encode as ``<s> pieces </s>``; a `tokenizers` Unigram model, so it loads with `AutoTokenizer` alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer, MarianTokenizer, PreTrainedTokenizerFast

from ..errors import HfAttnInputError

logger = logging.getLogger(__name__)

TOKENIZER_VERSION = "1"  # bump when the files written below change


def cache_root() -> Path:
    root = os.environ.get("HF_ATTN_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "hf_attn"


def _digest(texts, **settings) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]


def train_sentencepiece(texts: list[str], vocab_size: int, model_type: str = "unigram",
                        character_coverage: float = 1.0, seed: int = 0) -> bytes:
    """A serialized SentencePiece model with only ``<unk>`` as special piece (the layouts add their own)."""
    if vocab_size < 16:
        raise HfAttnInputError(f"--vocab_size {vocab_size} is too small; use at least 16 (8000 for the Bible)")
    if model_type not in ("unigram", "bpe"):
        raise HfAttnInputError(f"--spm_model_type {model_type!r} is not valid; valid: 'unigram', 'bpe'")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise HfAttnInputError("cannot train a tokenizer on an empty training split; give non-empty training data")
    model = io.BytesIO()
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, hard_vocab_limit=False, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        num_threads=max(1, min(os.cpu_count() or 1, 8)), input_sentence_size=2_000_000, shuffle_input_sentence=True,
        minloglevel=2, max_sentence_length=8192,
    )
    return model.getvalue()


def _pieces(spm_bytes: bytes) -> list[tuple[str, float]]:
    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size()) if not sp.is_unknown(i)
            and not sp.is_control(i)]


def build_marian_tokenizer(spm_bytes: bytes, out_dir: str | os.PathLike, max_length: int = 512):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {"</s>": 0, "<unk>": 1}
    for piece, _ in _pieces(spm_bytes):
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(spm_bytes)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0), encoding="utf-8")

    warnings.filterwarnings("ignore", message=".*sacremoses.*")
    tok = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                          model_max_length=max_length)
    tok.padding_side = "right"
    tok.save_pretrained(out)
    return tok


def build_bart_tokenizer(spm_bytes: bytes, out_dir: str | os.PathLike, max_length: int = 1024):
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    seen = {p for p, _ in vocab}
    for piece, score in _pieces(spm_bytes):
        if piece not in seen:
            vocab.append((piece, score))
            seen.add(piece)
    vocab.append(("<mask>", 0.0))
    tk = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tk.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>",
                                  model_max_length=max_length, padding_side="right")
    tok.save_pretrained(out_dir)
    return tok


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved in ``path``; files that cannot be read (a truncated or corrupt ``*.spm``, a broken
    ``vocab.json``) give one `HfAttnInputError` line naming the directory, never a SentencePiece traceback."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*sacremoses.*")
            tok = AutoTokenizer.from_pretrained(str(path))
        if len(tok) == 0:
            raise ValueError("an empty vocabulary")
    except Exception as e:  # noqa: BLE001 - sentencepiece, tokenizers and json raise many kinds; name the cause
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:150]
        if not Path(path).expanduser().is_dir():  # a Hub id: offline, unreachable, unknown or not cached
            raise HfAttnInputError(f"the tokenizer {str(path)!r} cannot be loaded ({type(e).__name__}: {why}); it is "
                                   "not a local directory: download it where the Hub is reachable (`hf download "
                                   f"{path} --local-dir DIR`) and give DIR") from None
        raise HfAttnInputError(f"the tokenizer in {str(path)!r} cannot be read ({type(e).__name__}: {why}); its files "
                               "are truncated or corrupt: restore them, or delete the directory's tokenizer files "
                               "and train again") from None
    tok.padding_side = "right"
    return tok


def get_tokenizer(train_texts: list[str], base: str = "marian", vocab_size: int = 8000, model_type: str = "unigram",
                  character_coverage: float = 1.0, cache_dir: str | os.PathLike | None = None, seed: int = 0):
    """Train (or reuse from the cache) a joint SentencePiece tokenizer on ``train_texts`` (both sides)."""
    if base not in ("marian", "bart"):
        raise HfAttnInputError(f"--base {base!r} is not valid; valid: 'marian', 'bart'")
    key = _digest(train_texts, base=base, vocab_size=vocab_size, model_type=model_type,
                  character_coverage=character_coverage, seed=seed, version=TOKENIZER_VERSION)
    root = Path(cache_dir) if cache_dir else cache_root() / "tokenizers"
    path = root / f"{base}-{model_type}{vocab_size}-{key}"
    if (path / "tokenizer_config.json").exists():
        try:
            tok = load_tokenizer(path)
            logger.info("reusing the cached tokenizer %s", path)
            print(f"[hf-attn] tokenizer: reusing {path}", flush=True)
            return tok, path
        except HfAttnInputError:  # a corrupt cache entry (a full disk, a crash): set aside, trained again
            aside = path.with_name(f"{path.name}.corrupt-{os.getpid()}")
            print(f"[hf-attn] tokenizer: the cached tokenizer {path} cannot be read; training it again", flush=True)
            try:
                path.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
            except OSError:  # another process set it aside first
                pass
    print(f"[hf-attn] tokenizer: training a joint SentencePiece {model_type} model ({vocab_size} pieces) on "
          f"{len(train_texts):,} sentences -> {path}", flush=True)
    spm_bytes = train_sentencepiece(train_texts, vocab_size, model_type, character_coverage, seed)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=root))
    try:
        (build_marian_tokenizer if base == "marian" else build_bart_tokenizer)(spm_bytes, tmp)
        try:
            tmp.rename(path)  # atomic: a concurrent process either sees the whole tokenizer or none
        except OSError:
            if not (path / "tokenizer_config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_tokenizer(path), path


def special_token_config(tokenizer, base: str) -> dict:
    """Config fields that must agree with the tokenizer (vocab size and special ids)."""
    n = len(tokenizer)
    if base == "marian":
        return {"vocab_size": n, "decoder_vocab_size": n, "pad_token_id": tokenizer.pad_token_id,
                "eos_token_id": tokenizer.eos_token_id, "decoder_start_token_id": tokenizer.pad_token_id,
                "forced_eos_token_id": tokenizer.eos_token_id}
    return {"vocab_size": n, "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "decoder_start_token_id": tokenizer.eos_token_id,
            "forced_bos_token_id": tokenizer.bos_token_id, "forced_eos_token_id": tokenizer.eos_token_id}
