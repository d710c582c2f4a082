"""Memory on CPU (hf_attn/bench/memory.py): freed memory is reused without page faults, and a child process's peak
RSS is its own, not its parent's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts Python processes


FAULTS_PER_STEP = """
import resource, sys, torch
from hf_attn.bench.memory import keep_freed_memory
print(keep_freed_memory())
for _ in range(2):  # a training step's large tensors: allocated, written, freed
    torch.ones(16 * 2**20).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.ones(16 * 2**20).sum()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_cpu_training_reuses_freed_memory_without_page_faults():
    """64 MB blocks (above glibc's mmap threshold) freed and allocated again: with `keep_freed_memory` the pages are
    reused; with HF_ATTN_MALLOC=system each block is 16,384 fresh pages from the kernel."""
    def faults(**env):
        out = subprocess.run([sys.executable, "-c", FAULTS_PER_STEP], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", **env}).stdout.split()
        return out[0] == "True", int(out[1])

    applied, kept = faults()
    system, fresh = faults(HF_ATTN_MALLOC="system")
    assert applied and not system
    assert kept < 500 and fresh > 5 * 16_000, (kept, fresh)


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
