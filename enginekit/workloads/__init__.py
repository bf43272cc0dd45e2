"""Seeded request generators (``make_workload``) and the ideal prefix-cache yardstick."""

from enginekit.workloads.generators import WORKLOADS, make_workload
from enginekit.workloads.ideal import ideal_prefix_hit_tokens
from enginekit.workloads.request import WorkloadRequest

__all__ = ["WORKLOADS", "WorkloadRequest", "ideal_prefix_hit_tokens", "make_workload"]
