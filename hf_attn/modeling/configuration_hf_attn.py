"""Configurations: Marian / BART configs plus a choice of attention variant per site and layer.

Sites: ``encoder_attention`` (encoder self-attention), ``decoder_attention`` (decoder self-attention),
``cross_attention`` (encoder-decoder attention). Each is a variant name from the registry, or a list with one
name per layer. ``*_attention_layers`` optionally restricts a site's variant to some layers (others: softmax).
Variant hyperparameters are flat fields (``rela_norm``, ``gmm_num_components``, ...) with the papers' defaults,
declared once by each variant's ``hyperparameters`` (`Hyperparameter`: type, default, valid values, help), and
checked by one generic checker. ``attention_kernels`` picks where attention runs: ``"auto"`` (the fused Triton kernels on CUDA where triton is
installed), ``"triton"`` or ``"eager"`` (`fused.dispatch`; ``HF_ATTN_KERNELS`` overrides it). Validation never
changes the config; the construction only puts values in their
declared type (2.0 -> 2 for an int field, tuples -> lists: values read back from JSON) and maps the old variant name
``relu`` to ``reluformer``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# first: on a transformers below the floor, one error line before anything else is imported
from .compat import MIN_TRANSFORMERS

from huggingface_hub.dataclasses import strict
from transformers import BartConfig, MarianConfig

from .fused import check_kernel_mode
from .hyperparameters import SITES, HfAttnConfigError, Hyperparameter, did_you_mean
from .kernels import register
from .presets import PRESETS
from .registry import ATTENTION_VARIANTS

# transformers <= 5.9, loading a model from a local directory, copies into its modules folder only the files an
# auto_map module imports directly (dynamic_module_utils.get_cached_module_file; 5.10 follows imports recursively):
# this module, and modeling_hf_attn, import every file of the model code that their imports reach
from .attention_base import VariantAttention  # noqa: F401
from .attention_blockwise import BlockOptions  # noqa: F401
from .attention_calibration import CalibratedAttention  # noqa: F401
from .attention_fixed import HardGaussianAttention  # noqa: F401
from .attention_gmm import GmmFFN  # noqa: F401
from .attention_positional import PositionalAttention  # noqa: F401
from .attention_ran import RanStack  # noqa: F401
from .attention_rela import RelaAttention  # noqa: F401
from .attention_reluformer import reluformer_attention  # noqa: F401
from .attention_softmax import SoftmaxAttention  # noqa: F401
from .cache import HfAttnCache  # noqa: F401
from .citations import Citation  # noqa: F401
from .forward_state import ForwardState  # noqa: F401
from .gmm_mixture import MixtureDensity  # noqa: F401
from .masking import KeepMask  # noqa: F401
from .triton_calibration import MODES  # noqa: F401
from .triton_relu import triton_supports  # noqa: F401

# variant names of earlier releases, still accepted (saved config.json files): old name -> current name
RENAMED_VARIANTS = {"relu": "reluformer"}


def hyperparameters() -> dict[str, Hyperparameter]:
    """Every variant hyperparameter by field name, gathered from the registry."""
    return {hp.name: hp for cls in ATTENTION_VARIANTS.values() for hp in cls.hyperparameters}


def variant_defaults() -> dict:
    """Every variant hyperparameter with its default."""
    return {name: hp.initial() for name, hp in hyperparameters().items()}


def current_variant_names(choice):
    """A site's variant choice (a name or a per-layer list) with renamed variants under their current names."""
    if isinstance(choice, (list, tuple)):
        return [RENAMED_VARIANTS.get(x, x) if isinstance(x, str) else x for x in choice]
    return RENAMED_VARIANTS.get(choice, choice) if isinstance(choice, str) else choice


@dataclass(repr=False)
class HfAttnConfigMixin:
    """Fields and validation shared by `HfAttnMarianConfig` and `HfAttnBartConfig`."""

    encoder_attention: str | list = "softmax"
    decoder_attention: str | list = "softmax"
    cross_attention: str | list = "softmax"
    encoder_attention_layers: list | None = None
    decoder_attention_layers: list | None = None
    cross_attention_layers: list | None = None
    preset: str | None = None
    attention_kernels: str = "auto"  # "auto" | "triton" | "eager": fused Triton kernels or the eager path (fused.py)

    def __post_init__(self, **kwargs):
        super().__post_init__(**self._prepare(kwargs))
        self._finish()

    def _prepare(self, kwargs: dict) -> dict:
        """Before the base config's own construction: the variant hyperparameters of ``kwargs`` checked for unknown
        names and put in their declared types, the sites' renamed variants under their current names."""
        register()  # the "hf_attn" attention implementation this config's models run under
        declared = hyperparameters()
        unknown = [k for k in kwargs if k.split("_")[0] in _variant_prefixes() and k not in declared]
        if unknown:
            raise HfAttnConfigError(
                f"unknown attention hyperparameter {unknown[0]!r}{did_you_mean(unknown[0], declared)}; "
                f"valid ones: {sorted(declared)}"
            )
        for key, hp in declared.items():
            kwargs[key] = hp.normalise(kwargs.get(key, getattr(self, key, hp.initial())))
        for site in SITES:
            setattr(self, f"{site}_attention", current_variant_names(getattr(self, f"{site}_attention")))
        return kwargs

    def _finish(self) -> None:
        self.keys_to_ignore_at_inference = ["cache", "past_key_values", "aux_loss", "aux_logs"]
        # saved in config.json: the oldest transformers this model's code runs on (compat.py; the model card says it)
        self.min_transformers_version = MIN_TRANSFORMERS
        self.validate_attention()

    # ---- attention outputs ------------------------------------------------------------------------------------
    # transformers allows config.output_attentions only under "eager": hf-attn's own implementation returns every
    # variant's weights whenever they are asked for (by argument or by this flag), so it is allowed here too.
    @property
    def output_attentions(self):
        return self._output_attentions

    @output_attentions.setter
    def output_attentions(self, value: bool):
        self._output_attentions = value

    def validate_output_attentions(self):
        pass

    # ---- layout ---------------------------------------------------------------------------------------------
    def num_layers(self, site: str) -> int:
        return self.encoder_layers if site == "encoder" else self.decoder_layers

    def attention_layers(self, site: str) -> list[int] | None:
        """The layers of ``site`` that use its single variant (others: softmax); None = all of them.

        ``<site>_attention_layers`` when set, else the variant's own subset (GMM: ``gmm_layer_subset``, Table 5).
        """
        layers = getattr(self, f"{site}_attention_layers")
        choice = getattr(self, f"{site}_attention")
        if layers is None and isinstance(choice, str) and choice in ATTENTION_VARIANTS:
            return ATTENTION_VARIANTS[choice].layer_subset(self, site)
        return layers

    def attention_variant(self, site: str, layer: int) -> str:
        """The variant name used at ``site`` ('encoder' | 'decoder' | 'cross') in layer ``layer``."""
        choice = getattr(self, f"{site}_attention")
        if isinstance(choice, (list, tuple)):
            return choice[layer]
        layers = self.attention_layers(site)
        if layers is not None and layer not in layers:
            return "softmax"
        return choice

    def attention_layout(self) -> dict[str, list[str]]:
        """``{'encoder': [variant per layer], 'decoder': [...], 'cross': [...]}``."""
        return {s: [self.attention_variant(s, i) for i in range(self.num_layers(s))] for s in SITES}

    def validate_attention(self) -> None:
        """One clear error for a bad site variant, layer list, hyperparameter or model size; never changes the
        config."""
        check_sizes(self)
        self.validate_sites()
        check_kernel_mode(self.attention_kernels)
        for hp in hyperparameters().values():  # every hyperparameter is checked, used here or not
            hp.check(getattr(self, hp.name))
        for cls in ATTENTION_VARIANTS.values():  # cross-field rules
            cls.validate_config(self)

    def validate_sites(self) -> None:
        """Each site's variant name(s) and layer subset."""
        for site in SITES:
            key, n = f"{site}_attention", self.num_layers(site)
            choice = getattr(self, key)
            check_site_value(key, choice)
            names = list(choice) if isinstance(choice, (list, tuple)) else [choice]
            if isinstance(choice, (list, tuple)) and len(names) != n:
                raise HfAttnConfigError(
                    f"{key} lists {len(names)} variants but the model has {n} layers there: give one name per layer "
                    "or a single name"
                )
            for name in names:
                if name not in ATTENTION_VARIANTS:
                    raise HfAttnConfigError(
                        f"{key}={name!r} is not an attention variant{did_you_mean(name, ATTENTION_VARIANTS)}; "
                        f"valid variants: {sorted(ATTENTION_VARIANTS)}"
                    )
                cls = ATTENTION_VARIANTS[name]
                if site not in cls.sites:
                    ok = sorted(v for v, c in ATTENTION_VARIANTS.items() if site in c.sites)
                    raise HfAttnConfigError(
                        f"{key}={name!r}: variant {name!r} only supports the {list(cls.sites)} site(s); "
                        f"variants for {site}: {ok}"
                    )
            layers = getattr(self, f"{key}_layers")
            if layers is not None:
                bad = [i for i in layers if not isinstance(i, int) or not 0 <= i < n] if isinstance(
                    layers, (list, tuple)) else [layers]
                if bad or isinstance(choice, (list, tuple)):
                    raise HfAttnConfigError(
                        f"{key}_layers={layers!r}: need layer indices in 0..{n - 1} and a single {key} name"
                    )

    # ---- presets --------------------------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, **overrides):
        """Build a config from a named preset (see `hf_attn.PRESETS`); ``overrides`` win over the preset."""
        if name not in PRESETS:
            raise HfAttnConfigError(
                f"unknown preset {name!r}{did_you_mean(name, PRESETS)}; valid presets: {sorted(PRESETS)}"
            )
        for site in SITES:  # (before the hyperparameter check, which reads the site values)
            check_site_value(f"{site}_attention", overrides.get(f"{site}_attention", "softmax"))
        check_preset_hyperparameters(name, overrides)
        return cls(**{**PRESETS[name].overrides, "preset": name, **overrides})


def check_site_value(key: str, choice) -> None:
    """One line for a site value that is neither a variant name nor a list of them (a dict, a number)."""
    names = choice if isinstance(choice, (list, tuple)) else [choice]
    if not all(isinstance(name, str) for name in names):
        raise HfAttnConfigError(
            f"{key}={choice!r} is not a variant name: give one of {sorted(ATTENTION_VARIANTS)} as a string, or a "
            "list of them, one per layer"
        )


# the stock size fields a model cannot be built without: each at least this (the layers may be 0)
SIZE_FIELDS = {"vocab_size": 1, "d_model": 1, "encoder_layers": 0, "decoder_layers": 0, "encoder_attention_heads": 1,
               "decoder_attention_heads": 1, "encoder_ffn_dim": 1, "decoder_ffn_dim": 1, "max_position_embeddings": 1}


def check_sizes(config) -> None:
    """One line for a stock size field that cannot build a model (stock transformers fails at build or at the first
    forward: ZeroDivisionError, a negative tensor dimension, an index error), and for heads that do not divide
    d_model."""
    for name, low in SIZE_FIELDS.items():
        value = getattr(config, name, None)
        if isinstance(value, int) and value < low:
            raise HfAttnConfigError(f"{name}={value}: the model needs an integer >= {low} here")
    for side in ("encoder", "decoder"):
        heads = getattr(config, f"{side}_attention_heads")
        if isinstance(heads, int) and isinstance(config.d_model, int) and config.d_model % heads:
            fits = [h for h in range(1, min(config.d_model, 16) + 1) if config.d_model % h == 0]
            raise HfAttnConfigError(
                f"{side}_attention_heads={heads} does not divide d_model={config.d_model} (each head gets d_model / "
                f"heads dimensions); give a head count that divides it, e.g. {fits}"
            )


def site_variants(fields: dict) -> dict[str, set[str]]:
    """``{site: the variant names it uses}`` of config fields (``<site>_attention``, a name or a per-layer list;
    unset: softmax)."""
    out = {}
    for site in SITES:
        choice = current_variant_names(fields.get(f"{site}_attention", "softmax"))
        out[site] = set(choice) if isinstance(choice, (list, tuple)) else {choice}
    return out


def unused_hyperparameters(preset: str, overrides: dict) -> dict[str, str]:
    """``{hyperparameter: its variant}`` for the variant hyperparameters in ``overrides`` whose variant no site of
    ``preset`` (with the site overrides in ``overrides``) uses: set, they would be ignored."""
    used = set().union(*site_variants({**PRESETS[preset].overrides, **overrides}).values())
    owner = {hp.name: variant for variant, c in ATTENTION_VARIANTS.items() for hp in c.hyperparameters}
    return {k: owner[k] for k in overrides if k in owner and owner[k] not in used}


def check_preset_hyperparameters(preset: str, overrides: dict) -> None:
    """One line for a hyperparameter override of a variant the preset does not use (a mistyped preset would
    otherwise train without a word about it). No hyperparameter is read by a variant other than its own."""
    unused = unused_hyperparameters(preset, overrides)
    if not unused:
        return
    declared = hyperparameters()
    for key in unused:  # a bad value is named as such first
        declared[key].check(declared[key].normalise(overrides[key]))
    name, variant = next(iter(unused.items()))
    cls = ATTENTION_VARIANTS[variant]
    layout = site_variants({**PRESETS[preset].overrides, **overrides})
    sites = ", ".join(f"{site} {'/'.join(sorted(v))}" for site, v in layout.items())
    with_it = [p.name for p in PRESETS.values()
               if variant in set().union(*site_variants(p.overrides).values())][:3]
    raise HfAttnConfigError(
        f"{name} is a hyperparameter of the {variant!r} attention, which preset {preset!r} does not use (its "
        f"sites: {sites}); choose a preset with it ({', '.join(with_it)}), or set a site to it too, e.g. "
        f"{cls.sites[-1]}_attention={variant!r} (--{cls.sites[-1]}_attention {variant})"
    )


def _variant_prefixes() -> set[str]:
    return {key.split("_")[0] for key in hyperparameters()}


# transformers' configs are @strict dataclasses from huggingface_hub (a dependency of transformers itself) since 5.4,
# and a subclass must be one too; 5.0-5.3 configs are plain classes built by ``__init__(**kwargs)``, where @strict on
# a subclass fails (it takes `PreTrainedConfig.validate_rope(self, ...)` for a class validator)
CONFIGS_ARE_DATACLASSES = dataclasses.is_dataclass(MarianConfig)


def hf_attn_config(cls: type) -> type:
    """The class decorator of the hf-attn configs: ``@strict`` where transformers' configs are dataclasses; on 5.0-5.3
    an ``__init__(**kwargs)`` that takes the mixin's fields and runs `HfAttnConfigMixin.__post_init__`'s steps around
    the base config's ``__init__``, and the base config's ``__eq__`` (not the mixin's, which compares its own fields
    only)."""
    if CONFIGS_ARE_DATACLASSES:
        return strict(cls)
    base = cls.__mro__[cls.__mro__.index(HfAttnConfigMixin) + 1]

    def __init__(self, **kwargs):
        for f in dataclasses.fields(HfAttnConfigMixin):
            setattr(self, f.name, kwargs.pop(f.name, f.default))
        base.__init__(self, **self._prepare(kwargs))
        self._finish()

    cls.__init__, cls.__eq__, cls.__hash__ = __init__, base.__eq__, base.__hash__
    return cls


@hf_attn_config
class HfAttnMarianConfig(HfAttnConfigMixin, MarianConfig):
    """`MarianConfig` with a choice of attention variant per site and layer."""

    model_type = "hf_attn_marian"


@hf_attn_config
class HfAttnBartConfig(HfAttnConfigMixin, BartConfig):
    """`BartConfig` with a choice of attention variant per site and layer."""

    model_type = "hf_attn_bart"
