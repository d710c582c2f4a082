#!/usr/bin/env bash
# The one command for a session that is lent a GPU machine (torch, triton and an older transformers installed;
# Python 3.12), at most about 9 minutes:
#   1. installs the wheels scripts/fetch_gpu_wheels.sh put in .whl/ (run it here first; the run tool carries .whl);
#   2. runs the kernel tests on CUDA: the test files named *triton*, `-k triton`, HF_ATTN_TEST_DEVICE=cuda (the
#      `test_device` fixture of tests/conftest.py) and TRITON_INTERPRET=0 (compiled kernels, not the interpreter);
#   3. runs the GPU suite (scripts/benchmark.py --gpu-suite, about 6 minutes).
# Everything lands in $OUT (default runs/gpu_lease): environment.txt, kernel_tests.log, gpu.json (+ gpu.md, its
# tables), gpu_suite.log, summary.txt. Afterwards, on the development machine:
#   cp $OUT/gpu.json results/benchmark/gpu.json
#   python scripts/benchmark.py --gpu-suite --docs docs/speed.md --from results/benchmark/gpu.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_lease}
mkdir -p "$OUT"
start=$(date +%s)
if ! ls .whl/*.whl >/dev/null 2>&1; then
  echo "gpu_lease: no wheels in .whl/: run scripts/fetch_gpu_wheels.sh first and carry .whl to this machine" | tee "$OUT/summary.txt"
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v "WARNING" | tail -5
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 - > "$OUT/environment.txt" 2>&1 <<'PY'
import torch, transformers
from hf_attn.modeling import fused
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
print("torch", torch.__version__, "cuda", torch.version.cuda, "| triton", getattr(fused.triton, "__version__", None),
      "| transformers", transformers.__version__)
PY
cat "$OUT/environment.txt"

# 2. the kernel tests on the GPU (2.5 minutes at most)
mapfile -t KERNEL_TESTS < <(find tests -name 'test_*triton*.py' ! -name 'test_without_triton.py' | sort)
HF_ATTN_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -rs -k triton \
  "${KERNEL_TESTS[@]}" > "$OUT/kernel_tests.log" 2>&1
tests_rc=$?
tail -3 "$OUT/kernel_tests.log"

# 3. the GPU suite (its own time budget is 320 s; the timeout is a backstop)
timeout 390 python3 scripts/benchmark.py --gpu-suite --output "$OUT/gpu.json" > "$OUT/gpu_suite.log" 2>&1
suite_rc=$?
tail -40 "$OUT/gpu_suite.log"

{
  echo "kernel tests: exit $tests_rc ($(tail -1 "$OUT/kernel_tests.log"))"
  echo "gpu suite: exit $suite_rc$([ -f "$OUT/gpu.json" ] && echo ", wrote $OUT/gpu.json")"
  echo "total: $(( $(date +%s) - start )) s"
} | tee "$OUT/summary.txt"
[ "$tests_rc" -eq 0 ] && [ "$suite_rc" -eq 0 ]
