"""Claims about KV memory: what paging saves, what GQA and quantizers shrink, and the bytes
of one token (see ``enginekit.claims.job``).

- Paging: ``unique`` (ShareGPT-like) chat traffic at ``model.max_model_len=2048`` in a
  2 GiB pool of Llama-3-8B KV on a simulated H200, so that memory, not the scheduler's
  ``max_num_seqs``, caps the batch; ``+allocator=contiguous`` against ``paged``, both
  with ``+prefix=none``.
- Bytes: ``KVSpec`` arithmetic on Llama-3-8B (32 layers, 8 KV heads of 128) against the
  same shape with 32 KV heads (multi-head attention, as Llama-2-7B), in 16 bits, fp8,
  and int4 with groups of 64 at blocks of 64 and of 16 tokens.
"""

from __future__ import annotations

import dataclasses

from enginekit import metric_keys as mk
from enginekit.claims.scenario import ClaimRow, Section, Table, sim_summary, verdict
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import MODEL_PRESETS
from enginekit.spec.quant import KVQuant

PAGING_SETTINGS = (
    "model.name=llama-3-8b",
    "hardware.name=h200",
    "prefix.name=none",
    "workload.name=unique",
    "model.max_model_len=2048",
    "cache.memory_gib=2",
    "cache.block_size=16",
)
PAGING_COMMAND = (
    "python -m enginekit +prefix=none workload=unique model.max_model_len=2048 cache.memory_gib=2"
)
PAGING_BLOCK_SIZE = 16
CLAIMED_WASTE = (0.60, 0.80)
SEVERAL = 3.0  # "several times more" concurrent sequences: at least this ratio of means
MODEL_BITS = 16
INT4_GROUP = 64
TOKENS_4K = 4_000
CLAIMED_4K_MB = 512


def paging_section(quick: bool = False) -> Section:
    """Contiguous max-length reservations against paging on the same chat traffic."""
    num_requests = 200 if quick else 500
    runs = {
        alloc: sim_summary(
            *PAGING_SETTINGS, f"allocator.name={alloc}", f"workload.num_requests={num_requests}"
        )
        for alloc in ("contiguous", "paged")
    }
    stats = {}
    for alloc, s in runs.items():
        stats[alloc] = {
            "slot_utilization": s[mk.KV_CACHE_SLOT_UTILIZATION.key],
            "wasted_share": 1.0 - s[mk.KV_CACHE_SLOT_UTILIZATION.key],
            "unused_slots_per_seq": s[mk.KV_CACHE_UNUSED_SLOTS_MEAN.key]
            / s[mk.NUM_RUNNING_MEAN.key],
            "num_running_mean": s[mk.NUM_RUNNING_MEAN.key],
            "num_running_peak": s[mk.NUM_RUNNING_PEAK.key],
            "num_preemptions": s[mk.NUM_PREEMPTIONS_TOTAL.key],
            "mean_tokens": (s[mk.PROMPT_TOKENS_TOTAL.key] + s[mk.GENERATION_TOKENS_TOTAL.key])
            / s[mk.NUM_REQUESTS.key],
            "output_tokens_per_s": s[mk.OUTPUT_TOKENS_PER_S.key],
        }
    contiguous, paged = stats["contiguous"], stats["paged"]
    block_size = PAGING_BLOCK_SIZE
    waste = contiguous["wasted_share"]
    low, high = CLAIMED_WASTE
    waste_verdict = "yes" if low <= waste <= high else ("partly" if waste > high else "no")
    mean_ratio = paged["num_running_mean"] / contiguous["num_running_mean"]
    peak_ratio = paged["num_running_peak"] / contiguous["num_running_peak"]
    rows = (
        ClaimRow(
            "contiguous_waste",
            "Contiguous max-length allocation wastes 60–80% of reserved KV memory on "
            "chat-like lengths",
            f"{waste:.1%} of reserved slots hold no token (slot utilisation "
            f"{contiguous['slot_utilization']:.1%}; {contiguous['unused_slots_per_seq']:,.0f} "
            f"of 2,048 slots unused per sequence)"
            + (
                f"; more than the range: these chats average {contiguous['mean_tokens']:,.0f} "
                "tokens"
                if waste > high
                else ""
            ),
            waste_verdict,
            {"wasted_share": waste, "contiguous": contiguous},
        ),
        ClaimRow(
            "paged_waste",
            "Paging wastes less than one block per sequence",
            f"{paged['unused_slots_per_seq']:.1f} unused slots per running sequence (block of "
            f"{block_size}); {paged['wasted_share']:.1%} of reserved slots",
            "yes" if paged["unused_slots_per_seq"] < block_size else "no",
            {"unused_slots_per_seq": paged["unused_slots_per_seq"], "block_size": block_size},
        ),
        ClaimRow(
            "paged_concurrency",
            "Paging holds several times more concurrent sequences",
            f"running sequences mean {paged['num_running_mean']:.1f} vs "
            f"{contiguous['num_running_mean']:.1f} ({mean_ratio:.1f}×), peak "
            f"{paged['num_running_peak']} vs {contiguous['num_running_peak']} "
            f"({peak_ratio:.1f}×)",
            "yes" if mean_ratio >= SEVERAL else ("partly" if mean_ratio > 1.5 else "no"),
            {"mean_ratio": mean_ratio, "peak_ratio": peak_ratio},
        ),
    )
    header = (
        "allocator",
        "slot utilisation",
        "unused slots / seq",
        "running mean",
        "running peak",
        "preemptions",
        "output tok/s",
    )
    table_rows = tuple(
        (
            alloc,
            f"{st['slot_utilization']:.1%}",
            f"{st['unused_slots_per_seq']:,.1f}",
            f"{st['num_running_mean']:.1f}",
            str(st["num_running_peak"]),
            str(st["num_preemptions"]),
            f"{st['output_tokens_per_s']:,.0f}",
        )
        for alloc, st in stats.items()
    )
    notes = (
        f"Runs: `{PAGING_COMMAND} workload.num_requests={num_requests} "
        "+allocator=contiguous|paged` (Llama-3-8B, simulated H200, a 2 GiB KV pool = "
        "16,384 tokens, so memory caps the batch).",
        "Paging's preemptions are the price of admitting on current length rather than "
        "the maximum; output tok/s is simulated time.",
    )
    table = Table("Contiguous against paged, same requests", header, table_rows)
    return Section("Paging against contiguous reservations", rows, (table,), notes)


def _spec(num_kv_heads: int, quant: KVQuant, block_size: int) -> KVSpec:
    shape = dataclasses.replace(MODEL_PRESETS["llama-3-8b"], num_kv_heads=num_kv_heads)
    return KVSpec.of(shape, MODEL_BITS, block_size, quant)


def bytes_section() -> Section:
    """GQA, fp8 and int4 bytes per token, and the bytes of 4,000 tokens. Exact arithmetic."""
    head_dim = MODEL_PRESETS["llama-3-8b"].head_dim
    mha = _spec(32, KVQuant(), 16).bytes_per_token
    gqa = _spec(8, KVQuant(), 16).bytes_per_token
    fp8 = _spec(8, KVQuant("fp8"), 16).bytes_per_token
    int4 = {
        bs: _spec(8, KVQuant.int4(INT4_GROUP, bs, head_dim), bs).bytes_per_token for bs in (64, 16)
    }
    gqa_ratio, fp8_ratio = mha / gqa, gqa / fp8
    int4_ratios = {bs: gqa / b for bs, b in int4.items()}
    near_quarter = {bs: 3.5 <= r <= 4.5 for bs, r in int4_ratios.items()}
    total_4k = TOKENS_4K * gqa
    rows = (
        ClaimRow(
            "gqa_4x",
            "GQA with 8 KV heads instead of 32 shrinks the cache 4×",
            f"{mha:,.0f} → {gqa:,.0f} bytes/token: {gqa_ratio:.2f}×",
            "yes" if gqa_ratio == 4 else "no",
            {"mha_bytes_per_token": mha, "gqa_bytes_per_token": gqa, "ratio": gqa_ratio},
        ),
        ClaimRow(
            "fp8_2x",
            "fp8 halves it again",
            f"{gqa:,.0f} → {fp8:,.0f} bytes/token: {fp8_ratio:.2f}× (its per-(layer, head) "
            "scales are held once per pool)",
            "yes" if fp8_ratio == 2 else "no",
            {"fp8_bytes_per_token": fp8, "ratio": fp8_ratio},
        ),
        ClaimRow(
            "int4_4x",
            "int4 with scales about quarters it",
            f"group {INT4_GROUP}: {int4[64]:,.0f} bytes/token at blocks of 64 "
            f"({int4_ratios[64]:.2f}×), {int4[16]:,.0f} at blocks of 16 "
            f"({int4_ratios[16]:.2f}×: key groups shrink to the block)",
            verdict(near_quarter.values()),
            {
                "int4_bytes_per_token": {str(bs): b for bs, b in int4.items()},
                "ratio": {str(bs): r for bs, r in int4_ratios.items()},
            },
        ),
        ClaimRow(
            "bytes_per_token",
            "Llama-3-8B in 16 bits: 131,072 bytes (128 KB) per token",
            f"{gqa:,.0f} bytes = 2 × 32 layers × 8 KV heads × 128 × 2 bytes = "
            f"{gqa / 1024:,.0f} KiB",
            "yes" if gqa == 131_072 else "no",
            {"bytes_per_token": gqa},
        ),
        ClaimRow(
            "bytes_4k_tokens",
            "4,000 tokens ≈ 512 MB",
            f"{TOKENS_4K:,} × {gqa:,.0f} = {total_4k:,.0f} bytes = {total_4k / 2**20:,.1f} MiB "
            f"= {total_4k / 1e6:,.1f} MB; 512 is 4,000 × 128 KiB counted in thousands of KiB",
            "partly",
            {
                "bytes": total_4k,
                "mib": total_4k / 2**20,
                "mb": total_4k / 1e6,
                "claimed_mb": CLAIMED_4K_MB,
            },
        ),
    )
    header = (
        "KV layout",
        "bytes / token",
        "× smaller than 32 heads 16-bit",
        "× smaller than 8 heads 16-bit",
    )
    layouts = [
        ("32 KV heads, 16-bit (MHA)", mha),
        ("8 KV heads, 16-bit (Llama-3-8B)", gqa),
        ("8 KV heads, fp8", fp8),
        (f"8 KV heads, int4 group {INT4_GROUP}, blocks of 64", int4[64]),
        (f"8 KV heads, int4 group {INT4_GROUP}, blocks of 16", int4[16]),
    ]
    table_rows = tuple(
        (name, f"{b:,.0f}", f"{mha / b:.2f}", f"{gqa / b:.2f}") for name, b in layouts
    )
    notes = (
        "KVSpec arithmetic: 2 (K, V) × layers × KV heads × head dim × bytes per element, "
        "plus int4's float16 scale and zero point per group (keys per channel over "
        "min(64, block) tokens, values per 64 channels of a token).",
        "The 32-head variant is Llama-3-8B's shape with num_kv_heads=32 (Llama-2-7B's KV layout).",
    )
    return Section(
        "KV bytes: GQA, quantizers, one token",
        rows,
        (Table("Bytes per token of Llama-3-8B's KV", header, table_rows),),
        notes,
    )
