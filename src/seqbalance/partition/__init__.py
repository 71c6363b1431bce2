"""Multiway number partitioning: split non-negative weights into ``k`` parts with a light maximum.

Pure algorithms on weight arrays (numpy only); knows nothing about models or torch. The module
object is callable, so ``seqbalance.partition(weights, k)`` is ``partition(weights, k)``::

    import seqbalance as sb
    result = sb.partition(weights, 8, equal_size=True)
    result.parts, result.loads, result.lower_bound, result.ratio, result.method
    sb.partition.lower_bound(weights, 8)
"""

from __future__ import annotations

import sys
import types
from typing import Any

from seqbalance.partition._api import METHODS, partition
from seqbalance.partition._result import PartitionResult, SizeLimits
from seqbalance.partition.bounds import lower_bound

__all__ = ["METHODS", "PartitionResult", "SizeLimits", "lower_bound", "partition"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> PartitionResult:
        return partition(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
