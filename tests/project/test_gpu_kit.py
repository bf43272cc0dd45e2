"""The GPU kit (benchmarks/gpu/), the kernel benchmark and its section of docs/results.md,
on a machine without CUDA: every GPU entry point refuses with one clear line and a non-zero status;
the kit's wheel list covers every runtime dependency (enginekit's and each fetched
package's) with versions inside their ranges, and prepare.sh builds exactly that list;
the benchmark's byte and FLOP accounting is exact and its inputs, laid out contiguously,
give SDPA what the paged kernels compute (under the interpreter); the native-case
runner keeps strides and copies pools back; results.py renders a report's tables.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(GPU))

torch = pytest.importorskip("torch")
requires_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def run(args: list[str], env: dict[str, str] | None = None, timeout: int = 300):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=ROOT)  # fmt: skip


@requires_no_cuda
@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        (["bash", str(GPU / "run_kit.sh")], "run_kit: "),
        (
            [sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--quick"],
            "bench_kernels: ",
        ),
        ([sys.executable, str(GPU / "e2e.py"), "--quick"], "e2e: "),
        ([sys.executable, str(GPU / "native_cases.py")], "native_cases: "),
    ],  # fmt: skip
)
def test_gpu_entry_points_refuse_without_cuda(command: list[str], prefix: str, tmp_path) -> None:
    proc = run(command, {"KIT_RESULTS": str(tmp_path / "results")})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(prefix + "needs a CUDA GPU; ")
    assert proc.stdout == ""
    assert not (tmp_path / "results").exists()  # nothing was installed or run


# -- the wheel list -----------------------------------------------------------------------


def wheel_entries() -> list[tuple[str, str]]:
    entries = []
    for line in (GPU / "wheels.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            kind, requirement = line.split()
            entries.append((kind, requirement))
    return entries


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_wheel_list_covers_every_runtime_dependency() -> None:
    packaging = pytest.importorskip("packaging.requirements")
    from packaging.version import Version

    entries = wheel_entries()
    kinds = {kind for kind, _ in entries}
    assert kinds == {"build", "fetch", "image"}
    names = [canonical(r.split("==")[0]) for _, r in entries]
    assert len(names) == len(set(names)), "an entry is listed twice"
    builds = {canonical(r) for k, r in entries if k == "build"}
    assert builds == {"enginekit", "enginekit-plugins"}
    pins = {}
    for kind, requirement in entries:
        if kind == "fetch":
            name, sep, version = requirement.partition("==")
            assert sep and version, f"fetch entries are pinned: {requirement}"
            pins[canonical(name)] = Version(version)
        else:
            assert "==" not in requirement, f"only fetch entries carry versions: {requirement}"
    listed = set(names)
    # enginekit's own runtime dependencies: each listed, a fetched pin inside its range.
    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    plugins = tomllib.loads((ROOT / "plugins" / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"] + plugins["dependencies"]:
        req = packaging.Requirement(spec)
        name = canonical(req.name)
        assert name in listed, f"{req.name} (a dependency of enginekit) is not in wheels.txt"
        if name in pins:
            assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {spec}"
    # Each fetched package's own dependencies, where that very version is installed here.
    checked = 0
    for name, version in pins.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != version:
            continue
        checked += 1
        for spec in dist.requires or []:
            req = packaging.Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonical(req.name)
            assert dep in listed, f"{req.name} (needed by {name}) is not in wheels.txt"
            if dep in pins:
                assert req.specifier.contains(pins[dep]), f"{dep}=={pins[dep]} breaks {spec}"
    assert checked or not pins  # the pins are this machine's versions: the check ran


def test_prepare_builds_exactly_the_list(tmp_path) -> None:
    proc = run(["bash", str(GPU / "prepare.sh"), "--dry-run", str(tmp_path / "wheels")])
    assert proc.returncode == 0, proc.stderr
    commands = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]
    entries = [(k, r) for k, r in wheel_entries() if k != "image"]
    assert len(commands) == len(entries)
    for (_, requirement), command in zip(entries, commands, strict=True):
        if requirement == "enginekit":
            assert "maturin build --release" in command
        elif requirement == "enginekit-plugins":
            assert "pip wheel --no-deps" in command and command.endswith("/plugins")
        else:
            assert "pip wheel --no-deps" in command and command.endswith(requirement)
    assert not list((tmp_path / "wheels").glob("*"))  # a dry run builds nothing
    kit = (GPU / "run_kit.sh").read_text()
    assert "wheels.txt" in kit and "--no-index --find-links" in kit


def test_the_wheel_is_abi3() -> None:
    cargo = (ROOT / "Cargo.toml").read_text()
    assert re.search(r'^abi3 = \["python", "pyo3/abi3-py311"\]', cargo, re.M)
    maturin = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["maturin"]
    assert "abi3" in maturin["features"]


# -- the kernel benchmark -----------------------------------------------------------------


def test_the_benchmark_counts_bytes_and_flops_exactly() -> None:
    import bench_kernels as b

    assert b.page_bytes("none") == 2 * 8 * 16 * 128 * 2
    assert b.page_bytes("fp8") == 2 * 8 * 16 * 128
    # int4: codes, plus per kv head fp16 (scale, zero) for 128 key channels x 1 group of
    # 16 tokens and for 16 value tokens x 2 groups of 64 channels.
    assert b.page_bytes("int4") == 2 * 8 * 16 * 64 + 8 * (128 + 16 * 2) * 2 * 2
    p = b.Point("decode", "none", 2, 40)  # 3 pages per sequence, the last one partial
    assert p.num_pages == 3
    assert b.decode_bytes(p) == 6 * 65536 + 6 * 4 + 2 * (2 * 32 * 128 * 2)
    assert b.decode_bytes(b.Point("decode", "fp8", 2, 40)) == 6 * 32768 + 64 + 24 + 32768
    assert b.sdpa_decode_bytes(p) == 2 * 40 * 8 * 128 * 4 + 32768
    assert b.prefill_flops(b.Point("prefill", "none", 2, 40)) == 4 * 2 * 32 * 128 * 820
    full = b.grid_points(b.FULL_BATCHES, b.FULL_CONTEXTS)
    assert sum(p.op == "decode" for p in full) == 3 * 25
    assert sum(p.op == "prefill" for p in full) == 3 * (5 + 4 + 3 + 2 + 1)
    assert all(p.batch * p.context <= b.MAX_PREFILL_TOKENS for p in full if p.op == "prefill")
    quick = b.grid_points(b.QUICK_BATCHES, b.QUICK_CONTEXTS)
    assert 0 < len(quick) < len(full)


BENCH_UNDER_INTERPRETER = """
import json, torch, bench_kernels as b
errors = {}
for op in ("decode", "prefill"):
    for kind in b.KINDS:
        p = b.Point(op, kind, 2, 40)
        inputs = b.make_inputs(p, torch.device("cpu"))
        got, want = b.kernel_call(p, inputs)(), b.sdpa_call(p, inputs)()
        errors[f"{op}-{kind}"] = float((got.float() - want.float()).norm() / want.float().norm())
print(json.dumps(errors))
"""


def test_the_benchmark_gives_sdpa_the_kernels_data() -> None:
    """Paged kernels (interpreted) and SDPA on the contiguous copy agree to bfloat16
    rounding for every kind, decode and prefill, pages in random order, a partial page."""
    pytest.importorskip("triton")
    path = os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    env = {"TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = run([sys.executable, "-c", BENCH_UNDER_INTERPRETER], env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(errors) == 6
    assert all(e < 1e-2 for e in errors.values()), errors


# -- the native case runner ---------------------------------------------------------------


def test_the_runner_moves_views_with_their_strides_and_copies_pools_back() -> None:
    import native_cases

    from enginekit.kernels.layout import allocate_kv_tensors
    from enginekit.spec.kv import KVSpec
    from enginekit.spec.quant import KVQuant

    kv = torch.randn(5, 6, 16)
    key = kv[:, 2:]
    moved = native_cases.to_device(key, "cpu")
    assert moved.data_ptr() != key.data_ptr()
    assert moved.stride() == key.stride() and moved.storage_offset() == key.storage_offset()
    assert torch.equal(moved, key)
    pool = allocate_kv_tensors(KVSpec(2, 2, 16, 4, 4, KVQuant.int4(4, 4, 16)), 3, torch.float32,
                               "cpu")  # fmt: skip
    assert pool.key_meta is not None and pool.value_meta is not None

    def mutate(p, x):
        p.data.fill_(7)
        p.key_meta.fill_(2.0)
        return x * 2

    out = native_cases.OnDevice(types.SimpleNamespace(mutate=mutate), "cpu").mutate(pool, key)
    assert torch.equal(out, key * 2)
    assert int(pool.data.min()) == 7 and float(pool.key_meta.min()) == 2.0
    assert float(pool.value_meta.abs().max()) == 0.0


def test_the_runner_runs_kernel_cases_through_its_plumbing() -> None:
    """Under the interpreter (no GPU here): a decode over a poisoned pool, a cache write
    and a block copy compared bit for bit pass through the device wrappers."""
    pytest.importorskip("triton")
    cases = ["decode-h8-kv2-bs4-w6-s3", "write-kv2-bs4", "write-int4-g4-kv2-bs4-float32",
             "copy-int4", "copy-real-bs16-fp8"]  # fmt: skip
    proc = run([sys.executable, str(GPU / "native_cases.py"), "--interpret", "--jobs", "1",
                "--only", ",".join(cases)], {"OMP_NUM_THREADS": "1"}, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(cases)}/{len(cases)} passed" in proc.stdout


# -- the results section ------------------------------------------------------------------


def report() -> dict:
    row = {"op": "decode", "kind": "fp8", "batch": 64, "context": 4096, "kernel_ms": 0.5,
           "kernel_rate": 2150.0, "kernel_pct_peak": 44.8, "sdpa_ms": 1.0, "sdpa_rate": 4300.0,
           "sdpa_pct_peak": 89.6, "sdpa_over_kernel": 2.0, "rel_error": 4e-3, "note": "",
           "unit": "GB/s"}  # fmt: skip
    prefill = {**row, "op": "prefill", "kind": "none", "kernel_rate": 400.0,
               "kernel_pct_peak": 40.4, "sdpa_ms": None, "sdpa_rate": None,
               "sdpa_pct_peak": None, "sdpa_over_kernel": None, "rel_error": None,
               "note": "SDPA: OutOfMemoryError: ", "unit": "TFLOP/s"}  # fmt: skip
    return {
        "machine": {"gpu": "NVIDIA H200", "gpu_memory_gib": "140", "multiprocessors": "132",
                    "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3",
                    "date": "2026-12-01"},
        "ceilings": {"copy_gb_s": 4300.0, "bf16_matmul_tflop_s": 790.0},
        "peaks": {"bandwidth_bytes_s": 4.8e12, "bf16_flops": 989e12},
        "shape": {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page": 16,
                  "int4_group": 64, "dtype": "bfloat16"},
        "command": "python3 benchmarks/bench_kernels.py --quick",
        "rows": [row, prefill],
    }  # fmt: skip


def test_results_puts_the_kernel_report_in_the_results_file(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("results", None)
    import results

    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(report()))
    section = results.kernels_section(path)
    assert section.startswith("## Kernels\n\nMeasured on NVIDIA H200 (140 GiB, 132 ")
    assert "not on the machine above" in section and "Triton 3.6.0" in section
    assert "| fp8 | 64 | 4,096 | 0.500 | 2,150 | 44.8 | 1.000 | 4,300 | 2.00 | 4.0e-03 |" in section
    assert "| none | 64 | 4,096 | 0.500 | 400.0 | 40.4 | — | — | — | — |" in section
    assert "copy 4,300 GB/s, bf16 matmul 790 TFLOP/s" in section
    # Without a report, measured figures already in the last results file are carried over
    # as they are.
    readme = "intro\n\n" + section + "\n### Next\n"
    assert results.kernels_section(None, readme) == section
    assert "No kernel figures yet" in results.kernels_section(None, "")
    whole = results.apply_section("# r\n", results.BEGIN + "\n" + section + results.END + "\n")
    assert section in whole


# -- the end-to-end run -------------------------------------------------------------------


def test_the_end_to_end_run_on_a_small_model_on_the_cpu(tmp_path) -> None:
    """e2e.py's pieces on the tiny model's shape: its weights written and read by both
    systems, one prefill step then one decode step per token, each with a prediction, and
    the same greedy tokens from enginekit and transformers."""
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    import e2e

    from enginekit.models.tiny import tiny_config

    config = tiny_config()
    e2e.write_random_model(tmp_path, 0, torch.device("cpu"), config)
    batch = e2e.prompts(4, 24, config["vocab_size"], 0)
    ek, steps, _ = e2e.run_enginekit(tmp_path, batch, 6, 0.01, "cpu")
    hf = e2e.run_transformers(tmp_path, batch, 6, "cpu")
    assert [(s.num_prefill_tokens, s.num_decodes) for s in steps] == [(96, 0)] + [(0, 4)] * 5
    assert all(s.measured_s > 0 and s.predicted_s > 0 for s in steps)
    assert ek.wall_s == pytest.approx(sum(s.measured_s for s in steps))
    assert ek.ttft_s == pytest.approx(steps[0].measured_s)  # every request's first token
    for result in (ek, hf):
        assert [len(t) for t in result.output_token_ids] == [6] * 4
        assert result.tokens_per_s > 0 and result.ttft_s > 0 and result.tpot_s > 0
    assert e2e.agreement(ek.output_token_ids, hf.output_token_ids)["first_token"] == 1.0
