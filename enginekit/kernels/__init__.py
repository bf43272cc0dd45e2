"""Paged-KV operations: pure-torch references (``reference``), Triton kernels
(``triton_ops``, imported only where Triton is used) and the pool layout (``layout``)."""
