"""The kernel lab's rows: each one JSON line in ``OUT/kernel_lab.jsonl`` as soon as it is known
(written from the watchdog's thread too), and at the end the Markdown table with each row's
ratio to the fastest control of its case (benchmarks/kernel_lab.py)."""

from __future__ import annotations

import json
import threading
import time
import uuid

_COLUMNS = ("case", "kind", "variant", "status", "time_ms", "tflops", "x_best_control", "sm_mhz",
            "regs", "spill_bytes", "smem", "warps", "reason")  # fmt: skip


class Lab:
    def __init__(self, args):
        self.args, self.t0 = args, time.monotonic()
        self.call = uuid.uuid4().hex[:8]  # rows compare only within one call
        self.rows: list[dict] = []
        self.lock = threading.RLock()  # the watchdog writes from its own thread, holding it
        args.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = (args.out / "kernel_lab.jsonl").open("a")

    def left_s(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def write(self, row: dict) -> None:
        with self.lock:
            row = {"call": self.call, **row}
            self.rows.append(row)
            self.jsonl.write(json.dumps(row, default=str) + "\n")
            self.jsonl.flush()
            shown = ("case", "variant", "status", "time_ms", "reason")
            print(" ".join(f"{k}={row[k]}" for k in shown if row.get(k) is not None), flush=True)

    def finish(self, device_name: str, controls: list[str]) -> None:
        """x_best_control filled in, the table to OUT/kernel_lab.md and stdout."""
        _ratios(self.rows, controls)
        lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
        for r in self.rows:
            cells = []
            for c in _COLUMNS:
                v = r.get(c)
                cells.append("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
            lines.append("| " + " | ".join(cells) + " |")
        text = f"# Kernel lab: {device_name}, call {self.call}\n\n" + "\n".join(lines) + "\n"
        (self.args.out / "kernel_lab.md").write_text(text)
        print(text, flush=True)


def _ratios(rows: list[dict], controls: list[str]) -> None:
    """x_best_control: the fastest control's time over the row's, per (case, kind); > 1:
    faster than every control."""
    for key in {(r["case"], r["kind"]) for r in rows}:
        mine = [r for r in rows if (r["case"], r["kind"]) == key]
        best = [r["time_ms"] for r in mine if r["variant"] in controls and r.get("time_ms")]
        for r in mine:
            if r.get("time_ms") and best:
                r["x_best_control"] = min(best) / r["time_ms"]
