"""The Triton kernels compile offline for sm_90a (H100/H200) with zero register spills.

``tools/kernel_proxies.py --ci`` records the launches of the public kernel functions
on CPU tensors and compiles each with Triton's bundled ptxas; this runs it in a child
process (two compile processes, so about a minute on two cores) over its CI subset
(``ci_grid``: every head_dim, GQA ratio, block size, storage kind and model dtype at
least once in decode and in prefill, the int4 cache write and a block copy; the full grid
is the tool's). The SASS parsing and the signature rules are unit-tested on their
own. Skipped only where the offline toolchain is absent (Triton without its nvidia
backend, which ships ptxas and cuobjdump).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

triton = pytest.importorskip("triton", reason="triton is not installed: no ptxas to compile with")
kp = pytest.importorskip("kernel_proxies")

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
        /*0020*/              @!P0 BRA 0x0090 ;
        /*0030*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0040*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0050*/                   FFMA R9, R9, R9, R9 ;
        /*0060*/               @P1 BRA 0x0030 ;
        /*0070*/                   STL [R1], R2 ;
        /*0080*/               @P2 BRA 0x0020 ;
        /*0090*/                   LDL R2, [R1] ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0xb0;
"""


def test_the_main_loop_is_the_innermost_backward_branch() -> None:
    instructions = kp.parse_sass(SASS)
    assert len(instructions) == 12
    assert [i.opcode for i in instructions[:4]] == ["MOV", "S2R", "BRA", "LDG.E.128"]
    # 0x30..0x60 nests inside 0x20..0x80; the branch-to-itself at 0xb0 is no loop.
    assert kp.innermost_loops(instructions) == [kp.Loop(0x30, 0x60)]
    counts = kp.sass_counts(instructions)
    assert counts == {
        "sass_instructions": 12,
        "loop_instructions": 4,
        "loop_global_loads": 1,
        "loop_matrix_instructions": 1,
        "num_innermost_loops": 1,
        "local_instructions": 2,
    }


def test_a_kernel_without_loops_has_no_loop_body() -> None:
    instructions = kp.parse_sass(SASS.split("/*0020*/")[0] + "/*0020*/ EXIT ;")
    assert kp.innermost_loops(instructions) == []
    assert kp.sass_counts(instructions)["loop_instructions"] == 0


@triton.jit(do_not_specialize=["n"])
def _probe_kernel(x_ptr, n, m, k, scale, FLAG: triton.language.constexpr):
    pass


def test_signatures_follow_the_launchers_rules() -> None:
    """Tensors by dtype with the divisibility attribute when aligned; an int 1 becomes a
    constexpr and a multiple of 16 is marked divisible, except under do_not_specialize;
    large ints are i64; floats fp32; options are kept apart."""
    import torch

    x = torch.zeros(64, dtype=torch.bfloat16)
    launch = kp.Launch(_probe_kernel, (x, 32, 1, 2**33), {"scale": 0.5, "FLAG": True,
                                                          "num_warps": 8}, (1,))  # fmt: skip
    inp = kp.compile_input(launch)
    assert inp.signature == {"x_ptr": "*bf16", "n": "i32", "m": "constexpr", "k": "i64",
                             "scale": "fp32", "FLAG": "constexpr"}  # fmt: skip
    assert inp.constexprs == {"m": 1, "FLAG": True}
    assert inp.attrs == {(0,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]}
    assert inp.options == {"num_warps": 8}
    unaligned = kp.compile_input(launch._replace(args=(x[1:], 17, 1, 3)))
    assert unaligned.signature["k"] == "i32"
    assert unaligned.attrs == {}


def test_recording_captures_launches_without_running_them() -> None:
    launches = kp.record_launches(lambda: kp.call_kernel(kp.KernelConfig("decode")))
    assert [launch.fn.__name__ for launch in launches] == ["_decode_kernel", "_merge_kernel"]
    assert launches[0].kwargs["BLOCK_SIZE"] == 16
    assert launches[0].kwargs["GROUP"] == 4
    assert launches[0].kwargs["IS_SPLIT"]
    int4_copy = kp.record_launches(lambda: kp.call_kernel(kp.KernelConfig("copy", kind="int4")))
    assert len(int4_copy) == 3  # data, key scales, value scales


def test_every_ci_configuration_compiles_for_sm90_without_spills(tmp_path: Path) -> None:
    problem = kp.tool_problem()
    if problem is not None:
        pytest.skip(f"no offline sm_90a toolchain: {problem}")
    out = tmp_path / "proxies.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "kernel_proxies.py"), "--ci", "--jobs", "2",
         "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert out.is_file(), proc.stderr[-4000:]
    report = json.loads(out.read_text())
    failures = [r for r in report["results"] if isinstance(r, str)]
    assert not failures, "\n".join(failures)
    stats = report["results"]
    assert {r["config"] for r in stats} == {c.name for c in kp.ci_grid()}
    # One distinct kernel per configuration, and decode's merge kernel beside its own.
    num_decode = sum(c.op == "decode" for c in kp.ci_grid())
    assert len(stats) == len(kp.ci_grid()) + num_decode
    spilling = [
        f"{r['config']}: {r['registers']} registers, {r['spill_store_bytes']} B spill stores, "
        f"{r['spill_load_bytes']} B spill loads, {r['local_instructions']} STL/LDL"
        for r in stats
        if r["spill_store_bytes"] or r["spill_load_bytes"] or r["local_instructions"]
    ]
    assert not spilling, "spills on sm_90a:\n" + "\n".join(spilling)
    assert proc.returncode == 0, proc.stdout[-4000:]
