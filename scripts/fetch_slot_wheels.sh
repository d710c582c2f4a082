#!/usr/bin/env bash
# The wheels scripts/converged_slot.sh installs on a lent GPU machine (Python 3.12, x86-64 Linux): those of
# scripts/fetch_gpu_wheels.sh (a newer transformers and what it requires), plus what training needs and the
# machine's image lacks: `datasets` (hf-attn's corpora) with dill and multiprocess. Run it once here, where the package
# registry is reachable; the GPU machine is not. Versions: this environment's (`pip list`).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
if [ -f scripts/fetch_gpu_wheels.sh ]; then
  bash scripts/fetch_gpu_wheels.sh
fi
for pin in datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$pin"
done
du -sh .whl
