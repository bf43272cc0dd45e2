"""Sizes and costs every layer may use: model shapes, the KV cache's bytes (KVSpec,
KVQuant), hardware figures and the cost of restoring a preempted sequence. Plain values."""
