"""Paged-KV operations: pure-torch references (``reference``), Triton kernels
(``triton/``, imported only where Triton is used), the pool layout (``layout``) and
the arithmetic of the quantized storage formats (``quantize``)."""
