"""A training loop of one's own (docs/python.md, "A training loop of your own"): a loss computed from the logits
without `labels` trains a variant's objective by adding `out.aux_loss`; the guard still stops a loop that forgets it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_batch, tiny_model

from hf_attn.modeling import HfAttnConfigError

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text(encoding="utf-8")


def own_loss(out, labels):
    return F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1)


def forward(model, b, with_labels=False):
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    extra = {"labels": b["labels"]} if with_labels else {}
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=dec, **extra)


def test_the_pages_loop_runs():
    snippet = re.search(r'```python title="own loss without labels"\n(.*?)\n```', PAGE, re.S).group(1)
    torch.manual_seed(0)
    scope = {}
    exec(snippet, scope)  # noqa: S102 - the documented loop, as a user copies it
    assert scope["out"].aux_loss is not None and scope["config"].reluformer_reg_weight > 0


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_a_labels_free_loop_that_adds_aux_loss_trains_the_objective(base):
    model = tiny_model(base, "reluformer").train()
    b = tiny_batch()
    out = forward(model, b)
    assert out.loss is None and out.aux_loss is not None
    (own_loss(out, b["labels"]) + out.aux_loss).backward()  # passes the guard
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # the same gradients as the loss of the forward with labels, less the smoothing: the objective is trained
    model.zero_grad()
    with_labels = forward(model, b, with_labels=True)
    (own_loss(with_labels, b["labels"]) + with_labels.aux_loss).backward()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, msg=name)


def test_a_labels_free_loop_that_forgets_aux_loss_is_stopped():
    model = tiny_model("marian", "reluformer").train()
    b = tiny_batch()
    with pytest.raises(HfAttnConfigError, match="needs `labels`.*add out.aux_loss to the loss you backpropagate"):
        own_loss(forward(model, b), b["labels"]).backward()
    out = forward(model, b)
    with pytest.raises(HfAttnConfigError, match="needs `labels`"):  # aux_loss reached by another backward only
        (own_loss(out, b["labels"]) + 0 * out.logits.sum()).backward(retain_graph=True)


def test_calibration_computes_its_objective_from_labels():
    """No labels: no aux_loss to add, so the line says to pass them; with labels, an own loss + aux_loss trains."""
    model = tiny_model("marian", "calibration-gate").train()
    model.set_training_step(0)
    b = tiny_batch()
    out = forward(model, b)
    assert out.aux_loss is None
    with pytest.raises(HfAttnConfigError, match=r"pass labels \(its objective is computed from them"):
        own_loss(out, b["labels"]).backward()
    out = forward(model, b, with_labels=True)
    (own_loss(out, b["labels"]) + out.aux_loss).backward()
    assert any(n.endswith("perturb_q_proj.weight") and p.grad is not None and p.grad.abs().sum() > 0
               for n, p in model.named_parameters())
