"""The report's sections for packed documents and sparse patterns (masks document,
block_sparse, strided), rendered from the analysis (analyse/patterns.py): wasted work per impl,
and which impls exploit sparsity."""

from __future__ import annotations

from attnbench.report.analyse.patterns import TOL
from attnbench.report.render.markdown import MISSING, fold_long, table


def sections(a, level: str = "##") -> list[str]:
    """The two sections of a DeviceAnalysis (its wasted work and sparsity fits, with the
    series labels in ``series``), or nothing when it has no ok row of a pattern mask."""
    waste, fits = a.waste, a.sparsity
    if waste.empty:
        return []
    lines = [
        f"{level}# Wasted work (packed documents, sparse patterns)",
        "",
        "Useful GFLOP counts the kept (query, key) pairs only (`flops`); work GFLOP the pairs "
        "each impl's computation covers, masked entries and padding included (`work_flops`, "
        "declared by the impl: the whole score matrix for naive and SDPA with a mask, the "
        "visited tiles for tiled and flex, one matrix per document for sdpa_nested, one "
        "padded matrix per document for sdpa_padded; docs/method.md). useful % = flops / "
        f"work_flops; {MISSING} where an impl declares no work.",
        "",
        *fold_long(
            "Useful and work GFLOP per case and impl",
            [
                table(
                    waste.assign(flops=waste["flops"] / 1e9, work_flops=waste["work_flops"] / 1e9),
                    {
                        "case": "case",
                        "impl": "impl",
                        "flops": "useful GFLOP",
                        "work_flops": "work GFLOP",
                        "useful_pct": "useful %",
                        "time_ms": "time ms",
                        "agrees": "agrees",
                    },
                    formats={"useful_pct": ".1f"},
                )
            ],
            len(waste),
        ),
    ]
    lines += [
        f"{level}# Sparsity: time against N and against kept pairs",
        "",
        "Per series (N varies): the exponent of the time in N (least squares on log-log, the "
        "scaling exponents' overhead cut), and over the same points the exponent of the kept "
        "pairs in N (a) and of the time in the kept pairs (b). An impl that skips the masked "
        f"work has b near 1; one that computes every pair and masks, b near 2/a (within "
        f"{TOL:g}); anything else, or a series where 1 and 2/a lie within {2 * TOL:g} of each "
        "other, is cannot tell.",
        "",
        *fold_long(
            "The fits per series",
            [
                table(
                    fits,
                    {
                        "impl": "impl",
                        "series": "series (N varies)",
                        "pairs_exp": "kept pairs ∝ N^",
                        "time_vs_n": "time ∝ N^",
                        "time_vs_pairs": "time ∝ pairs^",
                        "n_points": "points",
                        "verdict": "verdict",
                    },
                    formats={"pairs_exp": ".2f", "time_vs_n": ".2f", "time_vs_pairs": ".2f"},
                )
            ],
            len(fits),
        ),
    ]
    return lines
