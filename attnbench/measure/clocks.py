"""SM clock, power and temperature sampled (NVML, nvidia-ml-py) while a row is timed, so a
throttling GPU is seen in the row that it slowed down."""

from __future__ import annotations

import functools
import statistics
import threading

import torch

from attnbench.store.env import GPU_STATE_FIELDS

SAMPLE_S = 0.01
# clock-event reasons that mean "slowed down", by NVML bit (idle and user-set clocks excluded)
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


@functools.cache
def _nvml_handle(device: str):
    """An NVML handle for the torch device, matched by PCI bus id; raises if NVML is absent.
    Made once per process and device (NVML's set-up is not repeated for every row)."""
    import pynvml

    pynvml.nvmlInit()
    props = torch.cuda.get_device_properties(torch.device(device))
    bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001 - no NVML: the field stays blank
        return None


def gpu_state(device: str) -> dict:
    """The GPU's clocks, power and temperature now, with its clock and power limits (NVML),
    for env.json; every field blank without NVML."""
    state = dict.fromkeys(GPU_STATE_FIELDS)
    try:
        nv, h = _nvml_handle(device)
        reads = {
            "gpu_sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "gpu_sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "gpu_mem_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
            "gpu_power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1e3,
            "gpu_power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            "gpu_temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        }
    except Exception:  # noqa: BLE001 - no NVML: the fields stay blank
        return state
    for key, read in reads.items():
        try:
            state[key] = read()
        except Exception:  # noqa: BLE001 - a read this GPU does not support stays blank
            pass
    return state


class ClockSampler:
    """``with ClockSampler(device) as s: ...`` then ``s.summary()``: medians over the block,
    and the throttle reasons seen. On a CPU, or without NVML, the summary is all blank."""

    def __init__(self, device: str):
        self.samples: list[tuple[float, float, float, int]] = []
        self._stop = threading.Event()
        self._thread = None
        self.error = None
        if not device.startswith("cuda"):
            return
        try:
            self._nvml, self._handle = _nvml_handle(device)
        except Exception as exc:  # noqa: BLE001
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"

    def _read(self) -> tuple[float, float, float, int]:
        nv, h = self._nvml, self._handle
        reasons = getattr(
            nv,
            "nvmlDeviceGetCurrentClocksEventReasons",
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        )
        return (
            nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            nv.nvmlDeviceGetPowerUsage(h) / 1e3,
            nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            reasons(h) if reasons else 0,
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except Exception as exc:  # noqa: BLE001
                self.error = f"NVML read failed: {exc}"
                return
            self._stop.wait(SAMPLE_S)

    def __enter__(self):
        if hasattr(self, "_handle"):
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()

    def summary(self) -> dict:
        return summarize(self.samples)


def summarize(samples: list[tuple[float, float, float, int]]) -> dict:
    """Medians of NVML readings (a ClockSampler's, or several's together), and the throttle
    reasons seen; all blank without readings (a CPU, or no NVML)."""
    if not samples:
        return {"sm_clock_mhz": None, "power_w": None, "temp_c": None, "throttle": None}
    clock, power, temp, bits = zip(*samples)
    seen = 0
    for b in bits:
        seen |= b
    names = [name for bit, name in THROTTLE_BITS.items() if seen & bit]
    return {
        "sm_clock_mhz": statistics.median(clock),
        "power_w": statistics.median(power),
        "temp_c": statistics.median(temp),
        "throttle": ",".join(names) or "none",
    }
