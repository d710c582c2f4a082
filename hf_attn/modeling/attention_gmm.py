"""Gaussian-mixture cross-attention (Zhang & Feng 2021, "Modeling Concentrated Cross-Attention for Neural Machine
Translation with Gaussian Mixture Model", Findings of EMNLP). No official code exists; where the paper is silent
the choice is stated where it is made (e.g. ``gmm_sigma_min``).

Per decoder layer, small FFNs shared by the heads read each head's query Q(s_i) (size dh):
    ffn(x)  = V^T tanh(W^T x + b1) + b2        W: dh x dh, V: dh x K (dh x 1 for the gate)      Eq. 7-9, 14
    alpha   = softmax(q k^T / sqrt(dh))          dot-product ("distributed") attention          Eq. 1-2
    w       = softmax(w_hat)                                                                     Eq. 10
    mu      = J * sigmoid(mu_hat)                J = number of real (non-padding) source tokens  Eq. 11
    sigma   = min(J/6 * sigmoid(sigma_hat), mu/3, (J - mu)/3)    "approximate normalisation"     Eq. 12
    sigma   = max(sigma, gmm_sigma_min)          the paper is silent; sigma -> 0 at the edges gives NaN
    beta_ij = sum_k w_k / sqrt(2 pi sigma_k^2) * exp(-(j - mu_k)^2 / (2 sigma_k^2))              Eq. 6
              (each term's log floored at -60: e^-60 is 0 next to any weight in float32; not in the paper)
    g       = sigmoid(ffn_g(q))                  one gate per head and target token              Eq. 14
    gamma   = (1 - g) alpha + g beta ;  context = dropout(gamma) V                               Eq. 13, 15
j is the 0-based position of a source token among the real ones (padding on either side is skipped, so left
padding works too); beta = 0 on padding. Everything above runs in float32, also under fp16/bf16 autocast.
Eq. 6 itself and the source geometry it reads are in `gmm_mixture` (`log_densities`, `MixtureDensity`).

Variants (config switches; presets below):
  gmm_normalization  approximate (Eq. 12) | strict (Table 1: sigma = J sigmoid(.), beta renormalised to sum 1)
                     | synthesis (Table 1, Graves 2013: Z = 1, w = exp(.), mu_i = mu_{i-1} + exp(.),
                       sigma = sqrt(exp(-.)/2); recurrent over target positions: during cached decoding the last
                       mu lives on the module, resets when the cache is empty, and is reordered by beam search)
  gmm_share_mean / gmm_share_sigma / gmm_share_weight   one value for all K components (Table 3)
  gmm_fusion         gate (Eq. 13) | average (alpha + beta) / 2 | gmm_only (beta) | dot (alpha)     (Table 4)
  gmm_layer_subset   all | top2 | middle2 | bottom2 (Table 5): the decoder layers that use GMM (the others use
                     softmax), resolved by the config's layout (`layer_subset`); the config itself is not changed
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention_base import VariantAttention
from .citations import CITATIONS
from .fused import SDPA, dispatch
from .gmm_mixture import (
    NORMALIZATION_SCALE,
    SYNTHESIS_MAX_LOG_STEP,
    SYNTHESIS_MAX_LOG_WEIGHT,
    MixtureDensity,
    SourceGeometry,
    log_densities,
)
from .hyperparameters import HfAttnConfigError, Hyperparameter, Preset
from .kernels import float32_autocast_off, weighted_values
from .masking import nonempty

GMM_PAPER = CITATIONS["gmm"]
NORMALIZATIONS = ("approximate", "strict", "synthesis")
FUSIONS = ("gate", "average", "gmm_only", "dot")
LAYER_SUBSETS = ("all", "top2", "middle2", "bottom2")


def _gmm(**extra) -> dict:
    """Preset overrides: GMM cross-attention, softmax self-attention (the paper's setting)."""
    return {"encoder_attention": "softmax", "decoder_attention": "softmax", "cross_attention": "gmm", **extra}


def subset_layers(subset: str, num_layers: int) -> list[int] | None:
    """Decoder layers (0-based) of a named subset of a ``num_layers``-layer decoder; None for "all".

    bottom2 = [0, 1]; top2 = [n-2, n-1]; middle2 = [(n-2)//2, (n-2)//2 + 1] (the lower middle pair when n is odd).
    With the paper's 6 layers: bottom2 = L1-L2, middle2 = L3-L4, top2 = L5-L6 (Table 5).
    """
    if subset == "all":
        return None
    if num_layers < 2:
        raise HfAttnConfigError(
            f"gmm_layer_subset={subset!r} needs at least 2 decoder layers, the model has decoder_layers={num_layers}; "
            "use gmm_layer_subset='all'"
        )
    start = {"bottom2": 0, "middle2": (num_layers - 2) // 2, "top2": num_layers - 2}[subset]
    return [start, start + 1]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x with zero rows appended up to ``rows`` rows (first dimension)."""
    return x if x.shape[0] == rows else torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


class GmmFFN(nn.Module):
    """ffn(x) = V^T tanh(W^T x + b1) + b2 (Eq. 7-9, 14), shared by the heads of one layer."""

    def __init__(self, dim: int, out_features: int):
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, out_features)


class GmmAttention(VariantAttention):
    """Dot-product cross-attention fused with a K-component Gaussian mixture over source positions."""

    variant = "gmm"
    description = "Gaussian-mixture cross-attention fused with dot-product attention by a learned gate (Zhang & Feng 2021)"
    sites = ("cross",)
    hyperparameters = (
        Hyperparameter("gmm_num_components", int, 4, "Gaussian components K per head (Zhang & Feng 2021, Sec. 5.3: "
                       "best at 4)", low=1, symbol="K (Sec. 5.3)"),
        Hyperparameter("gmm_normalization", str, "approximate", "approximate (Eq. 12), strict (Table 2 Our "
                       "Method+Norm.) or synthesis (Table 2, Graves 2013) (Zhang & Feng 2021)", choices=NORMALIZATIONS,
                       symbol="the mixture's normalisation (Eq. 12)"),
        Hyperparameter("gmm_fusion", str, "gate", "fusion with dot-product attention: gate (Eq. 13); average, "
                       "gmm_only, dot are Table 4 ablations (Zhang & Feng 2021)", choices=FUSIONS,
                       symbol="the gate g fusing the two attentions (Eq. 13)"),
        Hyperparameter("gmm_share_mean", bool, False, "one mean for all components (Zhang & Feng 2021, Table 3)",
                       symbol="mu shared by the K components (Table 3)"),
        Hyperparameter("gmm_share_sigma", bool, False, "one variance for all components (Zhang & Feng 2021, Table 3)",
                       symbol="sigma shared by the K components (Table 3)"),
        Hyperparameter("gmm_share_weight", bool, False, "equal component weights (Zhang & Feng 2021, Table 3)",
                       symbol="equal component weights (Table 3)"),
        Hyperparameter("gmm_sigma_min", float, 0.5, "floor on sigma in source positions, not in Zhang & Feng 2021: "
                       "below ~0.5 the mixture at integer positions no longer sums to ~1", low=0.0, low_open=True,
                       symbol="a floor on sigma (not in the paper)"),
        Hyperparameter("gmm_gate_init", float, 0.1, "the gate's initial value g0: its output bias starts at "
                       "logit(g0). Zhang & Feng 2021 give no init; 0.1 (mostly dot-product attention at first) beat 0.5 "
                       "(zero bias) in hf-attn's recipe-sensitivity runs (docs/papers/gmm.md)", low=0.0, high=1.0,
                       low_open=True, high_open=True, symbol="g at initialisation (Eq. 13; no value in the paper)"),
        Hyperparameter("gmm_layer_subset", str, "all", "decoder layers using GMM, softmax elsewhere: all, or top2 / "
                       "middle2 / bottom2 (Zhang & Feng 2021, Table 5)", choices=LAYER_SUBSETS,
                       symbol="the GMM layers (Table 5)"),
    )
    presets = (
        Preset("gmm", "GMM cross-attention, approximate normalisation, gate fusion (Table 2, Our Method); the gate "
               "starts at 0.1, which the paper leaves open (0.5 trains slower: docs/papers/gmm.md)",
               GMM_PAPER, _gmm()),
        Preset(
            "gmm-strict",
            "GMM cross-attention with strict normalisation (Table 2, Our Method+Norm.)",
            GMM_PAPER,
            _gmm(gmm_normalization="strict"),
        ),
        Preset(
            "gmm-synthesis",
            "baseline: unnormalised synthesis-network mixture, recurrent over target positions (Table 2, Graves 2013)",
            GMM_PAPER,
            _gmm(gmm_normalization="synthesis"),
        ),
        Preset(
            "gmm-average",
            "ablation: average of dot-product and GMM attention instead of the gate (Table 4)",
            GMM_PAPER,
            _gmm(gmm_fusion="average"),
        ),
        Preset("gmm-only", "ablation: Gaussian mixture attention alone (Table 4)", GMM_PAPER, _gmm(gmm_fusion="gmm_only")),
        Preset(
            "gmm-top2", "GMM in the top 2 decoder layers, softmax below (Table 5)", GMM_PAPER, _gmm(gmm_layer_subset="top2")
        ),
        Preset(
            "gmm-middle2",
            "GMM in the middle 2 decoder layers, softmax elsewhere (Table 5)",
            GMM_PAPER,
            _gmm(gmm_layer_subset="middle2"),
        ),
        Preset(
            "gmm-bottom2",
            "GMM in the bottom 2 decoder layers, softmax above (Table 5)",
            GMM_PAPER,
            _gmm(gmm_layer_subset="bottom2"),
        ),
        Preset("gmm-share-mean", "ablation: one mean for all components (Table 3)", GMM_PAPER, _gmm(gmm_share_mean=True)),
        Preset(
            "gmm-share-sigma", "ablation: one variance for all components (Table 3)", GMM_PAPER, _gmm(gmm_share_sigma=True)
        ),
        Preset(
            "gmm-share-weight",
            "ablation: equal component weights (Table 3)",
            GMM_PAPER,
            _gmm(gmm_share_weight=True),
        ),
    )

    # ---- configuration ----------------------------------------------------------------------------------------
    @classmethod
    def validate_config(cls, config):
        """``gmm_layer_subset`` against the decoder depth and ``cross_attention(_layers)`` (Table 5).

        The subset applies only when ``cross_attention == "gmm"``; other layers then use softmax. An explicit,
        different ``cross_attention_layers`` is an error (set one of the two). Reads the config, never changes it.
        """
        subset = config.gmm_layer_subset
        choice = config.cross_attention
        if subset == "all":
            return
        if isinstance(choice, (list, tuple)):
            if "gmm" in choice:
                raise HfAttnConfigError(
                    f"gmm_layer_subset={subset!r} needs cross_attention='gmm' (a single name), not a per-layer list; "
                    "with a list, name the variant of each layer directly and keep gmm_layer_subset='all'"
                )
            return
        if choice != "gmm":
            return  # a GMM hyperparameter, unused by this model (as rela_* are when ReLA is not used)
        layers = subset_layers(subset, config.decoder_layers)
        given = config.cross_attention_layers
        if given is not None and sorted(given) != layers:
            raise HfAttnConfigError(
                f"gmm_layer_subset={subset!r} selects decoder layers {layers} but cross_attention_layers={given!r} "
                "was also given; set only one of them (gmm_layer_subset='all' to use cross_attention_layers)"
            )

    @classmethod
    def layer_subset(cls, config, site):
        """GMM's cross-attention layers for ``gmm_layer_subset`` and the config's decoder depth (Table 5)."""
        if site != "cross" or config.gmm_layer_subset == "all":
            return None
        return subset_layers(config.gmm_layer_subset, config.decoder_layers)

    def setup(self, config):
        self.num_components = config.gmm_num_components
        self.normalization = config.gmm_normalization
        self.fusion = config.gmm_fusion
        self.sigma_min = float(config.gmm_sigma_min)
        self.gate_init = float(config.gmm_gate_init)
        self.share_mean, self.share_sigma = config.gmm_share_mean, config.gmm_share_sigma
        # shared normalised weights are all 1/K: no FFN (its gradient would be exactly 0)
        self.uniform_weights = config.gmm_share_weight and self.normalization != "synthesis"
        k, dh = self.num_components, self.head_dim
        self.gmm_ffns: tuple[str, ...] = ()
        outs: dict[str, int] = {}  # (dot: no FFN)
        if self.fusion != "dot":
            outs = {"weight": 1 if config.gmm_share_weight else k, "mean": 1 if self.share_mean else k}
            outs["sigma"] = 1 if self.share_sigma else k
            if self.uniform_weights:
                del outs["weight"]
            if self.fusion == "gate":
                outs["gate"] = 1
            for name, n_out in outs.items():
                setattr(self, f"gmm_{name}", GmmFFN(dh, n_out))
            self.gmm_ffns = tuple(outs)
        # each FFN's columns in `ffn_joint`'s output, one block of `ffn_block` columns per FFN (the unused ones of a
        # block are 0; mean, sigma, gate adjacent: `mixture_parameters`' one sigmoid)
        self.ffn_block = max(outs.values(), default=0)
        self.ffn_columns = {name: slice(i * self.ffn_block, i * self.ffn_block + outs[name])
                            for i, name in enumerate(self.gmm_ffns)}
        self.freeze_fixed_weights()

    def freeze_fixed_weights(self) -> None:
        """gmm_only has no dot-product attention, so k_proj would get no gradient: it stays frozen, also after
        loading (the model calls this hook after from_pretrained; a resumed run's optimizer must see the same
        trainable parameters as the run that saved it)."""
        if self.fusion == "gmm_only":
            self.k_proj.requires_grad_(False)

    def init_variant_weights(self, init):
        """Xavier-uniform FFN weights, zero biases: at start mu = J/2 (synthesis: steps of 1 position) and g =
        gmm_gate_init on average (the gate's output bias is logit(g0))."""
        for name in self.gmm_ffns:
            ffn = getattr(self, f"gmm_{name}")
            for lin in (ffn.hidden, ffn.out):
                init.xavier_uniform_(lin.weight)
                init.zeros_(lin.bias)
        if "gate" in self.gmm_ffns and self.gate_init != 0.5:  # (logit(0.5) = 0: the zero bias above)
            init.constant_(self.gmm_gate.out.bias, math.log(self.gate_init / (1 - self.gate_init)))

    # ---- forward ----------------------------------------------------------------------------------------------
    def attend(self, q, k, v, keep, ctx):
        """gamma = fuse(alpha, beta) (Eq. 13); returns (gamma V (Eq. 15), gamma or None)."""
        details = ctx.state is not None and ctx.state.details is not None
        # the product distributed over the fusion (alpha V by SDPA) where `fused.dispatch` says so: the paper drops
        # gamma with one dropout mask, SDPA would drop alpha with its own, so not with attention dropout
        if dispatch(self, q, SDPA, details or ctx.output_attentions, supported=not self.attn_dropout) == SDPA:
            return self.attend_distributed(q, k, v, keep, ctx), None
        with float32_autocast_off(q):
            q32 = q.float()
            geometry = self.source_geometry(keep, ctx)
            alpha = None
            if self.fusion != "gmm_only":
                alpha = self.dot_product(q32, k.float(), keep, geometry)
            if self.fusion == "dot":
                gamma, beta, params = alpha, None, {}
            else:
                beta, g, params = self.mixture_attention(self.ffn_joint(q32), geometry, ctx, details=details)
                if self.fusion == "gate":  # g = sigmoid(ffn_g(q)), Eq. 14, [B, H, T, 1]
                    gamma = torch.lerp(alpha, beta, g)  # Eq. 13: (1 - g) alpha + g beta, in one op
                    if details:
                        params["gate"] = g.squeeze(-1)
                    if ctx.state is not None and ctx.cache is None:  # a training / scoring pass, not a decoding step
                        ctx.state.log(f"gmm_gate_layer{self.layer_idx}", g.mean())
                elif self.fusion == "average":
                    gamma = 0.5 * (alpha + beta)
                else:
                    gamma = beta
        if details:
            ctx.state.record(self.site, self.layer_idx, {"alpha": alpha, "beta": beta, "gamma": gamma, **params})
        return weighted_values(gamma, v, self.attn_dropout, self.training, ctx.output_attentions)

    def attend_distributed(self, q, k, v, keep, ctx):
        """gamma V with the product distributed over the fusion (Eq. 13, 15): (1 - g) (alpha V) + g (beta V), alpha V
        by `F.scaled_dot_product_attention` (flash on GPU: alpha is never formed), beta (Eq. 6) as in `attend`.
        average: (alpha V + beta V) / 2; gmm_only: beta V; dot: alpha V. Without attention dropout only."""
        alpha_v = None
        if self.fusion != "gmm_only":  # Eq. 1-2 and alpha V, in q's dtype (float32 accumulation in SDPA)
            mask, _ = keep.sdpa_mask(q.dtype)
            alpha_v = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        if self.fusion == "dot":
            return alpha_v
        with float32_autocast_off(q):
            geometry = self.source_geometry(keep, ctx)
            beta, g, _ = self.mixture_attention(self.ffn_joint(q.float()), geometry, ctx, details=False)
            if self.fusion == "gate":  # Eq. 13: (1 - g) alpha V + (g beta) V
                if ctx.state is not None and ctx.cache is None:
                    ctx.state.log(f"gmm_gate_layer{self.layer_idx}", g.mean())
                beta_v = torch.matmul((beta * g).to(v.dtype), v)
                return torch.addcmul(beta_v.float(), 1 - g, alpha_v.float()).to(v.dtype)
            beta_v = torch.matmul(beta.to(v.dtype), v)
            if self.fusion == "average":
                return torch.add(beta_v.float(), alpha_v.float()).mul_(0.5).to(v.dtype)
            return beta_v

    def dot_product(self, q, k, keep, geometry):
        """alpha = softmax(q k^T / sqrt(dh)) over the real source tokens (Eq. 1-2), float32. A single query row
        (a decoding step) takes its mask from the source geometry (adding 0 or the dtype's minimum equals
        masked_fill with the minimum exactly); several rows use ``keep`` itself (any cross-attention mask)."""
        scores = torch.matmul(q, k.transpose(-1, -2))
        if q.shape[-2] == 1:
            return torch.softmax(torch.add(geometry.bias, scores, alpha=self.scaling), dim=-1)
        return torch.softmax(keep.fill_hidden(scores.mul_(self.scaling), torch.finfo(scores.dtype).min), dim=-1)

    def ffn_outputs(self, q):
        """{'weight'|'mean'|'sigma'|'gate': ffn(q)} (Eq. 7-9, 14): `ffn_joint`'s columns by FFN."""
        out = self.ffn_joint(q)
        return {name: out[..., cols] for name, cols in self.ffn_columns.items()}

    def ffn_joint(self, q):
        """Every FFN's output on q [B,H,T,dh] (Eq. 7-9, 14), side by side [B,H,T,n] (`ffn_columns`). The FFNs run
        as two matmuls (`ffn_weights`), with tanh(a) = 2 sigmoid(2a) - 1 folded into them: V^T tanh(W^T x + b1) + b2
        = 2V^T s + (b2 - V^T 1), s = sigmoid(2 W^T x + 2 b1) (within 1e-6 of tanh; torch's CPU tanh is 3-4x slower
        than sigmoid). The rows are the matmuls' columns: [hidden, rows] = W [hidden, dh] @ q^T, with the bias added
        by addmm; on CPU this runs the small-output matmuls in about half the time of ``F.linear`` on the 4-d q. The
        output layers are one batched matmul over the FFNs ([FFN, block, dh] @ [FFN, dh, rows]): each reads its own
        FFN's hidden units only, a quarter of one matmul over all of them."""
        w1, b1, w2, b2 = self.ffn_weights()
        hidden = torch.addmm(b1, w1, q.reshape(-1, q.shape[-1]).T).sigmoid_()  # (addmm's gradient needs no output)
        out = torch.baddbmm(b2, w2, hidden.view(w2.shape[0], w2.shape[-1], -1))
        return out.view(-1, out.shape[-1]).T.view(*q.shape[:-1], -1)

    def ffn_weights(self):
        """(2 W, 2 b1, 2 V, b2 - V^T 1) of `ffn_joint`, float32 (biases as columns): the FFNs' hidden layers stacked
        [FFN * dh, dh], their output layers [FFN, block, dh] (zero rows pad an FFN with fewer outputs to the block).
        Without autograd (decoding) they are built once and kept until a parameter changes, not at every step."""
        # per FFN: hidden.weight, hidden.bias, out.weight, out.bias (read from the module dicts: this runs at every
        # decoding step, and nn.Module.__getattr__ costs more than the rest of the cache check)
        ffns = [self._modules[f"gmm_{name}"]._modules for name in self.gmm_ffns]
        params = [p for f in ffns for lin in (f["hidden"], f["out"]) for p in lin._parameters.values()]
        key = None
        # (under torch.compile the graph builds them: a cache keyed on storage pointers would break it at every call)
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            key = tuple((p.data_ptr(), p._version) for p in params)  # (a new dtype or device: a new data_ptr)
            cached = self.__dict__.get("_ffn_weights")
            if cached is not None and cached[0] == key:
                return cached[1]
        block = self.ffn_block
        out_weight = torch.stack([_pad_rows(w.float(), block) for w in params[2::4]])
        out_bias = torch.stack([_pad_rows(b.float(), block) for b in params[3::4]]) - out_weight.sum(-1)
        weights = (
            2 * torch.cat(params[0::4]).float(),
            2 * torch.cat(params[1::4]).float()[:, None],
            2 * out_weight,
            out_bias[..., None],
        )
        self.__dict__["_ffn_weights"] = None if key is None else (key, weights)
        return weights

    def mixture_attention(self, out, geometry, ctx, details: bool = True):
        """(beta [B,H,T,S] (Eq. 6, or its Table 1 variants), the gate g [B,H,T,1] of Eq. 14 (None without the gate
        fusion), and with ``details`` the mixture parameters {weights, mu, sigma, J} (else {}: decoding steps skip
        them)), from ``out``, the FFNs' joint output (`ffn_joint`)."""
        log_coef, mu, r, c, gate, params = self.mixture_parameters(out, geometry, ctx, details)
        if self.normalization == "strict":  # beta / sum_j beta (Table 1, "Our Method+Norm.")
            log_beta = torch.logsumexp(log_densities(log_coef, mu, r, c, geometry.pos)[0], dim=-2) + geometry.bias
            beta = torch.softmax(log_beta, dim=-1) * geometry.visible  # (+ bias = masked_fill(~visible, min), exactly)
        elif torch.is_grad_enabled():
            beta = MixtureDensity.apply(log_coef, mu, r, c, geometry.pos, geometry.scale)
        else:
            beta = MixtureDensity.evaluate(log_coef, mu, r, c, geometry.pos, geometry.scale)[0]
        if details:
            params["source_length"] = geometry.length.flatten()
        return beta, gate, params

    def source_geometry(self, keep, ctx) -> SourceGeometry:
        """The source-side quantities of Eq. 6 and 11-12 (`SourceGeometry`), from the cross-attention mask.

        They depend on the source only: during cached decoding they are computed at the first step and kept in
        the decoding state (one entry shared by the GMM layers), not recomputed at every step."""
        name, cached = "gmm_source_geometry", ctx is not None and ctx.cache is not None
        rows = ctx.hidden_states.shape[0] if cached else None
        geometry = ctx.cache.get_state(name) if cached and ctx.past > 0 else None
        if geometry is None or geometry.shape[0] != rows or geometry.shape[-1] != keep.k_len:
            real = keep.real_keys()  # [B|1, 1, 1, S]
            real_f = real.float()
            length = real_f.sum(-1, keepdim=True)  # J
            pos = real_f.cumsum(-1) - 1
            visible = nonempty(real).float()
            bias = (visible - 1) * -torch.finfo(real_f.dtype).min  # 0 on visible keys, the dtype's minimum elsewhere
            scale = real_f * NORMALIZATION_SCALE[self.normalization]
            half = (length / 2).expand_as(real_f)
            geometry = torch.stack([scale, pos, length.expand_as(real_f), half, visible, bias], dim=2)  # [B|1,1,6,1,S]
            if cached:  # per hypothesis row (reordered with the beams only when they move between sentences)
                geometry = geometry.expand(rows, -1, -1, -1, -1)
                ctx.cache.set_state(name, geometry)
        # the same state tensor at every step of a beam search: its views are made once (eagerly; a compiled graph
        # makes them itself)
        memo = cached and not torch.compiler.is_compiling()
        known = self.__dict__.get("_geometry_views") if memo else None
        if known is not None and known[0] is geometry:
            return known[1]
        scale, pos, length, length_2, visible, bias = geometry.unbind(2)
        views = SourceGeometry(scale, pos, length[..., :1], length_2[..., :1], visible, bias)
        if memo:
            self.__dict__["_geometry_views"] = (geometry, views)
        return views

    def mixture_parameters(self, out, geometry, ctx, details: bool = False):
        """(log_coef, mu, r, c, g, params) from the FFNs' joint output ``out`` (Table 1, Eq. 10-12, 14), each
        [B,H,T,K] (g: [B,H,T,1] or None): component k at source position j has log(w_k / Z_k) - (j - mu_k)^2 /
        (2 sigma_k^2) = log_coef_k - c ((j - mu_k) r_k)^2, with log_coef = log(w / width), r = 1 / width and
        Z = width / geometry.scale; ``params`` holds {weights, mu, sigma} with ``details``, else it is empty.

        approximate: width = 3 sigma, c = 9/2; strict: width = sigma, c = 1/2; synthesis (Z = 1): r = 1 / (sqrt(2)
        sigma), c = 1, log_coef = log w."""
        cols, k, sigma_min, length = self.ffn_columns, self.num_components, self.sigma_min, geometry.length
        shape = (*out.shape[:-1], k)
        if self.normalization == "synthesis":  # Graves 2013 (Table 1): Z = 1
            gate = torch.sigmoid(out[..., cols["gate"]]) if self.fusion == "gate" else None
            log_w = out[..., cols["weight"]].clamp(max=SYNTHESIS_MAX_LOG_WEIGHT - math.log(k)).expand(shape)  # w = e^.
            mu = self.synthesis_means(out[..., cols["mean"]].clamp(max=SYNTHESIS_MAX_LOG_STEP).exp().expand(shape), ctx)
            # sigma = sqrt(exp(-sigma_hat) / 2)  <=>  r = 1 / (sqrt(2) sigma) = exp(sigma_hat / 2) ; sigma >= sigma_min
            r = (0.5 * out[..., cols["sigma"]].clamp(max=-math.log(2 * sigma_min**2))).exp().expand(shape)
            params = {}
            if details:
                params = {"weights": log_w.exp(), "mu": mu, "sigma": torch.rsqrt(2 * r.square().clamp(min=1e-30))}
            return log_w, mu, r, 1.0, gate, params
        # Eq. 11, 12 (strict: sigma) and 14 take a sigmoid of their FFN's output: adjacent columns, one op
        first = cols["mean"].start
        squashed = torch.sigmoid(out[..., first:])

        def sigmoid_of(name):
            return squashed[..., cols[name].start - first:cols[name].stop - first]

        gate = sigmoid_of("gate") if self.fusion == "gate" else None
        if self.uniform_weights:
            log_w = torch.full(shape, -math.log(k), device=out.device)
        else:
            # Eq. 10, over the weight rows of the FFNs' [n, rows] product (`ffn_joint`): on CPU a softmax over a last
            # dimension of K = 4 runs 10x slower than over the first of a [K, rows] tensor
            log_w = torch.log_softmax(out.flatten(0, -2).T[cols["weight"]], dim=0).T.view(shape)
        mu = (length * sigmoid_of("mean")).expand(shape)  # Eq. 11
        if self.normalization == "approximate":  # Eq. 12 times 3: 3 sigma = min(J/2 sigmoid(sigma_hat), mu, J - mu)
            width = torch.minimum(geometry.length_2 * sigmoid_of("sigma"), torch.minimum(mu, length - mu))
            width, c = width.clamp(min=3 * sigma_min), 4.5  # (j - mu)^2 / (2 sigma^2) = 9/2 ((j - mu) / (3 sigma))^2
        else:  # strict (Table 1): sigma = J * sigmoid(sigma_hat)
            width, c = (length * sigmoid_of("sigma")).clamp(min=sigma_min).expand(shape), 0.5
        params = {}
        if details:
            sigma = width / 3 if self.normalization == "approximate" else width
            params = {"weights": log_w.exp(), "mu": mu, "sigma": sigma}
        return log_w - torch.log(width), mu, width.reciprocal(), c, gate, params

    # ---- synthesis network: state over target positions -----------------------------------------------------------
    def synthesis_means(self, steps, ctx):
        """mu_i = mu_{i-1} + exp(mu_hat_i), mu_{-1} = 0 (Table 1): recurrent over target positions.

        During cached decoding the centres so far are decoding state, kept in the cache (`HfAttnCache`), which
        reorders them with the hypotheses in beam search and crops them with the keys and values."""
        mu = steps.cumsum(dim=2)
        if ctx.cache is None:
            return mu
        name = f"gmm_synthesis_mu.{self.layer_idx}"
        history = ctx.cache.get_state(name) if ctx.past > 0 else None
        if ctx.past > 0:
            if history is None or history.shape[0] != mu.shape[0] or history.shape[2] != ctx.past:
                raise RuntimeError(
                    "gmm synthesis: a cached decoding step arrived without the matching state (the cache was built "
                    "by another call or the batch changed); start decoding from an empty cache or use use_cache=False"
                )
            mu = mu + history[:, :, -1:]
            mu_all = torch.cat([history, mu], dim=2)
        else:
            mu_all = mu
        ctx.cache.set_state(name, mu_all, target_dim=2)
        return mu

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, K={self.num_components}, normalization={self.normalization}, "
            f"fusion={self.fusion}, sigma_min={self.sigma_min}"
        )
