"""Seeded request generators (``make_workload``) and the ideal prefix-cache yardstick."""

from enginekit.workloads.generators import WORKLOADS, WorkloadRequest, make_workload
from enginekit.workloads.ideal import ideal_prefix_hit_tokens

__all__ = ["WORKLOADS", "WorkloadRequest", "ideal_prefix_hit_tokens", "make_workload"]
