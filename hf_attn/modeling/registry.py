"""The one registry: variant name -> attention mixin. Adding a paper = one new ``attention_*.py`` + one line here."""

from __future__ import annotations

from .attention_calibration import CalibratedAttention
from .attention_fixed import HardGaussianAttention, SynthesizerAttention
from .attention_gmm import GmmAttention
from .attention_ran import RecurrentAttention
from .attention_rela import RelaAttention
from .attention_reluformer import ReluFormerAttention
from .attention_softmax import Entmax15Attention, SoftmaxAttention, SparsemaxAttention

ATTENTION_VARIANTS = {
    cls.variant: cls
    for cls in (
        SoftmaxAttention,
        SparsemaxAttention,
        Entmax15Attention,
        RelaAttention,
        GmmAttention,
        RecurrentAttention,
        HardGaussianAttention,
        SynthesizerAttention,
        ReluFormerAttention,
        CalibratedAttention,
    )
}
