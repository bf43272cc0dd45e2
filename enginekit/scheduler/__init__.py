"""Continuous batching: admission, chunked prefill, decode, preemption, forks and beams."""
