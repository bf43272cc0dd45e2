"""The decode batch's per-step passes: the Rust ones do what the Python ones (the spec) do,
result and effects, and both refuse bad arguments having changed nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit.scheduler.decode_ops import PYTHON_DECODE_OPS, DecodeOps, decode_ops

RUST = decode_ops(True)
INTS = list(range(64))  # the table of int objects the context lengths share
BOTH = pytest.mark.parametrize("ops", [RUST, PYTHON_DECODE_OPS], ids=["rust", "py"])

MEMBERS = st.lists(
    st.tuples(
        st.integers(1, 40),  # tokens held
        st.integers(1, 45),  # tokens it stops at
        st.booleans(),  # whether EOS stops it
        st.integers(0, 5),  # the token it is given
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(members=MEMBERS, block_size=st.integers(1, 8))
def test_context_lens_agree_with_the_spec(members, block_size: int) -> None:
    lengths = [m[0] for m in members]
    results = []
    for ops in (RUST, PYTHON_DECODE_OPS):
        counts = np.array(lengths, dtype=np.int64)
        results.append(ops.context_lens(counts, block_size, INTS))
        assert counts.tolist() == lengths  # read only
    assert results[0] == results[1]
    assert results[1] == (lengths, [i for i, n in enumerate(lengths) if n % block_size == 0])
    # the table's own objects, no new ints
    assert all(a is INTS[n] for a, n in zip(results[0][0], lengths, strict=True))


@settings(max_examples=200, deadline=None)
@given(members=MEMBERS, eos=st.one_of(st.none(), st.integers(0, 5)))
def test_append_tokens_agrees_with_the_spec(members, eos: int | None) -> None:
    outcomes = []
    for ops in (RUST, PYTHON_DECODE_OPS):
        lists = [list(range(m[0])) for m in members]
        num_tokens = np.array([m[0] for m in members], dtype=np.int64)
        limits = np.array([m[1] for m in members], dtype=np.int64)
        stops = np.array([m[2] for m in members], dtype=np.uint8)
        tokens = [m[3] for m in members]
        result = ops.append_tokens(lists, tokens, num_tokens, limits, stops, eos)
        outcomes.append((result, lists, num_tokens.tolist()))
    assert outcomes[0] == outcomes[1]
    (at_eos, at_length), lists, counts = outcomes[1]
    assert at_eos == [i for i, m in enumerate(members) if m[2] and m[3] == eos]
    assert at_length == [i for i, m in enumerate(members) if m[0] + 1 >= m[1]]
    assert lists == [[*range(m[0]), m[3]] for m in members]
    assert counts == [m[0] + 1 for m in members]


def _append_args() -> tuple[list[list[int]], list[int], np.ndarray, np.ndarray, np.ndarray]:
    lists = [[1, 2], [3]]
    return (
        lists,
        [7, 8],
        np.array([2, 1], dtype=np.int64),
        np.array([9, 9], dtype=np.int64),
        np.array([1, 1], dtype=np.uint8),
    )


@BOTH
def test_bad_arguments_change_nothing(ops: DecodeOps) -> None:
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        ops.context_lens(np.array([3, 4], dtype=np.int64), 0, INTS)
    with pytest.raises(ValueError, match="num_tokens holds 64, outside the 64 ints of the table"):
        ops.context_lens(np.array([3, 64], dtype=np.int64), 4, INTS)
    with pytest.raises(ValueError, match="num_tokens holds -1, outside the 64 ints of the table"):
        ops.context_lens(np.array([-1], dtype=np.int64), 4, INTS)

    lists, tokens, num_tokens, limits, stops = _append_args()
    with pytest.raises(ValueError, match="token_ids has 1 entries for a batch of 2"):
        ops.append_tokens(lists, tokens[:1], num_tokens, limits, stops, 2)
    with pytest.raises(ValueError, match="stops_at_eos has 1 entries for a batch of 2"):
        ops.append_tokens(lists, tokens, num_tokens, limits, stops[:1], 2)
    with pytest.raises(TypeError):
        ops.append_tokens([lists[0], (3,)], tokens, num_tokens, limits, stops, 2)  # type: ignore[list-item]
    assert lists == [[1, 2], [3]] and num_tokens.tolist() == [2, 1]


@BOTH
def test_arrays_that_cannot_be_read_or_written_are_refused(ops: DecodeOps) -> None:
    lists, tokens, num_tokens, limits, stops = _append_args()
    int32 = num_tokens.astype(np.int32)
    with pytest.raises(ValueError, match="num_tokens must be a 1-D C-contiguous buffer of int64"):
        ops.append_tokens(lists, tokens, int32, limits, stops, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stops_at_eos must be a 1-D C-contiguous buffer of uint8"):
        ops.append_tokens(lists, tokens, num_tokens, limits, stops.astype(bool), 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_tokens must be a 1-D C-contiguous buffer of int64"):
        ops.context_lens([3], 4, INTS)  # type: ignore[arg-type]
    num_tokens.flags.writeable = False
    with pytest.raises(ValueError, match="num_tokens must be writable"):
        ops.append_tokens(lists, tokens, num_tokens, limits, stops, 2)
    with pytest.raises(ValueError, match="must be 1-D and C-contiguous"):
        ops.context_lens(np.arange(4, dtype=np.int64)[::2], 4, INTS)
    assert lists == [[1, 2], [3]]
