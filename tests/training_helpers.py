"""Helpers for the data/training/CLI/Hub tests: tiny models on a few hundred Bible verses, one CPU thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a tiny model on the first 200 Bible verses: seconds per run
TINY_ARGS = [
    "--max_train_samples", "200", "--max_eval_samples", "16", "--max_predict_samples", "8",
    "--vocab_size", "300", "--d_model", "32", "--encoder_layers", "1", "--decoder_layers", "1",
    "--encoder_attention_heads", "2", "--decoder_attention_heads", "2", "--encoder_ffn_dim", "64",
    "--decoder_ffn_dim", "64", "--per_device_train_batch_size", "16", "--warmup_steps", "2",
    "--learning_rate", "3e-3", "--logging_steps", "1", "--max_source_length", "64", "--max_target_length", "64",
    "--generation_max_new_tokens", "16", "--num_beams", "2", "--per_device_eval_batch_size", "16",
    "--disable_tqdm", "true",
]


def offline_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def accelerate_cli(*args: str, port: str = "0") -> list[str]:
    """``hf-attn ARGS`` under `accelerate launch` with two CPU processes (DDP over gloo; on a machine without GPUs
    `--multi_gpu` is what starts two processes, `--cpu --num_processes 2` starts one)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", port,
            "-m", "hf_attn.cli", *args]


def run_cli(args: list[str], cwd=None, timeout=300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_attn.cli", *args], cwd=cwd or REPO, env=offline_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def cli_in_process(args: list[str], capsys) -> tuple[int, str]:
    """``hf-attn ARGS`` through the command's `main` in this process: (exit code, stderr). For the one-line errors of
    bad input, which need no fresh interpreter (a subprocess would spend seconds importing torch and transformers);
    an exception `main` lets through fails the test, as a traceback would."""
    from hf_attn.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own exits (--help)
        code = e.code
    return code, capsys.readouterr().err


def write_jsonl(path: Path, pairs, src="de", tgt="en") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for s, t in pairs:
            f.write(json.dumps({"translation": {src: s, tgt: t}}, ensure_ascii=False) + "\n")
    return path


def bible_pairs(n: int = 120, split: str = "train"):
    from hf_attn.data import read_bible_pair

    rows = read_bible_pair("e", "4")[split][:n]
    return [(r["translation"]["de"], r["translation"]["en"]) for r in rows]


_TRAINED: dict = {}


def train_tiny(out_dir: Path, *extra: str, cache_dir: Path | None = None) -> Path:
    """Train a tiny rela-g model in-process (once per output dir): 6 steps on 200 Bible verses."""
    import torch

    from hf_attn.cli import main

    key = str(out_dir)
    if key in _TRAINED:
        return _TRAINED[key]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = ["train", "--preset", "rela-g", *TINY_ARGS, "--max_steps", "6", "--save_steps", "3",
                "--output_dir", str(out_dir), *extra]
        if cache_dir is not None:
            args += ["--cache_dir", str(cache_dir)]
        rc = main(args)
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    _TRAINED[key] = out_dir
    return out_dir
