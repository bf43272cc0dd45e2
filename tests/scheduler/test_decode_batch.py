"""DecodeBatch on its own, with the Rust passes and with the Python ones: every step's
block fills and finishes equal what checking each member one by one gives, and its aligned
fields stay true (``check``) after every change."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit.request import Request, RequestStatus, SamplingParams
from enginekit.scheduler.decode_batch import DecodeBatch
from enginekit.scheduler.decode_ops import DecodeOps, decode_ops

BLOCK_SIZE = 4
EOS = 2
BOTH = pytest.mark.parametrize("ops", [decode_ops(True), decode_ops(False)], ids=["rust", "py"])


def decoding_request(seq_id: int, prompt_len: int, sampling: SamplingParams) -> Request:
    """A running request with its first output token appended and one token to compute."""
    request = Request(str(seq_id), seq_id, list(range(10, 10 + prompt_len)), sampling)
    request.token_ids.append(9)
    request.num_computed_tokens = request.num_tokens - 1
    request.status = RequestStatus.RUNNING
    return request


def expected_status(request: Request, token: int) -> RequestStatus | None:
    """What appending ``token`` does to ``request``, checked the plain way."""
    sampling = request.sampling
    if token in sampling.stop_token_ids or (token == EOS and not sampling.ignore_eos):
        return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= sampling.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None


@BOTH
def test_a_step_marks_fills_and_finishes_members(ops: DecodeOps) -> None:
    batch = DecodeBatch(EOS, BLOCK_SIZE, ops)
    a = decoding_request(1, 3, SamplingParams(max_tokens=3, ignore_eos=True))  # 4 tokens
    b = decoding_request(2, 6, SamplingParams(max_tokens=9, stop_token_ids=(7,)))  # 7
    batch.add([a, b])
    batch.check()
    assert batch.seq_ids == [1, 2] and batch.last_token_ids == [9, 9]
    assert batch.mark_scheduled() == ([4, 7], [0])  # a's 4th token fills its first block
    assert (a.num_computed_tokens, b.num_computed_tokens) == (4, 7)
    assert batch.append([EOS, 5]) == []  # a ignores EOS; b goes on
    assert batch.mark_scheduled() == ([5, 8], [1])  # b's 8th token
    finished = batch.append([3, 7])  # a reaches max_tokens=3, b its stop id
    assert finished == [a, b] and len(batch) == 0
    assert a.status is RequestStatus.FINISHED_LENGTH
    assert b.status is RequestStatus.FINISHED_STOPPED
    assert a.token_ids[-2:] == [EOS, 3] and b.token_ids[-2:] == [5, 7]
    batch.check()


@BOTH
def test_the_batch_owns_its_members_computed_counts_and_hands_them_back(ops: DecodeOps) -> None:
    batch = DecodeBatch(EOS, BLOCK_SIZE, ops)
    a = decoding_request(1, 3, SamplingParams(max_tokens=9, ignore_eos=True))  # 4 tokens
    b = decoding_request(2, 6, SamplingParams(max_tokens=9, ignore_eos=True))  # 7
    batch.add([a, b])
    assert (a.num_computed_tokens, b.num_computed_tokens) == (3, 6)  # one left each
    batch.mark_scheduled()
    assert (a.num_computed_tokens, b.num_computed_tokens) == (4, 7)  # the step computes it
    batch.append([5, 6])
    assert (a.num_computed_tokens, b.num_computed_tokens) == (4, 7)  # the new token is left
    batch.check()
    batch.mark_scheduled()
    batch.remove([a])  # e.g. aborted while the step runs: its count is stored as it is
    batch.append([5])
    assert (a.num_tokens, a.num_computed_tokens) == (5, 5)
    assert (b.num_tokens, b.num_computed_tokens) == (9, 8)
    a.token_ids.append(1)  # no longer the batch's: growing it computes nothing
    assert a.num_computed_tokens == 5
    b.num_computed_tokens = 0  # set: stored from now on, and the batch's check sees it
    with pytest.raises(RuntimeError, match="cannot be in the decode batch"):
        batch.check()


@BOTH
def test_tokens_for_another_batch_are_refused(ops: DecodeOps) -> None:
    batch = DecodeBatch(EOS, BLOCK_SIZE, ops)
    batch.add([decoding_request(1, 3, SamplingParams(max_tokens=5))])
    with pytest.raises(ValueError, match="2 tokens for a batch of 1 decodes"):
        batch.append([3, 4])


SAMPLING = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 12),
    stop_token_ids=st.sampled_from([(), (5,), (5, 6)]),
    ignore_eos=st.booleans(),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.tuples(st.integers(1, 9), SAMPLING), max_size=3)),
        st.tuples(st.just("step"), st.lists(st.integers(0, 7), min_size=16, max_size=16)),
        st.tuples(st.just("remove"), st.integers(0, 15)),
    ),
    max_size=30,
)


@BOTH
@settings(max_examples=150, deadline=None)
@given(script=OPS)
def test_the_batch_agrees_with_checking_each_member(ops: DecodeOps, script) -> None:
    batch = DecodeBatch(EOS, BLOCK_SIZE, ops)
    next_seq_id = iter(range(1000))
    for op, arg in script:
        if op == "add":
            joining = [decoding_request(next(next_seq_id), n, s) for n, s in arg]
            # a member whose first output already reached max_tokens would have finished
            batch.add([r for r in joining if r.num_output_tokens < r.sampling.max_tokens])
        elif op == "remove" and batch.requests:
            batch.remove([batch.requests[arg % len(batch)]])
        elif op == "step":
            members = list(batch.requests)
            lens = [r.num_tokens for r in members]
            assert batch.num_tokens() == lens
            fills = [i for i, n in enumerate(lens) if n % BLOCK_SIZE == 0]
            assert batch.mark_scheduled() == (lens, fills)
            assert [r.num_computed_tokens for r in members] == lens
            tokens = arg[: len(members)]
            for request, token in zip(members, tokens, strict=True):
                request.token_ids.append(token)  # the plain way, then undone
            expected = [expected_status(r, t) for r, t in zip(members, tokens, strict=True)]
            for request in members:
                request.token_ids.pop()
            finished = batch.append(list(tokens))
            assert finished == [r for r, s in zip(members, expected, strict=True) if s]
            assert [r.status for r in finished] == [s for s in expected if s]
            assert batch.requests == [r for r, s in zip(members, expected, strict=True) if not s]
        batch.check()


@BOTH
def test_counts_past_the_int_table_extend_it(ops: DecodeOps) -> None:
    batch = DecodeBatch(EOS, BLOCK_SIZE, ops)
    short = decoding_request(1, 3, SamplingParams(max_tokens=5000, ignore_eos=True))
    batch.add([short])
    assert batch.mark_scheduled() == ([4], [0])
    batch.append([7])
    batch.add([decoding_request(2, 2500, SamplingParams(max_tokens=5, ignore_eos=True))])
    batch.check()
    assert batch.mark_scheduled() == ([5, 2501], [])
    assert batch.append([7, 7]) == []
    batch.check()
