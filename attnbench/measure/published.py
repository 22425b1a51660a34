"""Published peak rates of known GPUs, from their makers' datasheets: a ceiling that stays put
from run to run on one device, where the measured ceilings (measure/ceilings.py) move a few
percent with clocks and power (an H100 SXM measured 693–743 TFLOP/s of bf16 matmul over five
runs within ten minutes). Dense tensor-core rates (no sparsity), TFLOP/s; memory bandwidth,
GB/s. Matched by a substring of the device name torch reports."""

from __future__ import annotations

from typing import NamedTuple


class Peak(NamedTuple):
    source: str  # whose datasheet, for which form factor
    matmul_tflops: dict  # dtype -> dense rate, TFLOP/s
    memory_gb_s: float  # memory bandwidth, GB/s


_HOPPER_SXM = {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}  # float32: TF32
PEAKS = {
    "H100 80GB HBM3": Peak("NVIDIA H100 datasheet, SXM5", _HOPPER_SXM, 3350.0),
    "H200": Peak("NVIDIA H200 datasheet, SXM", _HOPPER_SXM, 4800.0),
}


def published(device_name: str | None) -> Peak | None:
    """The published peaks of the device whose torch name contains a key of PEAKS."""
    return next((p for key, p in PEAKS.items() if key in str(device_name or "")), None)
