#!/usr/bin/env bash
# Fetch into .whl/ (gitignored) the wheels that scripts/gpu_lease.sh installs on a lent GPU machine whose image has
# torch and triton but an older transformers (hf-attn needs 5.23-5.24): transformers and the packages whose versions
# it requires, entmax, and pytest for the kernel tests. Python 3.12, x86-64 Linux; no dependencies resolved (the
# image's torch, triton, numpy, PyYAML, regex and packaging are used as they are). Run it once on a machine with
# access to the package registry; the total stays under about 40 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PINS=(
  transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0 anyio==4.16.0 idna==3.20
  click==8.5.1 tqdm==4.70.1 filelock==4.3.1 fsspec==2026.9.0 typing_extensions==4.16.0 accelerate==1.15.0
  entmax==1.3 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0
)
for pin in "${PINS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$pin"
done
du -sh .whl
ls .whl
