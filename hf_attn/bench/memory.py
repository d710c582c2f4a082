"""Memory of this process: its peak resident memory, the peak growth while a function runs (CPU or CUDA), and
CPU training without a page fault per tensor.

`keep_freed_memory`: glibc's malloc keeps the memory a step frees, for the next step.

glibc serves every allocation above its mmap threshold (32 MiB at most) with fresh pages from the kernel and hands
them back on free. A training step of the default model allocates its logits and their gradients anew
(batch x length x vocabulary floats: 64 x 40 x 8,002 x 4 B = 82 MB each), so the kernel maps and zeroes about 150,000
pages per step. Measured on the 2-core CPU machine (default Marian, batch 64 x 40, 1 thread): 0.4-0.5 s of system
time in a 3-3.7 s step. With mmap off and trimming off, freed blocks are reused and the median step spends no time in
the kernel (tests/bench/test_memory.py); the cost is that memory the process frees stays with it (peak RSS grew by about 15% over 25 steps of mixed
lengths). ``HF_ATTN_MALLOC=system`` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform

import torch

try:
    import resource  # POSIX only
except ImportError:
    resource = None

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's <malloc.h>
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Turn off glibc's mmap for large blocks and its heap trimming in this process; True if done.

    Does nothing (False) off Linux/glibc or with ``HF_ATTN_MALLOC=system``. Affects allocations made afterwards."""
    if os.environ.get("HF_ATTN_MALLOC", "").lower() == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def proc_status_kib(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``), or None where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_mib() -> int | None:
    """This process's peak resident memory in MiB: VmHWM, which starts afresh at exec. ``ru_maxrss`` is only the
    fallback (no /proc): Linux carries a parent's RSS at fork into the child's maxrss across exec, so in a child of
    ``hf-attn reproduce`` it reads the parent's size when the child itself stays smaller."""
    peak = proc_status_kib("VmHWM")
    if peak is not None:
        return peak // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 if resource else None


def cpu_peak_growth_mib(fn, *a) -> float:
    """Peak RSS growth (MiB) while running ``fn(*a)``.

    ``ru_maxrss`` alone is wrong in a subprocess: Linux carries the parent's RSS at fork into the child's maxrss
    across exec, so a child of a big parent reports 0 growth. On Linux the peak (VmHWM) is reset first through
    /proc/self/clear_refs; elsewhere ``ru_maxrss`` is the fallback.
    """
    gc.collect()
    try:  # hand freed heap memory back first (e.g. the reference model the stock one copied its weights from)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        before = proc_status_kib("VmRSS")
    except OSError:
        before = None
    if before is not None:
        fn(*a)
        peak = proc_status_kib("VmHWM")
        return max(0, peak - before) / 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn(*a)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def peak_growth_mib(device: str, fn, *a) -> float:
    """Peak memory growth (MiB) while running ``fn(*a)`` on ``device``: allocated CUDA memory on a GPU, else the
    process's RSS (`cpu_peak_growth_mib`)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(*a)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    return cpu_peak_growth_mib(fn, *a)
