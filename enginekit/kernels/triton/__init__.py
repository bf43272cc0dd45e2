"""Triton kernels for paged attention and cache writes (imported only where Triton runs)."""
