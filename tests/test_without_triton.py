"""hf-attn without triton installed (the CPU install): in a process where ``import triton`` fails, hf_attn imports,
tiny models of the presets with fused kernels build and train a step, a saved model (which ships fused.py and the
kernel files) loads back with trust_remote_code and gives the same logits, and the kernel tests skip instead of
erroring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a process without triton: `import triton` raises ImportError (as when it is not installed), find_spec gives None
HIDE_TRITON = "import sys; sys.modules['triton'] = None\n"
PRESETS = ["rela-g", "reluformer", "calibration-gate", "gmm", "entmax15"]

SCRIPT = HIDE_TRITON + r'''
import json, pathlib, sys
import torch
import hf_attn
from hf_attn.modeling import fused
sys.path.insert(0, "tests")
from conftest import tiny_batch, tiny_model

out = pathlib.Path(sys.argv[1])
report = {"triton": fused.triton_available(), "trained": []}
for preset in json.loads(sys.argv[2]):
    model = tiny_model("marian", preset).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(**tiny_batch()).loss
    loss.backward()
    opt.step()
    assert torch.isfinite(loss), preset
    report["trained"].append(preset)
model = tiny_model("marian", "rela-g")
model.save_pretrained(out / "saved")
report["files"] = sorted(p.name for p in (out / "saved").glob("*.py"))
batch = tiny_batch()
batch.pop("labels")
batch["decoder_input_ids"] = torch.ones(3, 4, dtype=torch.long)
with torch.no_grad():
    torch.save({"batch": batch, "logits": model(**batch).logits}, out / "expected.pt")
print(json.dumps(report))
'''

# a fresh process that never imports hf_attn: the saved directory's own code (trust_remote_code), triton hidden
LOADER = HIDE_TRITON + r'''
import json, pathlib, sys
import torch
from transformers import AutoModelForSeq2SeqLM
out = pathlib.Path(sys.argv[1])
loaded = AutoModelForSeq2SeqLM.from_pretrained(out / "saved", trust_remote_code=True).eval()
expected = torch.load(out / "expected.pt")
with torch.no_grad():
    diff = (loaded(**expected["batch"]).logits - expected["logits"]).abs().max().item()
print(json.dumps({"module": type(loaded).__module__, "hf_attn": "hf_attn" in sys.modules, "max_diff": diff}))
'''


def hidden_triton_env(tmp_path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "modules"),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_everything_works_without_triton(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(PRESETS)], cwd=ROOT,
                          env=hidden_triton_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["triton"] is False
    assert report["trained"] == PRESETS
    modeling = {p.name for p in (ROOT / "hf_attn" / "modeling").glob("*.py")} - {"__init__.py", "bases.py"}
    assert "fused.py" in report["files"] and modeling <= set(report["files"])
    env = {k: v for k, v in hidden_triton_env(tmp_path).items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["module"].startswith("transformers_modules") and not loaded["hf_attn"]
    assert loaded["max_diff"] == 0.0


@pytest.mark.slow
def test_kernel_tests_skip_without_triton(tmp_path):
    """Every test file about the kernels (named *triton*) runs without triton: nothing errors, and the tests that
    need triton (`requires_triton`) are skipped."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*triton*.py")
                   if p.name != Path(__file__).name)
    assert files, "no kernel test files found"
    runner = HIDE_TRITON + "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", runner, "-q", "-p", "no:cacheprovider", "-rs", *files], cwd=ROOT,
                          env=hidden_triton_env(tmp_path), capture_output=True, text=True, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "skipped" in summary and "error" not in summary and "failed" not in summary, summary
    assert "triton is not installed" in proc.stdout
