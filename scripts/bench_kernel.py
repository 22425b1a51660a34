"""Race triton_flash against SDPA's backends and xFormers on a CUDA GPU (see
attnbench/kernel_bench.py). Exits 2, writing nothing, where there is no CUDA GPU.

    python scripts/bench_kernel.py [--quick] [--seq-lens 1024,4096] [--head-dims 64,128]
                                   [--modes fwd,bwd] [--out results/kernel_bench/x.csv]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnbench.kernel_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
