"""attnbench: benchmark and profile attention implementations.

The plugin API, from one import::

    from attnbench import register, Unsupported, Case, Mask, LayerModule, read_results
    from attnbench import Takes, Supports, Runs  # what register declares, grouped
    from attnbench import ModuleLayout, QKNorm  # a hosted module's layout (level layer)
"""

from attnbench.case import Case
from attnbench.declarations import Runs, Supports, Takes
from attnbench.errors import AttnbenchError, UsageError
from attnbench.masks import Mask
from attnbench.module_layout import LayerModule, ModuleLayout, QKNorm
from attnbench.registry import Unsupported, register
from attnbench.store.results import read_results

__all__ = [
    "AttnbenchError",
    "Case",
    "LayerModule",
    "Mask",
    "ModuleLayout",
    "QKNorm",
    "Runs",
    "Supports",
    "Takes",
    "Unsupported",
    "UsageError",
    "read_results",
    "register",
]
