"""RAN: recurrent attention (Zeng et al. 2021, "Recurrent Attention for Neural Machine Translation", EMNLP).
Official code: lemon0830/RAN (thseq toolkit); the defaults follow it, the paper's formulas are options.

Self-attention whose weights are learned, input-independent matrices refined layer by layer:

    A_0 : parameter [H, Lmax, Lmax] per stack (encoder, decoder), xavier-uniform        Sec. 2.2 ("Initial Attention
                                                                                          Matrices"); Lmax = 256
    A_l = A_{l-1} + Rec(A_{l-1}),  l = 1..L                                             Eq. 4 (residual)
      Rec (default, released code): Linear(Lmax, 4 Lmax) -> ReLU -> Linear(4 Lmax, Lmax)
      Rec (paper Eq. 3, ``ran_transition="tanh_layernorm"``): LayerNorm(tanh(W A + b))
      Rec acts on the key axis and is shared by every head and layer of the stack
    layer l: p = softmax(A_l[:, q, :S] masked) ; out = out_proj(merge(dropout(p) @ v_proj(x)))   Eq. 2

No query/key projections. Decoder: the causal mask keeps the lower triangle ("only the lower triangular matrix
is leveraged"). Rows of A (query positions) never interact, so a forward only computes the rows it needs.

Parameters have one owner each (``save_pretrained`` refuses tensors shared by two modules): ``attach(model)`` registers one `RanStack` (A_0 and Rec) per
stack on ``model.model.encoder`` / ``model.model.decoder`` as ``ran_stack``; the stack's layers only hold an
unregistered reference to it. The stack computes A_1..A_L once per forward in training (at its first layer),
and once in total in eval mode (cached in float32 and reused by every decoding step: a cached step slices one row);
the cache is dropped when a parameter changes (version counter / storage / dtype / device) or on ``train()``.

Knobs: ``ran_max_positions`` (Lmax; longer inputs raise an error naming it, generation is capped to it),
``ran_transition`` ("ffn" | "tanh_layernorm"), ``ran_transition_dim`` (FFN hidden size, default 4 Lmax),
``ran_freeze_initial`` (frozen A_0, Table 3), ``ran_attention_dropout`` (0.2, the paper; 0 as the code for En-Fr;
None = the model's attention_dropout), ``ran_drop_position_embeddings`` ("none" | "encoder" | "decoder" | "both",
Table 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention_positional import PositionalAttention, check_length, check_right_padding, positional_softmax
from .citations import CITATIONS
from .hyperparameters import HfAttnConfigError, Hyperparameter, Preset
from .kernels import float32_autocast_off

RAN_PAPER = CITATIONS["ran"]
TRANSITIONS = ("ffn", "tanh_layernorm")
DROP_POSITIONS = ("none", "encoder", "decoder", "both")
# eval mode computes rows of A_1..A_L in blocks of this many query positions (rows are independent), so short
# inputs do not pay for all Lmax rows; a longer input later extends the cache by the missing rows only
EVAL_ROW_BLOCK = 64


def _ran(encoder: bool, decoder: bool, **extra) -> dict:
    return {
        "encoder_attention": "recurrent" if encoder else "softmax",
        "decoder_attention": "recurrent" if decoder else "softmax",
        "cross_attention": "softmax",
        **extra,
    }


class RanTransition(nn.Module):
    """Rec(A): acts on the last (key) axis of [H, rows, Lmax]; shared by all heads and layers of a stack."""

    def __init__(self, config):
        super().__init__()
        size = config.ran_max_positions
        self.kind = config.ran_transition
        if self.kind == "ffn":  # released code: PositionWiseFeedForward(maxlen, 1024, maxlen), ReLU, no dropout
            hidden = config.ran_transition_dim or 4 * size
            self.fc1 = nn.Linear(size, hidden)
            self.fc2 = nn.Linear(hidden, size)
        else:  # paper Eq. 3: LN(tanh(W A + b))
            self.linear = nn.Linear(size, size)
            self.norm = nn.LayerNorm(size)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        """Rec(a) in float32 (a is float32)."""
        if self.kind == "ffn":
            h = F.relu(F.linear(a, self.fc1.weight.float(), self.fc1.bias.float()))
            return F.linear(h, self.fc2.weight.float(), self.fc2.bias.float())
        h = torch.tanh(F.linear(a, self.linear.weight.float(), self.linear.bias.float()))  # Eq. 3
        return F.layer_norm(h, h.shape[-1:], self.norm.weight.float(), self.norm.bias.float(), self.norm.eps)

    def init_variant_weights(self, init):
        """Xavier-uniform weights, zero biases (released code's reset_parameters); LayerNorm 1 / 0."""
        linears = (self.fc1, self.fc2) if self.kind == "ffn" else (self.linear,)
        for lin in linears:
            init.xavier_uniform_(lin.weight)
            init.zeros_(lin.bias)
        if self.kind != "ffn":
            init.ones_(self.norm.weight)
            init.zeros_(self.norm.bias)


class RanStack(nn.Module):
    """The parameters shared by the RAN layers of one stack: A_0 and Rec, plus the computed A_1..A_L."""

    def __init__(self, config, num_heads: int, num_layers: int):
        super().__init__()
        self.max_positions = config.ran_max_positions
        self.num_layers = num_layers
        size = self.max_positions
        self.initial_attention = nn.Parameter(torch.empty(num_heads, size, size))  # A_0
        self.freeze_initial = config.ran_freeze_initial  # Table 3: fixed Initial Attention Matrices
        self.freeze_fixed_weights()
        self.transition = RanTransition(config)
        self._eval_key = None
        self._eval_mats: list[torch.Tensor] | None = None  # eval mode: [H, R, Lmax] float32 per layer

    def init_variant_weights(self, init):
        init.xavier_uniform_(self.initial_attention)  # released code: nn.init.xavier_uniform_(randatt)

    def freeze_fixed_weights(self) -> None:
        """Frozen A_0 stays frozen, also after loading (the model calls this hook after from_pretrained)."""
        if self.freeze_initial:
            self.initial_attention.requires_grad_(False)

    def train(self, mode: bool = True):
        # entering training frees the eval matrices; eval() keeps them (they are keyed on the parameters'
        # state, `_state_key`), so a loop that calls model.eval() before each batch does not recompute them
        if mode:
            self.clear_cache()
        return super().train(mode)

    def clear_cache(self) -> None:
        self._eval_key, self._eval_mats = None, None

    # ---- A_1..A_L ------------------------------------------------------------------------------------------------
    def recurrence(self, a0: torch.Tensor) -> list[torch.Tensor]:
        """[A_1, ..., A_L] for the rows in ``a0`` (float32 [H, rows, Lmax]): A_l = A_{l-1} + Rec(A_{l-1}) (Eq. 4)."""
        with float32_autocast_off(a0):
            mats, a = [], a0.float()
            for _ in range(self.num_layers):
                a = a + self.transition(a)
                mats.append(a)
        return mats

    def _state_key(self):
        params = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self.parameters())
        return params + (torch.is_inference_mode_enabled(),)

    def _cacheable(self) -> bool:
        """Eval mode, and nothing needs a graph: the matrices are constants until a parameter changes."""
        if self.training:
            return False
        return not torch.is_grad_enabled() or not any(p.requires_grad for p in self.parameters())

    def layer_logits(self, step: int, rows: int, shared: dict | None = None) -> torch.Tensor:
        """A_{step+1} for query rows ``0..rows-1`` (at least), float32 ``[H, >=rows, Lmax]``.

        Training (or any graph-building call): computed for all layers when the stack's first layer asks and kept
        in ``shared`` (the forward pass's `ForwardState.shared`) for the others. Eval: cached across forwards and
        decoding steps until a parameter changes (the matrices do not depend on the input).
        """
        if self._cacheable():
            key = self._state_key()
            if key != self._eval_key:
                self._eval_key, self._eval_mats = key, None
            have = 0 if self._eval_mats is None else self._eval_mats[0].shape[1]
            if have < rows:
                target = min(self.max_positions, -(-rows // EVAL_ROW_BLOCK) * EVAL_ROW_BLOCK)
                with torch.no_grad():
                    new = self.recurrence(self.initial_attention[:, have:target])
                self._eval_mats = new if self._eval_mats is None else [
                    torch.cat([old, n], dim=1) for old, n in zip(self._eval_mats, new)
                ]
            return self._eval_mats[step]
        shared = {} if shared is None else shared
        mats = shared.get(id(self))
        if step == 0 or mats is None or mats[0].shape[1] < rows:
            mats = shared[id(self)] = self.recurrence(self.initial_attention[:, :rows])
        return mats[step]

    def matrices(self, length: int | None = None) -> list[torch.Tensor]:
        """Detached [A_1, ..., A_L], each float32 ``[H, length, length]`` (default Lmax): the learned logits."""
        length = length or self.max_positions
        check_length(length, self.max_positions, "recurrent", "ran_max_positions")
        with torch.no_grad():
            return [a[:, :length, :length].clone() for a in self.recurrence(self.initial_attention[:, :length])]

    def extra_repr(self) -> str:
        h, n, _ = self.initial_attention.shape
        frozen = not self.initial_attention.requires_grad
        return f"heads={h}, max_positions={n}, layers={self.num_layers}, frozen_A0={frozen}"


class NoPositionalEmbedding(nn.Module):
    """Stands in for a stack's ``embed_positions`` when positional embeddings are dropped (Table 2): adds 0."""

    def forward(self, first, *args, **kwargs):
        device = first.device if isinstance(first, torch.Tensor) else None
        return torch.zeros((), device=device)


class RecurrentAttention(PositionalAttention):
    """RAN self-attention layer: softmax(A_l) V with A_l from the stack's shared recurrence."""

    variant = "recurrent"
    description = "RAN: learned input-independent attention matrices refined layer by layer (Zeng et al. 2021)"
    sites = ("encoder", "decoder")
    hyperparameters = (
        Hyperparameter("ran_max_positions", int, 256, "Lmax, the size of the learned attention matrices = the longest "
                       "input (Zeng et al. 2021 released code: maxlen 256)", low=1),
        Hyperparameter("ran_transition", str, "ffn", "Rec(A): ffn (released code) or tanh_layernorm (Zeng et al. "
                       "2021, Eq. 3)", choices=TRANSITIONS, symbol="Rec(.) (Eq. 3)"),
        Hyperparameter("ran_transition_dim", int, None, "hidden size of the ffn transition; None = 4 * "
                       "ran_max_positions (1024 in the released code of Zeng et al. 2021)", low=1, nullable=True),
        Hyperparameter("ran_freeze_initial", bool, False, "freeze the initial attention matrices A_0 (Zeng et al. "
                       "2021, Table 3)", symbol="A_0 frozen (Table 3)"),
        Hyperparameter("ran_attention_dropout", float, 0.2, "dropout on RAN's attention weights (Zeng et al. 2021, "
                       "Sec. 3.1; 0 for En-Fr); None = the model's attention_dropout", low=0.0, high=1.0,
                       high_open=True, nullable=True),
        Hyperparameter("ran_drop_position_embeddings", str, "none", "remove the positional embeddings of a stack: "
                       "none, encoder, decoder, both (Zeng et al. 2021, Table 2)", choices=DROP_POSITIONS),
    )
    presets = (
        Preset(
            "ran-e", "RAN in encoder self-attention, softmax elsewhere (Table 1, RAN-E)", RAN_PAPER, _ran(True, False)
        ),
        Preset(
            "ran-d", "RAN in decoder self-attention, softmax elsewhere (Table 1, RAN-D)", RAN_PAPER, _ran(False, True)
        ),
        Preset(
            "ran-all", "RAN in encoder and decoder self-attention (Table 1, RAN-ALL)", RAN_PAPER, _ran(True, True)
        ),
        Preset(
            "ran-all-fixed-init",
            "ablation: RAN-ALL with frozen initial attention matrices A_0 (Table 3)",
            RAN_PAPER,
            _ran(True, True, ran_freeze_initial=True),
        ),
        Preset(
            "ran-e-no-pos",
            "RAN-E without encoder positional embeddings (Table 2)",
            RAN_PAPER,
            _ran(True, False, ran_drop_position_embeddings="encoder"),
        ),
        Preset(
            "ran-d-no-pos",
            "RAN-D without decoder positional embeddings (Table 2)",
            RAN_PAPER,
            _ran(False, True, ran_drop_position_embeddings="decoder"),
        ),
    )

    # ---- configuration ----------------------------------------------------------------------------------------
    @classmethod
    def validate_config(cls, config):
        """Dropping position embeddings needs RAN layers (Table 2)."""
        drop = config.ran_drop_position_embeddings
        layout = config.attention_layout()
        if drop != "none" and not any("recurrent" in layout[s] for s in cls.sites):
            raise HfAttnConfigError(
                f"ran_drop_position_embeddings={drop!r} applies to models with RAN layers, but this model uses none "
                "(set encoder_attention or decoder_attention to 'recurrent', or leave it at 'none')"
            )

    @classmethod
    def attach(cls, model):
        """One `RanStack` per stack that has RAN layers, owned by the stack (``model.model.<stack>.ran_stack``);
        the RAN layers get an unregistered reference and their step in the recurrence (one owner per parameter)."""
        config = model.config
        for site, stack in (("encoder", model.model.encoder), ("decoder", model.model.decoder)):
            layers = [m for m in model.attention_modules(site) if getattr(m, "variant", None) == cls.variant]
            if layers:
                ran_stack = RanStack(config, layers[0].num_heads, len(layers))
                stack.ran_stack = ran_stack
                for step, module in enumerate(layers):
                    module.bind_stack(ran_stack, step)
            if config.ran_drop_position_embeddings in (site, "both"):
                stack.embed_positions = NoPositionalEmbedding()

    @classmethod
    def max_positions(cls, config):
        """Generation is capped at Lmax target positions when the decoder uses RAN."""
        if "recurrent" in config.attention_layout()["decoder"]:
            return config.ran_max_positions
        return None

    def setup(self, config):
        self.max_len = config.ran_max_positions
        p = config.ran_attention_dropout
        self.ran_dropout = float(config.attention_dropout if p is None else p)
        self.ran_step = None

    def init_variant_weights(self, init) -> None:
        """The stack's A_0 and Rec, initialised through its first layer (the stack is not a variant module)."""
        if self.ran_step == 0:
            self.ran_stack.init_variant_weights(init)
            self.ran_stack.transition.init_variant_weights(init)

    def freeze_fixed_weights(self) -> None:
        if self.ran_step == 0:
            self.ran_stack.freeze_fixed_weights()

    def bind_stack(self, stack: RanStack, step: int) -> None:
        """Reference the stack without registering it as a submodule (it has one owner: the stack module)."""
        object.__setattr__(self, "_ran_stack", stack)
        self.ran_step = step

    @property
    def ran_stack(self) -> RanStack:
        stack = self.__dict__.get("_ran_stack")
        if stack is None:
            raise RuntimeError("this RAN layer is not attached to a stack; build it through an hf-attn model")
        return stack

    # ---- forward ----------------------------------------------------------------------------------------------
    def layer_matrix(self, length: int | None = None) -> torch.Tensor:
        """This layer's learned logits A_l, detached float32 ``[H, length, length]`` (default Lmax)."""
        return self.ran_stack.matrices(length)[self.ran_step]

    def attend(self, q, k, v, keep, ctx):
        tgt_len, src_len, past, output_attentions = keep.q_len, v.shape[2], ctx.past, ctx.output_attentions
        check_length(max(src_len, past + tgt_len), self.max_len, self.variant, "ran_max_positions")
        if past == 0 and self.ran_step == 0:  # once per stack and input (never per decoding step: no sync)
            check_right_padding(keep, self.variant, self.site)
        a = self.ran_stack.layer_logits(self.ran_step, past + tgt_len, None if ctx.state is None else ctx.state.shared)
        logits = a[:, past : past + tgt_len, :src_len]  # cached decoding: the row of the current position
        return positional_softmax(logits, keep, v, self.ran_dropout, self.training, output_attentions)  # Eq. 2

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, step={self.ran_step}, max_positions={self.max_len}"
