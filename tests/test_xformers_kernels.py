"""Whose kernels xformers ran: operator names to backend labels, the dispatch recording, the
row note (measure/backends.py), and env.json's record (attnbench/impls/xformers_kernels.py)."""

import types

import pytest

from attnbench.impls import xformers_kernels as xk
from attnbench.measure.backends import borrowed_note


@pytest.mark.parametrize(
    "name,label",
    [
        ("fa2F@2.8.3-pt", "pytorch:flash"),  # PyTorch's flash kernel, called by xformers
        ("fa2B@2.8.3-pt", "pytorch:flash"),
        ("cutlassF-pt", "pytorch:efficient"),  # aten::_efficient_attention_forward
        ("cutlassB-pt", "pytorch:efficient"),
        ("fa3F@0.0.0", "xformers:fa3"),  # its own FlashAttention-3 build
        ("fa3B@0.0.0", "xformers:fa3"),
        ("triton_splitKF", "xformers:triton_splitk"),  # its own Triton split-K decode kernel
        ("fa2F@2.8.3", "xformers:fa2"),  # the flash-attn package, not PyTorch
    ],
)
def test_operator_names_become_backend_labels(name, label):
    assert xk.label(name) == label


def test_dispatched_records_the_operators_of_one_call_and_restores_the_dispatchers():
    def op(name):
        return type(name, (), {"NAME": name})

    fmha = types.SimpleNamespace(
        _dispatch_fw=lambda inp, needs_grad: op("fa2F@2.8.3-pt"),
        _dispatch_bw=lambda inp: op("cutlassB-pt"),
    )
    originals = (fmha._dispatch_fw, fmha._dispatch_bw)

    def run():  # forward and backward, as a bwd row's call does
        fmha._dispatch_fw(None, True)
        fmha._dispatch_bw(None)

    assert xk.dispatched(run, fmha) == "pytorch:efficient+pytorch:flash"
    assert (fmha._dispatch_fw, fmha._dispatch_bw) == originals
    assert xk.dispatched(lambda: None, fmha) is None  # nothing dispatched: no label


def test_borrowed_note_says_the_row_measured_pytorch():
    note = borrowed_note("xformers", "pytorch:flash")
    assert "ran PyTorch's own flash kernels" in note and "not an independent xformers" in note
    assert borrowed_note("xformers", "xformers:fa3F") is None
    assert borrowed_note("sdpa", "flash") is None


def test_env_record_says_whether_the_extension_loaded():
    pytest.importorskip("xformers")
    record = xk.xformers_kernels()
    assert set(record) == {
        "version",
        "extension_loaded",
        "extension_error",
        "own_ops",
        "pytorch_ops",
    }
    assert record["extension_loaded"] == (record["extension_error"] is None)
    assert all(xk.label(n).startswith("pytorch:") for n in record["pytorch_ops"])
    assert not any(xk.label(n).startswith("pytorch:") for n in record["own_ops"])


def test_quiet_keeps_xformers_log_records_off_the_terminal(capfd):
    import logging

    logger = logging.getLogger("xformers")
    handlers, propagate = list(logger.handlers), logger.propagate
    with xk.quiet() as records:
        logger.warning("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions.")
        logging.getLogger("xformers.ops").warning("a child logger's record")
    assert [r.getMessage()[:17] for r in records] == ["WARNING[XFORMERS]", "a child logger's "]
    assert capfd.readouterr().err == ""
    assert (logger.handlers, logger.propagate) == (handlers, propagate)  # put back


FAKE_CPP_LIB = """
import logging

logging.getLogger("xformers").warning("WARNING[XFORMERS]: six lines of advice")
_cpp_library_load_exception = OSError(
    "xFormers can't load C++/CUDA extensions. xFormers was built for:\\n"
    "    PyTorch 2.10.0+cu128 with CUDA 1208 (you have 2.13.0+cpu)\\n"
    "    Python  3.10.19 (you have 3.11.7)\\n"
    "  Please reinstall xformers (see https://github.com/facebookresearch/xformers)\\n"
    "  Memory-efficient attention, SwiGLU, sparse and more won't be available."
)
"""


@pytest.mark.parametrize("cuda", ["12.8", None], ids=["cuda-torch", "cpu-torch"])
def test_an_extension_that_does_not_load_is_one_line_with_the_fix(
    tmp_path, monkeypatch, capfd, cuda
):
    """xformers' own check, run on its own (a stand-in package here), its warning kept off the
    terminal and said in one line instead: with a CUDA build of torch the reinstall command;
    with a CPU build, which no xformers build would load in, that it is CUDA only."""
    import sys

    import torch

    monkeypatch.setattr(torch.version, "cuda", cuda)

    (tmp_path / "xformers").mkdir()
    (tmp_path / "xformers" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "xformers" / "_cpp_lib.py").write_text(FAKE_CPP_LIB)
    (tmp_path / "xformers-0.0.99.dist-info").mkdir()
    (tmp_path / "xformers-0.0.99.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.99\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "xformers", raising=False)
    why = xk.extension_failure.__wrapped__()  # not the cached answer of this machine
    built = (
        "(xFormers was built for: PyTorch 2.10.0+cu128 with CUDA 1208 (you have 2.13.0+cpu) "
        "Python 3.10.19 (you have 3.11.7))"
    )
    if cuda is None:
        assert why == (
            f"CUDA only: xformers has no CPU operator, and torch {torch.__version__} has no "
            f"CUDA, so xformers 0.0.99's C++/CUDA extension cannot load here {built}"
        )
        return
    assert why.startswith(
        "xformers 0.0.99 cannot load its C++/CUDA extension (xFormers was built for: PyTorch "
        "2.10.0+cu128 with CUDA 1208 (you have 2.13.0+cpu) Python 3.10.19 (you have 3.11.7)), "
        "so its calls would run PyTorch's own kernels, not its own (install an xformers built "
        "for torch "
    )
    assert why.endswith(f"{xk.INSTALL})") and "\n" not in why and "Please" not in why
    assert capfd.readouterr().err == ""
    (tmp_path / "xformers" / "_cpp_lib.py").write_text("_cpp_library_load_exception = None\n")
    assert xk.extension_failure.__wrapped__() is None  # it loads: nothing to say


def test_the_impl_is_available_wherever_xformers_imports_its_extension_or_not(impls):
    import importlib.util

    impl = impls["xformers"]
    if importlib.util.find_spec("xformers") is None:
        assert impl.unavailable.startswith("needs xformers, which is not installed")
    else:  # its dispatcher decides per call; the backend column names whose kernels ran
        assert impl.available and impl.unavailable is None


def test_a_case_no_operator_takes_is_unsupported_with_the_dispatchers_reasons(impls, capfd):
    """xformers' own dispatcher, not its extension, decides: CPU tensors, which none of its
    operators takes, give its per-operator not-supported reasons as the row's reason, on one
    line, with its extension's warning kept off the terminal."""
    pytest.importorskip("xformers")
    import torch

    from attnbench.masks import Mask
    from attnbench.registry import Unsupported

    q = torch.randn(1, 8, 2, 64)  # (B, S, H, D)
    with pytest.raises(Unsupported) as caught:
        impls["xformers"].fn(q, q, q, causal=True, scale=0.125, mask=Mask())
    why = str(caught.value)
    assert "No operator found for `memory_efficient_attention_forward`" in why, why
    assert "device=cpu (supported: {'cuda'})" in why and "\n" not in why
    assert "WARNING[XFORMERS]" not in capfd.readouterr().err
