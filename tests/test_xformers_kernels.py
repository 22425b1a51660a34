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
        ("fa3F@0.0.0", "xformers:fa3F"),  # its own FlashAttention-3 build
        ("triton_splitKF", "xformers:triton_splitKF"),
        ("fa2F@2.8.3", "xformers:fa2F"),  # the flash-attn package, not PyTorch
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
