"""One colour and marker per impl, alike in every figure of a run. matplotlib's own module
only (its palette), not pyplot: the analysis picks the run's colours, and draws nothing."""

from __future__ import annotations

import zlib

import matplotlib
import pandas as pd

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")


def impl_style(impls, colors: dict[str, str] | None = None) -> dict[str, tuple]:
    """impl -> (colour, marker): the colour an impl declared at registration (recorded in the
    run's env.json, ``colors``), else a palette colour in sorted-name order."""
    colors = colors or {}
    names = sorted(set(impls))
    palette = [tuple(c) for c in matplotlib.colormaps["tab10"].colors]
    if len(names) > len(palette):  # then husl hues (seaborn imported only here: seconds)
        import seaborn as sns

        palette += sns.color_palette("husl", len(names))
    return {  # markers follow the name alone, so they too stay put from run to run
        name: (colors.get(name) or palette[i], MARKERS[zlib.crc32(name.encode()) % len(MARKERS)])
        for i, name in enumerate(names)
    }


def run_colors(env: dict, impls=()) -> dict[str, object]:
    """Every impl's colour for all the figures of a run: the colour it declared (env.json
    ``impls``), else a palette colour picked once among the run's impls (``impls`` and those
    env.json names), so that a figure drawing fewer impls (speedups leave the baseline out)
    colours each one as the others do."""
    declared = {
        name: info["color"] for name, info in (env.get("impls") or {}).items() if info.get("color")
    }
    names = {*(env.get("impls") or {}), *(str(i) for i in impls if not pd.isna(i))}
    return {name: colour for name, (colour, _) in impl_style(names, declared).items()}
