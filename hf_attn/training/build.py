"""What a training run starts from: its tokenizer, its model (resumed, warm-started or initialised from scratch
with the preset), the generation settings and the learning rate the recipe derives."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data import get_tokenizer, load_tokenizer, special_token_config
from ..errors import HfAttnInputError
from ..modeling import PRESETS
from ..modeling.bases import BASES, base_of
from .args import MODEL_DEFAULTS
from .convert import check_source, swapped_model


def configure_generation(model, tokenizer, base: str, num_beams: int, length_penalty: float, max_length: int) -> None:
    gc = model.generation_config
    gc.num_beams = num_beams
    gc.length_penalty = length_penalty
    gc.max_length = max_length
    gc.early_stopping = num_beams > 1
    gc.pad_token_id = tokenizer.pad_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    if base == "marian":
        gc.decoder_start_token_id = tokenizer.pad_token_id
        gc.forced_eos_token_id = tokenizer.eos_token_id
        gc.bad_words_ids = [[tokenizer.pad_token_id]]
    else:
        gc.bos_token_id = tokenizer.bos_token_id
        gc.decoder_start_token_id = tokenizer.eos_token_id
        gc.forced_bos_token_id = tokenizer.bos_token_id
        gc.forced_eos_token_id = tokenizer.eos_token_id


def embedding_std(config, std: float | None) -> float:
    """The token-embedding init std of a from-scratch run: --embedding_init_std, d_model**-0.5 when not given,
    the model's init_std for 0."""
    if std is None:
        return round(config.d_model ** -0.5, 6)
    return std or config.init_std


def init_embeddings(model, std: float | None) -> float:
    """Re-draw the (shared, tied) token embeddings from N(0, std), std = d_model**-0.5 by default, as fairseq and
    the ReLA authors' zero toolkit do; with the sqrt(d_model) embedding scale the tokens then enter at unit scale,
    like the sinusoidal positions. Marian's N(0, 0.02) leaves them 3x smaller, and ReLA-g then never learns to read
    the source within the main job's 600 steps (BLEU 0.9; its loss is the same with shuffled sources)."""
    std = embedding_std(model.config, std)
    if std == model.config.init_std:
        return std
    emb = model.get_input_embeddings()
    with torch.no_grad():
        emb.weight.normal_(0.0, std)
        if emb.padding_idx is not None:
            emb.weight[emb.padding_idx].zero_()
    return std


# fairseq's Transformer: MultiheadAttention.reset_parameters (xavier_uniform, gain 1/sqrt(2) on q/k/v when the three
# have one size; out_proj gain 1, bias 0) and its `Linear` helper for the feed-forward layers (xavier_uniform, bias 0)
_XAVIER_GAINS = {"q_proj": 2 ** -0.5, "k_proj": 2 ** -0.5, "v_proj": 2 ** -0.5, "out_proj": 1.0, "fc1": 1.0, "fc2": 1.0}


def init_layers(model, scheme: str) -> int:
    """Re-initialise the attention projections and feed-forward layers of every encoder/decoder layer with
    ``scheme`` ("xavier": fairseq's init, `_XAVIER_GAINS`, zero biases; "marian": leave the model's N(0, init_std)).
    Variant parameters (GMM's FFNs, calibration's mask network, ReLA's gains, RAN's maps) keep their own init, and
    so do the embeddings (`init_embeddings`). Returns the number of layers re-initialised."""
    if scheme == "marian":
        return 0
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            parts = name.split(".")
            if not isinstance(module, torch.nn.Linear) or "layers" not in parts or parts[-1] not in _XAVIER_GAINS:
                continue
            torch.nn.init.xavier_uniform_(module.weight, gain=_XAVIER_GAINS[parts[-1]])
            if module.bias is not None:
                module.bias.zero_()
            count += 1
    return count


def noam_learning_rate(factor: float, d_model: int, warmup_steps: int) -> float:
    """The Noam schedule's peak (Vaswani et al. 2017, Eq. 3), reached at step ``warmup_steps``:
    factor * d_model**-0.5 * warmup**-0.5. After the peak it decays as step**-0.5, which is transformers'
    inverse_sqrt schedule."""
    return factor * (d_model * warmup_steps) ** -0.5


def check_noam(hargs, targs, given: set) -> None:
    """--noam_factor's companions, checked before any work: no --learning_rate, the inverse_sqrt shape, a warm-up."""
    if not hargs.noam_factor:
        return
    sched = str(getattr(targs.lr_scheduler_type, "value", targs.lr_scheduler_type))
    if "learning_rate" in given:
        raise HfAttnInputError(f"--noam_factor {hargs.noam_factor} sets the learning rate (factor * (d_model * "
                               "warmup_steps)**-0.5); drop --learning_rate")
    if sched != "inverse_sqrt":
        raise HfAttnInputError(f"--noam_factor needs --lr_scheduler_type inverse_sqrt (the Noam shape), not {sched!r}")
    if not targs.warmup_steps or targs.warmup_steps < 1:
        raise HfAttnInputError(f"--noam_factor needs --warmup_steps >= 1 (the step of the peak), not {targs.warmup_steps}")


def apply_noam(hargs, targs, d_model: int, given: set) -> None:
    """--noam_factor: the learning rate becomes the Noam peak for this d_model and --warmup_steps."""
    check_noam(hargs, targs, given)
    targs.learning_rate = noam_learning_rate(hargs.noam_factor, d_model, int(targs.warmup_steps))


def scaled_anneal(preset: str, max_steps: int, overrides: dict) -> dict:
    """Attention calibration's annealing ratio r = exp(-step / T) (Lu et al. 2021, Eq. 9) uses T = 1e5 for runs of
    150k steps, so r ends at exp(-1.5) = 0.22. Under a shorter step budget the same T leaves r >= 0.99: the run would
    be the baseline. A from-scratch run with an annealing preset therefore gets T = max_steps / 1.5 (the paper's end
    ratio), unless --calibration_anneal_steps is given or the budget is wall-clock time."""
    fusion = overrides.get("calibration_fusion", PRESETS[preset].overrides.get("calibration_fusion"))
    if fusion != "anneal" or "calibration_anneal_steps" in overrides or max_steps <= 0:
        return {}
    return {"calibration_anneal_steps": round(max_steps / 1.5, 1)}


def run_tokenizer(hargs, targs, out_dir: Path, corpus, base: str):
    """(tokenizer, description): the interrupted run's on --resume, a saved one (--tokenizer_name/--init_from), or a
    SentencePiece model trained on the training split (cached)."""
    tok_source = None
    if hargs.resume and (out_dir / "tokenizer_config.json").is_file():
        tokenizer, tok_source = load_tokenizer(out_dir), str(out_dir)
    elif hargs.tokenizer_name or hargs.init_from:
        tok_source = hargs.tokenizer_name or hargs.init_from
        flag = "--tokenizer_name" if hargs.tokenizer_name else "--init_from"
        check_source(tok_source, f"{flag} {tok_source!r}", "directory",
                     "give a directory with tokenizer files, or a Hub id (user/name)" if hargs.tokenizer_name else
                     "give a trained model directory (with its tokenizer files), or a Hub id (user/name)", hub=False)
        try:
            tokenizer = load_tokenizer(tok_source)
        except HfAttnInputError:
            raise  # already one line naming the directory
        except (OSError, ValueError) as e:
            raise HfAttnInputError(f"cannot load a tokenizer from {tok_source!r} ({str(e).splitlines()[0][:150]}); "
                                   "give a directory with tokenizer files") from None
    else:
        src, tgt = corpus.pairs("train")
        with targs.main_process_first(desc="tokenizer training"):
            tokenizer, tok_path = get_tokenizer(src + tgt, base=base, vocab_size=hargs.vocab_size,
                                                model_type=hargs.spm_model_type, cache_dir=hargs.cache_dir,
                                                seed=targs.seed)
        tok_source = str(tok_path)
    tokenizer_info = f"{hargs.spm_model_type} {len(tokenizer):,} tokens" if not hargs.init_from else f"from {tok_source}"

    return tokenizer, tokenizer_info


def build_model(hargs, targs, last, overrides: dict, tokenizer, base: str):
    """(model, base, token-embedding init std): from the checkpoint on --resume, warm-started with --init_from, or
    from scratch with the preset; generation settings configured."""
    cfg_cls, model_cls = BASES[base].config_class, BASES[base].model_class
    defaults = MODEL_DEFAULTS
    embedding_init_std = None  # a warm-started run keeps its embeddings
    if hargs.resume:
        model = model_cls.from_pretrained(last)
        if not hargs.init_from:
            embedding_init_std = embedding_std(model.config, hargs.embedding_init_std)
    elif hargs.init_from:
        model = swapped_model(hargs.init_from, hargs.preset, tokenizer, f"--init_from {hargs.init_from!r}", **overrides)
        base = (base_of(model.config) or BASES["marian"]).name
    else:
        kw = {**defaults, **special_token_config(tokenizer, base), **scaled_anneal(hargs.preset, targs.max_steps, overrides),
              **overrides}
        config = cfg_cls.from_preset(hargs.preset, **kw)
        model = model_cls(config)
        embedding_init_std = init_embeddings(model, hargs.embedding_init_std)
        init_layers(model, hargs.init_scheme)
    configure_generation(model, tokenizer, base, hargs.num_beams, hargs.length_penalty,
                         max_length=hargs.generation_max_new_tokens + 2)
    return model, base, embedding_init_std
