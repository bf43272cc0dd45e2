"""Every Triton kernel against its pure-torch reference under the Triton interpreter
(TRITON_INTERPRET=1 must be set before Triton is imported, so the cases run in a child
process: see kernel_cases.py), on small shapes that cross block boundaries: every storage
kind (none, fp8, int4 with key/value groups of 4, 8 and 16), GQA ratios 1, 4 and 8,
ragged lengths, partial last blocks, prefixes ending mid-block, sliding windows with and
without attention sinks (released blocks between them: -1 or NaN-filled), in float32 to
1e-5, float16 to 2e-3, bfloat16 to 2e-2. Writes (int4 key groups re-quantized over
earlier tokens, batches in any row order, one-token decode writes; fp8 on every rounding
edge of e4m3) and block copies of every block tensor match bit for bit. Decode split
across programs matches at a 32K context, at Llama-3-8B's heads (32 query, 8 kv, head_dim
128) and with empty splits; prefill reads at most 1.1x the key tiles its query tiles need.
Then the engine end to end with kernels=triton against kernels=reference, unquantized, fp8
and int4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).resolve().parents[1] / "kernel_cases.py"
NUM_CASES = 105

NUM_PROCESSES = 2  # the interpreter is single-threaded: one process per core


def test_triton_kernels_match_references_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    shards = [
        subprocess.Popen(
            [sys.executable, str(CASES), "--shard", f"{i}/{NUM_PROCESSES}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(NUM_PROCESSES)
    ]
    results = {}
    for proc in shards:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-4000:]
        results.update(json.loads(stdout.strip().splitlines()[-1]))
    failures = {name: error for name, error in results.items() if error != "ok"}
    assert not failures, "\n\n".join(f"{n}:\n{e}" for n, e in failures.items())
    assert len(results) == NUM_CASES
