"""A tiny Marian model with a known auxiliary loss, a toy tokenizer and dataset, and `HfAttnSeq2SeqTrainer` on them:
the trainer tests' setup, shared by the tests of the trainer, of stock transformers trainers and of ReLUFormer's loss."""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments

import hf_attn
from hf_attn.data import make_collator
from hf_attn.training import HfAttnSeq2SeqTrainer

AUX_WEIGHT = 0.5


class AuxModel(hf_attn.HfAttnMarianMTModel):
    """A tiny hf-attn model whose variant adds a known auxiliary loss ((50 w)^2 mean x 0.5) and logs it."""

    def __init__(self, config):
        super().__init__(config)
        self.steps_seen = []

    def set_training_step(self, step: int) -> None:
        self.steps_seen.append(step)

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                              decoder_attention_mask=decoder_attention_mask, labels=labels, **kwargs)
        w = self.model.encoder.layers[0].fc1.weight
        aux = AUX_WEIGHT * (50 * w).pow(2).mean()
        base_loss = out.loss
        out.aux_loss = aux
        out.aux_logs = {"reg_loss": aux.detach(), "mean_mask": torch.tensor(0.25)}
        if base_loss is not None:  # the hf-attn contract: with labels, loss includes aux_loss
            out.loss = base_loss + aux
        return out


def tiny(seed=0):
    torch.manual_seed(seed)
    cfg = hf_attn.HfAttnMarianConfig.from_preset(
        "softmax", vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        pad_token_id=39, decoder_start_token_id=39, eos_token_id=0, forced_eos_token_id=0, dropout=0.0)
    return AuxModel(cfg)


class Tok:
    """Just enough tokenizer for the collator (right padding)."""

    pad_token_id = 39
    padding_side = "right"

    def save_pretrained(self, path, **kwargs):
        return ()

    def pad(self, features, **kwargs):
        n = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), n), self.pad_token_id)
        mask = torch.zeros((len(features), n), dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[i, : len(f["input_ids"])] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if "labels" in features[0]:
            m = max(len(f["labels"]) for f in features)
            out["labels"] = torch.tensor([f["labels"] + [-100] * (m - len(f["labels"])) for f in features])
        return out


def data(n=16, seed=0, length=6):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        src = torch.randint(1, 39, (length,), generator=g).tolist() + [0]
        tgt = torch.randint(1, 39, (length,), generator=g).tolist() + [0]
        rows.append({"input_ids": src, "attention_mask": [1] * len(src), "labels": tgt})
    return Dataset.from_list(rows)


def targs(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-3, max_steps=2,
                report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
                train_sampling_strategy="sequential", dataloader_pin_memory=False, use_cpu=True)
    base.update(kw)
    return Seq2SeqTrainingArguments(**base)


def make_trainer(tmp_path, model=None, ds=None, **kw):
    model = model or tiny()
    ds = ds if ds is not None else data()
    return HfAttnSeq2SeqTrainer(model=model, args=targs(tmp_path, **kw), train_dataset=ds,
                                data_collator=make_collator(Tok(), model))
