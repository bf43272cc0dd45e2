"""Seeded request generators (``make_workload``), ShareGPT and trace replay
(``open_workload``, streamed), and the ideal prefix-cache yardstick."""

from enginekit.workloads.generators import WORKLOADS, make_workload
from enginekit.workloads.ideal import ideal_prefix_hit_tokens
from enginekit.workloads.request import WorkloadRequest
from enginekit.workloads.sources import open_workload
from enginekit.workloads.traffic import TRAFFIC_WORKLOADS, TrafficRequest, Workload

# Every workload.name: the generated ones (WORKLOADS, make_workload's) and those read
# from data (ShareGPT, trace files), which open_workload alone makes.
ALL_WORKLOADS: tuple[str, ...] = (*WORKLOADS, *TRAFFIC_WORKLOADS)

__all__ = [
    "ALL_WORKLOADS",
    "WORKLOADS",
    "TrafficRequest",
    "Workload",
    "WorkloadRequest",
    "ideal_prefix_hit_tokens",
    "make_workload",
    "open_workload",
]
