#!/usr/bin/env bash
# The matrix behind results/REPORT.md (docs/reproduce.md). Re-run it until every run is recorded:
# recorded runs are skipped, interrupted ones resume from their last checkpoint. About 13 hours on 2 CPU cores.
#   RUNS_DIR=/somewhere/with/space bash scripts/reproduce_report.sh
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS_DIR:-runs/reproduce}
common=(--output_dir results --runs_dir "$runs" --jobs "${JOBS:-2}" --threads "${THREADS:-1}")
main=softmax,rela-g,sparsemax,entmax15,rela-i,relu,gmm,gmm-strict,gmm-only,reluformer,reluformer-no-scale,reluformer-no-reg,calibration-gate,ran-d,ran-all,hard-gaussian,synthesizer
hf-attn reproduce --presets "$main" --pairs de-en --steps 600 --seeds 42 "${common[@]}"
hf-attn reproduce --presets softmax,rela-g --pairs de-en --steps 600 --seeds 43,44 "${common[@]}"
hf-attn reproduce --presets softmax,rela-g,gmm,reluformer,ran-d --pairs ru-en --steps 600 --seeds 42 "${common[@]}"
hf-attn reproduce --presets softmax,rela-g,gmm,reluformer,calibration-gate,ran-d --pairs de-en --steps 1800 --seeds 42 "${common[@]}"
hf-attn reproduce --report_only --output_dir results --readme README.md --docs docs
