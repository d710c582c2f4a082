"""The transformers releases this model code runs on, and the one place that tells them apart.

A model shared on the Hub runs this code on the transformers of whoever loads it. `configuration_hf_attn` and
`modeling_hf_attn` import this module before any sibling, so on a release below `MIN_TRANSFORMERS` (4.x included) the
load stops here, at once, with one line naming the need, the version found and the fix, instead of an ImportError from
deep inside the code. The saved config carries the floor (``min_transformers_version``), and so does the model card.

Below the floor: transformers 4.x has no ``transformers.initialization`` and builds attention masks differently
(``masking_utils`` without ``bidirectional_mask_function``), and the 4 -> 5 API break (the cache and attention
interfaces) reaches every layer; docs/python.md ("Which transformers") has the table of the releases tested.
"""

from __future__ import annotations

import re

import transformers

MIN_TRANSFORMERS = "5.0.0"


def version_tuple(version: str) -> tuple[int, int, int]:
    """The numeric (major, minor, patch) of a version string: ``"5.2.0"`` -> (5, 2, 0), ``"5.3.0.dev0"`` -> (5, 3, 0)."""
    parts = [int(m.group()) if (m := re.match(r"\d+", piece)) else 0 for piece in version.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


TRANSFORMERS_VERSION = version_tuple(transformers.__version__)


class TransformersVersionError(ImportError):
    """The installed transformers is older than the model code's floor; the message is one line with the fix."""


def check_transformers(found: str = transformers.__version__) -> None:
    """One `TransformersVersionError` line when ``found`` is below `MIN_TRANSFORMERS`."""
    if version_tuple(found) < version_tuple(MIN_TRANSFORMERS):
        raise TransformersVersionError(
            f"this hf-attn model needs transformers >= {MIN_TRANSFORMERS}, but transformers {found} is installed: "
            f'pip install -U "transformers>={MIN_TRANSFORMERS}"'
        )


check_transformers()
