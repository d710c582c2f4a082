"""A package's public names, loaded on first use (PEP 562), so that importing the package (and parsing a command's
flags) does not import torch, transformers or datasets before a name that needs them is used."""

from __future__ import annotations

import importlib


def lazy_names(package: str, exports: dict[str, str], namespace: dict):
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to the module that defines it,
    relative to the package (``".modeling"``); a name, once loaded, is kept in the package's ``namespace``."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value  # the next access skips this function
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
