"""Shared fixtures: tiny Marian/BART configs and batches (offline, CPU, seconds)."""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the fused Triton kernels run on CPU tensors under Triton's interpreter (read when triton is first imported, so
# before hf_attn): every kernel is checked without a GPU (tests named *triton*). HF_ATTN_TEST_DEVICE=cuda runs the
# kernel tests on the GPU instead (fixture `test_device`), compiled: the interpreter stays off
TEST_DEVICE = os.environ.get("HF_ATTN_TEST_DEVICE", "cpu")
os.environ.setdefault("TRITON_INTERPRET", "0" if TEST_DEVICE.startswith("cuda") else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from hf_attn.modeling import BASES  # noqa: E402
from hf_attn.modeling.fused import triton_available  # noqa: E402

# `@requires_triton` (or ``pytestmark = requires_triton``): a test of the fused Triton kernels, skipped where triton
# is not installed (the kernels' test modules import triton only through hf_attn.modeling, which guards it)
requires_triton = pytest.mark.requires_triton


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_triton: needs the triton package (skipped without it)")


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernel tests on the CPU here, or None. triton 3.6 (torch 2.11's) converts
    one-element arrays with ``int()``, an error since numpy 2.4 (2.3 warns); triton 3.7 squeezes them first."""
    if TEST_DEVICE.startswith("cuda") or not triton_available():
        return None
    import numpy
    import triton

    from hf_attn.modeling.compat import version_tuple

    if version_tuple(triton.__version__) < (3, 7) and version_tuple(numpy.__version__) >= (2, 4):
        return (f"triton {triton.__version__}'s interpreter cannot run with numpy {numpy.__version__} (int() of a "
                "one-element array): pip install 'numpy<2.4' or 'triton>=3.7' to run the kernel tests on the CPU")
    return None


def pytest_collection_finish(session):
    """Every test module is imported: the objects that exist now (torch's, transformers', the tests') live to the end,
    so they are frozen out of the garbage collector's full collections (`gc.freeze`). Training calls gc.collect()
    (accelerate's free_memory at the end of Trainer.train): without the freeze each walked all of them again, about
    0.8 s a collection in a worker, a minute of a worker's time over tests/reproduce, training and cli."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session, exitstatus):
    slowest_test.pytest_sessionfinish(session, exitstatus)  # the bound on the slowest test (below)
    gc.unfreeze()  # the interpreter's last collection sees every object again (frozen ones: reported as leaks)


def pytest_collection_modifyitems(config, items):
    problem = interpreter_problem()
    if triton_available() and problem is None:
        return
    skip = pytest.mark.skip(reason=problem or "triton is not installed (pip install triton, Linux)")
    for item in items:
        if item.get_closest_marker("requires_triton"):
            item.add_marker(skip)


@pytest.fixture
def test_device() -> torch.device:
    """The device kernel tests put their tensors on: HF_ATTN_TEST_DEVICE (default cpu, where the kernels run under
    Triton's interpreter; cuda on a GPU machine: scripts/gpu_lease.sh)."""
    if TEST_DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.fail(f"HF_ATTN_TEST_DEVICE={TEST_DEVICE} but torch sees no CUDA device; unset it to test on the CPU")
    return torch.device(TEST_DEVICE)


if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2`: two workers share the cores, one torch thread each
    torch.set_num_threads(1)
    # and so do the Python processes the tests start (a second OpenMP thread on a core the other worker holds waits
    # for it at every operator: tiny models ran several times slower); a test that sets its own count keeps it
    os.environ.setdefault("OMP_NUM_THREADS", "1")

VOCAB = 64
PAD, EOS, BOS = 1, 2, 0

TINY = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=PAD,
    eos_token_id=EOS,
    forced_eos_token_id=EOS,
    dropout=0.0,
    attention_dropout=0.0,
)
BASE_DEFAULTS = {
    "marian": dict(decoder_start_token_id=PAD),
    "bart": dict(bos_token_id=BOS, decoder_start_token_id=EOS, forced_bos_token_id=None),
}


def tiny_config(base: str, preset: str = "softmax", **overrides):
    return BASES[base].config_class.from_preset(preset, **{**TINY, **BASE_DEFAULTS[base], **overrides})


def tiny_model(base: str, preset: str = "softmax", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return BASES[base].model_class(tiny_config(base, preset, **overrides)).eval()


_BUILT: dict = {}


def cached_tiny_model(base: str, preset: str = "softmax", seed: int = 0, **overrides):
    """`tiny_model`, built once per session for each set of arguments and handed out as a deep copy (a third of a
    build's time), with torch's random state set as that build left it: the model and every random draw after it are
    a fresh build's. Only for tests that patch nothing a build reads (environment, classes): they call `tiny_model`."""
    key = (base, preset, seed, repr(sorted(overrides.items())))
    if key not in _BUILT:
        model = tiny_model(base, preset, seed, **overrides)
        _BUILT[key] = (model, torch.get_rng_state())
    model, rng = _BUILT[key]
    torch.set_rng_state(rng)
    return copy.deepcopy(model)


def vanilla_model(base: str, seed: int = 0):
    """The stock transformers model (MarianMTModel / BartForConditionalGeneration) of the tiny configs' architecture."""
    torch.manual_seed(seed)
    b = BASES[base]
    return b.stock_model_class(b.stock_config_class(**TINY, **BASE_DEFAULTS[base])).eval()


def tiny_batch(batch: int = 3, src_len: int = 9, tgt_len: int = 7, seed: int = 1):
    """Right-padded source/target ids with EOS, lengths varying (one source of a single token + EOS)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (batch, src_len), generator=g)
    tgt = torch.randint(3, VOCAB, (batch, tgt_len), generator=g)
    src_lens = [src_len, max(2, src_len - 3), 2][:batch] + [src_len] * max(0, batch - 3)
    tgt_lens = [tgt_len, max(2, tgt_len - 2), 3][:batch] + [tgt_len] * max(0, batch - 3)
    mask = torch.zeros_like(src)
    for i, n in enumerate(src_lens):
        src[i, n - 1] = EOS
        src[i, n:] = PAD
        mask[i, :n] = 1
    labels = tgt.clone()
    for i, n in enumerate(tgt_lens):
        labels[i, n - 1] = EOS
        labels[i, n:] = -100
    return {"input_ids": src, "attention_mask": mask, "labels": labels}


def attention_context(output_attentions: bool = False, **fields):
    """An `AttentionContext` for calling a module's ``attend`` directly (no cache, no forward state)."""
    from hf_attn.modeling.forward_state import AttentionContext

    defaults = dict(hidden_states=None, key_value_states=None, past=0, cache=None, state=None)
    return AttentionContext(output_attentions=output_attentions, **{**defaults, **fields})


def load_script(name: str):
    """``scripts/<name>.py`` imported as a module (the scripts are not a package), once per call."""
    spec = importlib.util.spec_from_file_location(f"hf_attn_script_{name}", Path(__file__).resolve().parents[1]
                                                  / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def kept_threads():
    """torch's thread count as it was before the block, restored after it (the scripts' mains set their own)."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_script(module, argv):
    """``module.main(argv)`` of a script loaded by `load_script`, in this process (no import per run); the thread
    count it sets is restored afterwards."""
    with kept_threads():
        return module.main(argv)



@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A tokenizer cache shared by the tests of a session (an xdist worker); its entries are keyed by their data."""
    return tmp_path_factory.mktemp("tokcache")


@pytest.fixture(scope="session")
def trained(tmp_path_factory, cache):
    """A tiny rela-g run directory (6 steps on 200 Bible verses), trained once per session (an xdist worker) for
    every module that reads it: a test that changes a run directory works on a copy."""
    from training_helpers import train_tiny

    return train_tiny(tmp_path_factory.mktemp("run") / "rela-g", cache_dir=cache)


@pytest.fixture
def batch():
    return tiny_batch()


@pytest.fixture
def one_thread():
    """torch on one thread for the test (restored afterwards): training-sized tests are faster and steadier."""
    with kept_threads():
        torch.set_num_threads(1)
        yield


# no test may take longer than the bound the README states (tests/slowest_test.py): a run where one does fails
import slowest_test  # noqa: E402  (its session-finish hook: pytest_sessionfinish above)
from slowest_test import pytest_runtest_logreport, pytest_terminal_summary  # noqa: E402, F401
