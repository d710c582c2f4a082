"""``import hf_attn`` registers hf-attn's model types with transformers' Auto classes without importing torch or
transformers itself: when transformers is already imported, it registers at once; otherwise an import hook on
``sys.meta_path`` registers right after the first ``import transformers`` (so ``import hf_attn`` followed by
``AutoModelForSeq2SeqLM.from_pretrained(hf_attn_dir)`` works as before, and the ``hf-attn`` command only pays for
torch and transformers where a command uses them). The registration itself is `modeling.bases.register_auto_classes`,
run when ``hf_attn.modeling`` is imported."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings


def _register() -> None:
    if "hf_attn.modeling" in sys.modules:
        return  # imported (or being imported, which is how transformers got loaded): it registers at its end
    try:
        importlib.import_module("hf_attn.modeling")
    except Exception as e:  # noqa: BLE001 - a broken install must not break `import transformers` for everyone
        warnings.warn(f"hf-attn could not register its model types with transformers' Auto classes: {e}", stacklevel=2)


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """Finds ``transformers`` once (with the other finders), and registers hf-attn's classes after it is loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        _uninstall()
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            load = loader.exec_module

            def exec_module(module):
                load(module)
                _register()

            loader.exec_module = exec_module  # this spec's own loader object: only this import is affected
        return spec


def _uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTransformers)]


def when_transformers_loads() -> None:
    """Register now if transformers is imported, else right after it is."""
    if "transformers" in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterTransformers) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformers())
