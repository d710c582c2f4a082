"""Declarations shared by the variants and the config: the attention sites, the config error, named presets and
typed hyperparameters (`Hyperparameter`: type, paper default, valid values, one help line), checked by one generic
checker (`ValidValues`, which the command line's flag declarations share)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field

SITES = ("encoder", "decoder", "cross")


def did_you_mean(value, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``value``, or "" when none is close: the hint of
    every "not a valid name" error line (config fields, presets, figures, commands)."""
    close = difflib.get_close_matches(str(value), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class HfAttnConfigError(ValueError):
    """Bad hf-attn configuration: the message names the value, the valid choices and the fix."""


@dataclass(frozen=True)
class Preset:
    """A named configuration: config overrides (variant per site, layer subsets, hyperparameters) + provenance."""

    name: str
    description: str
    paper: str  # str() of `citations.CITATIONS` entries: "Authors Year, Title (Venue)" (a baseline: "; as compared in")
    overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "paper", str(self.paper))  # a `Citation` as its one-line form


@dataclass(frozen=True, kw_only=True)
class ValidValues:
    """The valid values of a declared value, and the words for them: the one range check and the one "valid values"
    wording, shared by `Hyperparameter` (config fields) and the command-line flag declarations
    (`hf_attn.training.validate.Flag`). A subclass declares ``name`` and ``type`` (positional, first); the fields
    below are keyword-only and follow them.

    ``type`` is int, float, bool, str (with ``choices``), ``list[int]`` or ``list[float]`` (non-empty lists; the
    range applies to each element). ``low``/``high`` bound numbers (``*_open``: the bound itself is excluded);
    floats must be finite. ``nullable``: None is valid too. ``also``: (value, meaning) pairs valid besides the range,
    e.g. ``((-1, "with --num_train_epochs or --minutes"),)``.
    """

    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    also: tuple = ()

    @property
    def element_type(self) -> type:
        """int / float for ``list[int]`` / ``list[float]``, else ``type`` itself."""
        return getattr(self.type, "__args__", (self.type,))[0]

    @property
    def is_list(self) -> bool:
        return getattr(self.type, "__origin__", None) is list

    def accepts(self, value) -> bool:
        """Whether ``value`` is valid (None only when ``nullable``)."""
        if value is None:
            return self.nullable
        return self._valid(value)

    def _valid(self, value) -> bool:
        if any(value == v and not isinstance(value, bool) for v, _ in self.also):
            return True
        if self.choices is not None:
            return isinstance(value, self.type) and value in self.choices
        if self.type is bool:
            return isinstance(value, bool)
        if self.is_list:
            return isinstance(value, (list, tuple)) and len(value) > 0 and all(self._valid_number(x) for x in value)
        return self._valid_number(value)

    def _valid_number(self, x) -> bool:
        kind = self.element_type
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        if kind is int and not (isinstance(x, int) or (math.isfinite(x) and x == int(x))):
            return False
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return self.high is None or (x < self.high if self.high_open else x <= self.high)

    def valid_values(self) -> str:
        """What is valid, e.g. ``an integer >= 1``, ``in (0, 0.01]``, ``one of ['gate', 'dot']``."""
        if self.choices is not None:
            text = f"one of {list(self.choices)}"
        elif self.type is bool:
            text = "true or false"
        else:
            noun = "an integer" if self.element_type is int else "a finite number"
            if self.low is not None and self.high is not None:
                lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
                bound = f"in {lo}{_bound(self.low)}, {_bound(self.high)}{hi}"
                text = bound if self.element_type is float else f"{noun} {bound}"
            elif self.low is not None:
                text = f"{noun} {'>' if self.low_open else '>='} {_bound(self.low)}"
            elif self.high is not None:
                text = f"{noun} {'<' if self.high_open else '<='} {_bound(self.high)}"
            else:
                text = noun
            if self.is_list:
                plural = text.replace("an integer", "integers").replace("a finite number", "finite numbers")
                text = f"a non-empty list of {plural if plural != text else 'numbers ' + text}"
        text += "".join(f", or {_bound(v)} ({meaning})" for v, meaning in self.also)
        return f"{text} or None" if self.nullable else text

    def requirement(self) -> str:
        """The verb phrase of an error line: ``must be <valid values>``, or for choices ``is not valid; choose ...``."""
        if self.choices is not None:
            return f"is not valid; choose one of {list(self.choices)}" + (" or None" if self.nullable else "")
        return f"must be {self.valid_values()}"

    def type_name(self) -> str:
        name = f"list[{self.element_type.__name__}]" if self.is_list else self.type.__name__
        return f"{name} | None" if self.nullable else name


@dataclass(frozen=True)
class Hyperparameter(ValidValues):
    """One variant hyperparameter: a flat config field with a type, the default, its valid values (`ValidValues`)
    and a help line.

    ``nullable``: None is valid too (its meaning is in ``help``). ``help`` is one line and cites the paper (or the
    code) the default comes from. ``symbol``: the paper's symbol for it and where it appears (``"epsilon in
    RMS(z), Eq. 4"``), or "" where the paper has none (an implementation choice); docs/api.md lists it.
    """

    name: str
    type: object
    default: object
    help: str
    symbol: str = ""

    def __post_init__(self):
        if isinstance(self.default, list):  # stored as a tuple: the declaration is frozen and hashable
            object.__setattr__(self, "default", tuple(self.default))
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))

    def initial(self):
        """The default as a config value (a fresh list for list types)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def normalise(self, value):
        """A valid ``value`` in the declared type (2.0 -> 2 for int, 1 -> 1.0 for float, tuple -> list: e.g. values
        read back from JSON); an invalid one is returned unchanged, for `check` to name it as given."""
        if value is None or not self._valid(value):
            return value
        if self.is_list:
            return [_as_number(x, self.element_type) for x in value]
        return _as_number(value, self.type) if self.type in (int, float) else value

    def check(self, value) -> None:
        """Raise `HfAttnConfigError` (one line: field, value, what is valid, the default and its source)."""
        if not self.accepts(value):
            raise HfAttnConfigError(
                f"{self.name}={value!r} {self.requirement()} (default {self.initial()!r}: {self.help})"
            )


def _bound(x) -> str:
    """A bound or special value in words: an int exactly (4294967295), a float in short form (0.01, 1e-06)."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _as_number(value, kind: type):
    """``value`` as ``kind`` (int / float) when that is exact, else unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if kind is float:
        return float(value)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def all_sites(variant: str, **extra) -> dict:
    """Preset overrides putting ``variant`` at every attention site."""
    return {"encoder_attention": variant, "decoder_attention": variant, "cross_attention": variant, **extra}
