"""Memory on CPU (hf_attn/bench/memory.py): freed memory is reused without page faults, and a child process's peak
RSS is its own, not its parent's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts Python processes


FAULTS_PER_STEP = """
import resource, statistics, torch
from hf_attn.bench.memory import keep_freed_memory
print(keep_freed_memory())
from transformers import MarianConfig, MarianMTModel
torch.manual_seed(0)
config = MarianConfig(vocab_size=8002, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, pad_token_id=8001,
                      decoder_start_token_id=8001, max_position_embeddings=64)
model = MarianMTModel(config)
optimizer = torch.optim.AdamW(model.parameters())
x, y = torch.randint(0, 8000, (64, 40)), torch.randint(0, 8000, (64, 40))

def step():  # the main job's logits: 64 x 40 x 8,002 floats = 82 MB, and as much again for their gradient
    model(input_ids=x, labels=y).loss.backward()
    optimizer.step()
    optimizer.zero_grad()

for _ in range(3):
    step()
faults = []
for _ in range(7):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_cpu_training_reuses_freed_memory_without_page_faults():
    """Training steps whose logits (82 MB) are above glibc's mmap threshold: with `keep_freed_memory` the median step
    reuses freed pages (now and then one block is mapped again, where freed blocks lie apart); with
    HF_ATTN_MALLOC=system every step maps about 100,000 fresh pages from the kernel."""
    def faults(**env):
        out = subprocess.run([sys.executable, "-c", FAULTS_PER_STEP], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", **env}).stdout.split()
        return out[0] == "True", float(out[1])

    applied, kept = faults()
    system, fresh = faults(HF_ATTN_MALLOC="system")
    assert applied and not system
    assert kept < 1_000 and fresh > 50_000, (kept, fresh)


BIG_PARENT = """
import subprocess, sys
big = bytearray(2 * 2**30)  # 2 GiB, every page touched: the parent's RSS
child = "import resource; from hf_attn.bench.memory import peak_rss_mib; " \\
        "print(peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status")
def test_peak_rss_of_a_child_is_its_own_not_its_parents():
    """results.json's peak_rss_mib in a child of `hf-attn reproduce`: ru_maxrss would carry the parent's 2 GiB
    across fork and exec; VmHWM is the child's own peak."""
    out = subprocess.run([sys.executable, "-c", BIG_PARENT], capture_output=True, text=True, check=True).stdout
    peak, maxrss = map(int, out.split())
    assert maxrss >= 2048 and 0 < peak < 1500, (peak, maxrss)
