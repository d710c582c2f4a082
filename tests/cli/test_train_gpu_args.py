"""`hf-attn train`'s training arguments on a CUDA machine (mocked: the suite runs on CPU): AdamW's fused kernel and,
when asked with ``--bf16``, bfloat16 mixed precision; the CPU keeps transformers' default optimiser."""

from __future__ import annotations

from unittest import mock

from transformers import Seq2SeqTrainingArguments

from hf_attn.cli.train_args import parse_train_args


def parse(tmp_path, *flags, cuda: bool):
    with mock.patch("torch.cuda.is_available", return_value=cuda), \
            mock.patch("torch.cuda.is_bf16_supported", return_value=cuda), \
            mock.patch("torch.cuda.device_count", return_value=int(cuda)), mock.patch("torch.cuda.set_device"):
        _, targs, _, _ = parse_train_args(["--output_dir", str(tmp_path), *flags])
    return targs


def test_cuda_training_uses_fused_adamw_and_bf16_when_asked(tmp_path):
    targs = parse(tmp_path, "--bf16", cuda=True)
    assert targs.optim == "adamw_torch_fused" and targs.bf16 and not targs.fp16
    assert parse(tmp_path, cuda=True).optim == "adamw_torch_fused"
    assert not parse(tmp_path, cuda=True).bf16  # mixed precision only when asked


def test_the_cpu_keeps_transformers_default_and_a_given_optimiser_wins(tmp_path):
    default = Seq2SeqTrainingArguments(output_dir=str(tmp_path)).optim
    assert parse(tmp_path, cuda=False).optim == default
    assert parse(tmp_path, "--optim", "adamw_torch", cuda=True).optim == "adamw_torch"
