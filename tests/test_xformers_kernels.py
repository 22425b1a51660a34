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


IMAGE_RECORD = {"cuda": 1208, "hip": None, "torch": "2.10.0+cu128", "python": "3.10.19"}


@pytest.mark.parametrize(
    "record,torch_version,cuda,refused",
    [
        (IMAGE_RECORD, "2.11.0+cu130", "13.0", True),  # the GPU image: xformers 0.0.35
        (IMAGE_RECORD, "2.11.0+cu128", "12.8", True),  # another torch minor: another ABI
        (IMAGE_RECORD, "2.10.0+cu130", "13.0", True),  # another CUDA major: no cudart 12
        (IMAGE_RECORD, "2.13.0+cpu", None, True),  # a CPU torch: no CUDA at all
        (IMAGE_RECORD, "2.10.1+cu126", "12.6", False),  # the same minor and CUDA major
        ({**IMAGE_RECORD, "cuda": None, "hip": 60200}, "2.11.0", None, False),  # ROCm build
        (None, "2.11.0+cu130", "13.0", False),  # not installed, or no record
    ],
)
def test_build_mismatch_reads_xformers_own_build_record(
    monkeypatch, record, torch_version, cuda, refused
):
    monkeypatch.setattr(xk, "_build_record", lambda: record)
    monkeypatch.setattr(xk.torch, "__version__", torch_version)
    monkeypatch.setattr(xk.torch.version, "cuda", cuda)
    monkeypatch.setattr(xk.importlib.metadata, "version", lambda name: "0.0.35")
    why = xk.build_mismatch()
    assert (why is not None) == refused, why
    if refused and torch_version == "2.11.0+cu130":
        assert why.startswith(
            "xformers 0.0.35's CUDA kernels were built for torch 2.10.0+cu128; this torch is "
            "2.11.0+cu130: xformers refuses every operator"
        )
        assert "built for torch 2.11: pip install" in why and "\n" not in why


def test_the_build_record_is_read_from_the_package_folder_without_importing_it(
    tmp_path, monkeypatch
):
    folder = tmp_path / "xformers"
    folder.mkdir()
    (folder / "cpp_lib.json").write_text('{"version": {"cuda": 1208, "torch": "2.10.0+cu128"}}')
    spec = types.SimpleNamespace(submodule_search_locations=[str(folder)])
    monkeypatch.setattr(xk.importlib.util, "find_spec", lambda name: spec)
    assert xk._build_record() == {"cuda": 1208, "torch": "2.10.0+cu128"}
    (folder / "cpp_lib.json").write_text("{not json")
    assert xk._build_record() is None  # a record we cannot read decides nothing
    monkeypatch.setattr(xk.importlib.util, "find_spec", lambda name: None)
    assert xk._build_record() is None


def test_xformers_is_unavailable_before_any_call_where_its_build_record_says_so(impls):
    why = xk.build_mismatch()
    if why is None:
        pytest.skip("xformers is not installed here, or was built for this torch")
    assert impls["xformers"].unavailable == why  # said by attnbench list, every row's reason
