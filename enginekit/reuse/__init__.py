"""What a run's traffic could reuse: the ideal prefix hits, why each missed prompt token
missed (``ReuseTracker``, in ``enginekit.reuse.tracker``), and the hit rate the same
traffic would get at every cache size (``enginekit.reuse.curve``), the most any eviction
policy could get (Belady's OPT, ``enginekit.reuse.opt``) and a pool simulated block by
block to check both (``enginekit.reuse.simulate``)."""

from enginekit.reuse.curve import (
    NUM_CURVE_POINTS,
    AccessStream,
    HitRateCurve,
    min_pool_sizes,
    stack_distances,
    tiered_pool_blocks,
)
from enginekit.reuse.tracker import MissCounts, ReuseTracker

__all__ = [
    "NUM_CURVE_POINTS",
    "AccessStream",
    "HitRateCurve",
    "MissCounts",
    "ReuseTracker",
    "min_pool_sizes",
    "stack_distances",
    "tiered_pool_blocks",
]
