"""The tiny saved models of the Hub tests, the fixed input they are run on, and what is compared (teacher-forced
logits, beam-3 ids): one definition for the models saved by an earlier release (`tests/fixtures/saved-177819a/`,
`hub/test_earlier_saves.py`) and for the transformers-versions test (`hub/test_transformers_versions.py`).

Imports torch and transformers only (never hf_attn): run as a script, it is the loader of the versions test, in a
process whose transformers is the version under test and where hf_attn cannot be imported:

    python saved_models.py JOB.json   # loads every model of the job by repo id and from its directory

and prints one ``RESULT {json}`` line per (model, path): ``exact``, ``differs: ...`` or ``error: Type: message``.
"""

from __future__ import annotations

import json
import sys

import torch

PAD, EOS = 1, 2
# vocabulary 100, width 16, one encoder and one decoder layer, two heads of 8: a model's weights are a few kB
SIZES = dict(vocab_size=100, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
             decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
             pad_token_id=PAD, eos_token_id=EOS, forced_eos_token_id=EOS, dropout=0.0, attention_dropout=0.0)
BASE_IDS = {"marian": dict(decoder_start_token_id=PAD),
            "bart": dict(bos_token_id=0, decoder_start_token_id=EOS, forced_bos_token_id=None)}
# the learned position-indexed matrices of RAN and the Synthesizer, at the tiny models' length
RAN = dict(ran_max_positions=16, ran_transition_dim=32)
PRESET_SIZES = {"ran-d": RAN, "ran-all": RAN, "synthesizer": dict(synthesizer_max_positions=16)}
GENERATE = dict(num_beams=3, max_new_tokens=6, do_sample=False, num_return_sequences=1, length_penalty=1.0,
                early_stopping=False)


def config_kwargs(base: str, preset: str) -> dict:
    """The tiny model's config fields (the preset's own come from ``from_preset``)."""
    return {**SIZES, **BASE_IDS[base], **PRESET_SIZES.get(preset, {})}


def perturb(model, seed: int) -> None:
    """Move every trainable parameter off its initial value (seeded): a parameter that failed to load and came back
    re-initialised (a gain of ones, a gate at 0.5) then changes the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def fixed_input() -> dict:
    """Two right-padded sources (7 and 5 tokens with EOS) and 5 decoder inputs each."""
    g = torch.Generator().manual_seed(51)
    ids = torch.randint(3, SIZES["vocab_size"], (2, 7), generator=g)
    mask = torch.ones_like(ids)
    ids[0, 6] = EOS
    ids[1, 4], ids[1, 5:], mask[1, 5:] = EOS, PAD, 0
    dec = torch.randint(3, SIZES["vocab_size"], (2, 5), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}


def outputs(model) -> dict:
    """Teacher-forced logits on `fixed_input` and its beam-3 ids (eval mode, no gradients)."""
    batch = fixed_input()
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits.float()
        beams = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **GENERATE)
    return {"logits": logits, "beams": beams}


def compare(got: dict, want: dict) -> str:
    """``exact`` when the logits are bitwise equal and the beams identical, else what differs."""
    problems = []
    if got["logits"].shape != want["logits"].shape:
        problems.append(f"logits shape {tuple(got['logits'].shape)} vs {tuple(want['logits'].shape)}")
    elif not torch.equal(got["logits"], want["logits"]):
        problems.append(f"max |logits difference| {(got['logits'] - want['logits']).abs().max().item():.3g}")
    if got["beams"].shape != want["beams"].shape or not torch.equal(got["beams"], want["beams"]):
        problems.append(f"beams {got['beams'].tolist()} vs {want['beams'].tolist()}")
    return "exact" if not problems else "differs: " + "; ".join(problems)


def error_result(exc: BaseException) -> str:
    """``error: Type: message`` (the message's first line; ``[N lines]`` appended when it has more)."""
    text = str(exc).strip()
    lines = text.splitlines() or [""]
    more = f" [{len(lines)} lines]" if len(lines) > 1 else ""
    return f"error: {type(exc).__name__}: {lines[0]}{more}"


def load_and_compare(source: str, want: dict) -> str:
    from transformers import AutoModelForSeq2SeqLM

    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=True)
        if not type(model).__module__.startswith("transformers_modules"):
            return f"error: loaded {type(model).__module__}.{type(model).__name__}, not the model's own code"
        return compare(outputs(model), want)
    except Exception as exc:  # noqa: BLE001 - every failure is a result to report
        return error_result(exc)


def run_job(job: dict) -> None:
    """Load each model of ``job`` by repo id (from the Hub cache the job's environment names) and from its
    directory; print one ``RESULT`` line each."""
    import transformers

    expected = torch.load(job["expected"])
    for model in job["models"]:
        for path, source in (("hub", model["repo_id"]), ("dir", model["dir"])):
            result = load_and_compare(source, expected[model["name"]])
            print("RESULT " + json.dumps({"transformers": transformers.__version__, "model": model["name"],
                                          "path": path, "result": result}), flush=True)


class _NoHfAttn:
    """A meta path finder that makes ``import hf_attn`` fail: the loader runs where hf-attn is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "hf_attn" or name.startswith("hf_attn."):
            raise ImportError("hf_attn must not be importable here")


if __name__ == "__main__":
    sys.meta_path.insert(0, _NoHfAttn())
    run_job(json.loads(open(sys.argv[1], encoding="utf-8").read()))
