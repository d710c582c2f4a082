"""The contract every preset meets, on Marian and on BART.

training step (finite loss, a finite gradient on every trainable parameter) ; beam search ; cached == uncached
greedy decoding ; save_pretrained -> trust_remote_code load in a fresh process that cannot import hf_attn gives
identical logits (safetensors weights). The attention outputs' contract (the weights are each variant's own, by
argument and by config) is in tests/contract/.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import cached_tiny_model as tiny_model  # (a copy of a session build: nothing here patches a build)
from conftest import tiny_batch

import hf_attn
import hf_attn.modeling
from hf_attn.modeling import BASES as BASE_TABLE

BASES = ("marian", "bart")
PRESET_NAMES = sorted(hf_attn.PRESETS)
CASES = [(b, p) for b in BASES for p in PRESET_NAMES]
IDS = [f"{b}-{p}" for b, p in CASES]
# the fresh-process Hub round trip: every preset on Marian; on BART (the same modeling files, another base class) the
# first preset of each variant and the headline ones
ROUNDTRIP = [("marian", p) for p in PRESET_NAMES] + [("bart", p) for p in sorted(
    {cls.presets[0].name for cls in hf_attn.ATTENTION_VARIANTS.values() if cls.presets} | {"rela-g", "calibration-gate"})]


def test_a_preset_only_chooses_attention():
    """Presets set attention sites, layer subsets and variant hyperparameters, never the rest of the architecture."""
    from hf_attn.modeling.configuration_hf_attn import variant_defaults

    allowed = {f"{s}_attention{x}" for s in ("encoder", "decoder", "cross") for x in ("", "_layers")}
    allowed |= set(variant_defaults())
    for name, p in hf_attn.PRESETS.items():
        assert set(p.overrides) <= allowed, (name, set(p.overrides) - allowed)


@pytest.mark.parametrize("base", BASES)
def test_swap_attention_keeps_the_checkpoint_architecture(base, tmp_path):
    """An opus-mt-style checkpoint (swish FFN, its own dropouts) keeps them under every preset."""
    from conftest import BASE_DEFAULTS, TINY

    arch = dict(activation_function="swish", dropout=0.3, attention_dropout=0.05, activation_dropout=0.2)
    cfg_cls, model_cls = BASE_TABLE[base].stock_config_class, BASE_TABLE[base].stock_model_class
    vanilla = model_cls(cfg_cls(**{**TINY, **BASE_DEFAULTS[base], **arch}))
    vanilla.save_pretrained(tmp_path)
    for preset in PRESET_NAMES:
        new = hf_attn.swap_attention(str(tmp_path), preset)
        got = {k: getattr(new.config, k) for k in arch}
        assert got == arch, (preset, got)


@pytest.mark.parametrize("base,preset", CASES, ids=IDS)
def test_training_step(base, preset):
    model = tiny_model(base, preset, dropout=0.1, attention_dropout=0.1).train()
    model.set_training_step(0)  # what a training loop does (step-driven schedules need it; a no-op for the rest)
    out = model(**tiny_batch())
    assert torch.isfinite(out.loss), out.loss
    out.loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"{name} gets no gradient"
            assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"


@pytest.mark.parametrize("base,preset", CASES, ids=IDS)
def test_beam_search_and_cache_agreement(base, preset):
    model = tiny_model(base, preset)
    b = tiny_batch()
    src = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    beams = model.generate(**src, num_beams=4, max_new_tokens=8, do_sample=False)
    assert beams.shape[0] == 3 and beams.shape[1] <= 9
    kw = dict(num_beams=1, do_sample=False, max_new_tokens=8, min_new_tokens=8, output_scores=True, return_dict_in_generate=True)
    cached = model.generate(**src, use_cache=True, **kw)
    uncached = model.generate(**src, use_cache=False, **kw)
    assert torch.equal(cached.sequences, uncached.sequences)
    for s_c, s_u in zip(cached.scores, uncached.scores):
        torch.testing.assert_close(s_c, s_u, rtol=1e-4, atol=1e-4)


FRESH_LOADER = textwrap.dedent(
    """
    import json, sys, importlib.abc
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_attn" or name.startswith("hf_attn."):
                raise ImportError("hf_attn must not be importable here")
    sys.meta_path.insert(0, Block())
    import torch
    from transformers import AutoModelForSeq2SeqLM
    jobs = json.loads(sys.argv[1])
    for job in jobs:
        model = AutoModelForSeq2SeqLM.from_pretrained(job["dir"], trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        batch = torch.load(job["batch"])
        with torch.no_grad():
            logits = model(**batch).logits
        torch.save({"logits": logits, "class": type(model).__name__}, job["out"])
    """
)


def model_dir(root: Path, base: str, preset: str) -> Path:
    """Where the round trip saves a preset. The directories share their name (``model``), so transformers imports
    their code, byte for byte the same files, once under one module name, and compares each directory's files with
    it (a directory whose files differed would be imported on its own); the process then loads every directory's
    config and weights, not the same code ~50 times over."""
    return root / f"{base}-{preset}" / "model"


@pytest.fixture(scope="module")
def fresh_process_logits(tmp_path_factory, request):
    """Save every selected preset (all of them unless `-k` chose some), load them all in ONE fresh process that
    cannot import hf_attn, return its logits."""
    selected = {tuple(item.callspec.params[k] for k in ("base", "preset")) for item in request.session.items
                if getattr(item, "originalname", None) == "test_hub_format_roundtrip_in_fresh_process"}
    root = tmp_path_factory.mktemp("roundtrip")
    jobs, expected = [], {}
    b = tiny_batch()
    batch = {k: b[k] for k in ("input_ids", "attention_mask")} | {"decoder_input_ids": b["labels"].clamp(min=3)}
    torch.save(batch, root / "batch.pt")
    for base, preset in [c for c in ROUNDTRIP if c in selected]:
        model = tiny_model(base, preset)
        d = model_dir(root, base, preset)
        model.save_pretrained(d)
        with torch.no_grad():
            expected[(base, preset)] = model(**batch).logits
        jobs.append({"dir": str(d), "batch": str(root / "batch.pt"), "out": str(d / "fresh_logits.pt")})
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(root / "modules"), "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_LOADER, json.dumps(jobs)], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, expected


@pytest.mark.slow
@pytest.mark.parametrize("base,preset", ROUNDTRIP, ids=[f"{b}-{p}" for b, p in ROUNDTRIP])
def test_hub_format_roundtrip_in_fresh_process(fresh_process_logits, base, preset):
    root, expected = fresh_process_logits
    d = model_dir(root, base, preset)
    files = {p.name for p in d.iterdir()}
    assert "model.safetensors" in files and "pytorch_model.bin" not in files
    # every modeling file ships (the modules attention_base.py was split into included), flat beside config.json
    modeling = {p.name for p in Path(hf_attn.modeling.__file__).parent.glob("*.py")} - {"__init__.py", "bases.py"}
    assert {"configuration_hf_attn.py", "modeling_hf_attn.py", "attention_base.py", "masking.py", "cache.py"} <= modeling
    assert modeling <= files
    config = json.loads((d / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith("ForConditionalGeneration") or config["auto_map"][
        "AutoModelForSeq2SeqLM"
    ].endswith("MTModel")
    assert config["preset"] == preset
    fresh = torch.load(d / "fresh_logits.pt")
    torch.testing.assert_close(fresh["logits"], expected[(base, preset)], rtol=0, atol=1e-6)
