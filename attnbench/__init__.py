"""attnbench: benchmark and profile attention implementations.

The plugin API, from one import::

    from attnbench import register, Unsupported, Case, Mask, LayerModule, read_results
"""

from attnbench.case import Case
from attnbench.errors import AttnbenchError, UsageError
from attnbench.masks import Mask
from attnbench.registry import Unsupported, register
from attnbench.run.layer_module import LayerModule
from attnbench.store.results import read_results

__all__ = [
    "AttnbenchError",
    "Case",
    "LayerModule",
    "Mask",
    "Unsupported",
    "UsageError",
    "read_results",
    "register",
]
