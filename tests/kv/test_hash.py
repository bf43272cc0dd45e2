"""Block hashing: the Rust core against its pure-Python twin, and both against the spec.

The native module is required: if ``enginekit._native`` is not built, this file fails.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_args import NOT_A_LIST, NOT_AN_EXTRA_KEY

from enginekit import _native
from enginekit.kv.pyref import hashing as pyhash

IMPLS = [pytest.param(_native, id="native"), pytest.param(pyhash, id="python")]

U64 = st.integers(0, 2**64 - 1)
TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=70)
EXTRA = st.none() | st.binary(max_size=40)


def _sanity_buffer(n: int) -> bytes:
    """The byte generator of xxHash's own sanity test (xxhsum -b)."""
    prime32, prime64 = 2654435761, 11400714785074694797
    gen, out = prime32, bytearray()
    for _ in range(n):
        out.append(gen >> 56)
        gen = (gen * prime64) % 2**64
    return bytes(out)


# (length of the sanity buffer, seed, XXH64) as published in xxHash's sanity checks, plus
# short strings whose digests are widely quoted.
SANITY_VECTORS = [
    (0, 0, 0xEF46DB3751D8E999),
    (0, 2654435761, 0xAC75FDA2929B17EF),
    (1, 0, 0xE934A84ADB052768),
    (1, 2654435761, 0x5014607643A9B4C3),
    (14, 0, 0x8282DCC4994E35C8),
    (14, 2654435761, 0xC3BD6BF63DEB6DF0),
    (222, 0, 0xB641AE8CB691C174),
    (222, 2654435761, 0x20CB8AB7AE10C14A),
]
STRING_VECTORS = [
    (b"", 0xEF46DB3751D8E999),
    (b"a", 0xD24EC4F1A98C6E5B),
    (b"abc", 0x44BC2CF5AD770999),
    (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1),
]


@pytest.mark.parametrize(("length", "seed", "expected"), SANITY_VECTORS)
def test_xxh64_sanity_vectors(length: int, seed: int, expected: int) -> None:
    assert pyhash.xxh64(_sanity_buffer(length), seed) == expected


@pytest.mark.parametrize(("data", "expected"), STRING_VECTORS)
def test_xxh64_string_vectors(data: bytes, expected: int) -> None:
    assert pyhash.xxh64(data) == expected


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), seed=U64)
def test_xxh64_matches_xxhash_package(data: bytes, seed: int) -> None:
    xxhash = pytest.importorskip("xxhash")
    assert pyhash.xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed)


def test_root_hash() -> None:
    assert pyhash.ROOT_HASH == 0x656E67696E656B69
    assert _native.ROOT_HASH == pyhash.ROOT_HASH


@settings(max_examples=200, deadline=None)
@given(parent=U64, tokens=TOKENS, extra=EXTRA)
def test_hash_block_native_equals_python(parent: int, tokens: list[int], extra: bytes | None):
    assert _native.hash_block(parent, tokens, extra) == pyhash.hash_block(parent, tokens, extra)


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=120),
    block_size=st.integers(1, 20),
    extra=EXTRA,
    parent=st.none() | U64,
)
def test_hash_blocks_native_equals_python(
    tokens: list[int], block_size: int, extra: bytes | None, parent: int | None
) -> None:
    kwargs = {} if parent is None else {"parent_hash": parent}
    native = _native.hash_blocks(tokens, block_size, extra, **kwargs)
    python = pyhash.hash_blocks(tokens, block_size, extra, **kwargs)
    assert native == python
    assert len(python) == len(tokens) // block_size


def _spec_hash(parent: int, tokens: list[int], extra: bytes | None) -> int:
    """The byte layout of the spec, built independently of pyhash's helpers."""
    data = parent.to_bytes(8, "little")
    if extra is None:
        data += b"\x00"
    else:
        data += b"\x01" + len(extra).to_bytes(4, "little") + extra
    for t in tokens:
        data += t.to_bytes(4, "little")
    return pyhash.xxh64(data)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("parent", "tokens", "extra"),
    [
        (pyhash.ROOT_HASH, [], None),
        (pyhash.ROOT_HASH, [1, 2, 3, 4], None),
        (0, [0], b""),
        (2**64 - 1, [2**32 - 1] * 9, b"tenant-7"),
        (12345, list(range(16)), bytes(range(256))),
    ],
)
def test_hash_block_follows_byte_layout(impl, parent, tokens, extra) -> None:
    assert impl.hash_block(parent, tokens, extra) == _spec_hash(parent, tokens, extra)


# Known answers, computed once from the layout above; they pin the format across versions.
PINS = [
    (pyhash.ROOT_HASH, [], None, 0x174A387AB285B83F),
    (pyhash.ROOT_HASH, [1, 2, 3, 4], None, 0xDFBA54631C0CAE29),
    (pyhash.ROOT_HASH, [1, 2, 3, 4], b"salt", 0x9D190FB3CBF26DBC),
    (0, [0], b"", 0xBC3DBD278470230A),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("parent", "tokens", "extra", "expected"), PINS)
def test_hash_block_known_answers(impl, parent, tokens, extra, expected) -> None:
    assert impl.hash_block(parent, tokens, extra) == expected


@pytest.mark.parametrize("impl", IMPLS)
def test_hash_blocks_known_answer(impl) -> None:
    assert impl.hash_blocks(list(range(10)), 4) == [0x9FAC038DDCF03FB0, 0xD45DC1B07CA879BE]


@pytest.mark.parametrize("impl", IMPLS)
def test_hash_blocks_chains_and_ignores_partial_block(impl) -> None:
    tokens = list(range(100, 111))  # 2 full blocks of 4 and a partial one of 3
    h1 = impl.hash_block(impl.ROOT_HASH, tokens[0:4])
    h2 = impl.hash_block(h1, tokens[4:8])
    assert impl.hash_blocks(tokens, 4) == [h1, h2]
    assert impl.hash_blocks(tokens[:8], 4) == [h1, h2]
    assert impl.hash_blocks(tokens[:7], 4) == [h1]
    assert impl.hash_blocks(tokens[:3], 4) == []
    assert impl.hash_blocks([], 4) == []
    # Continuing from a parent equals hashing the whole prefix.
    assert impl.hash_blocks(tokens[4:], 4, parent_hash=h1) == [h2]
    # A block's hash depends on its whole prefix, not only its own tokens.
    assert impl.hash_blocks(tokens[4:8], 4) != [h2]


@pytest.mark.parametrize("impl", IMPLS)
def test_extra_key_changes_every_block(impl) -> None:
    tokens = list(range(12))
    plain = impl.hash_blocks(tokens, 4)
    empty = impl.hash_blocks(tokens, 4, b"")
    salted = impl.hash_blocks(tokens, 4, b"tenant-a")
    other = impl.hash_blocks(tokens, 4, b"tenant-b")
    for i in range(3):
        assert len({plain[i], empty[i], salted[i], other[i]}) == 4
    assert impl.hash_block(impl.ROOT_HASH, tokens[:4], None) != impl.hash_block(
        impl.ROOT_HASH, tokens[:4], b""
    )
    h1 = impl.hash_block(impl.ROOT_HASH, tokens[:4], b"tenant-a")
    assert salted[:2] == [h1, impl.hash_block(h1, tokens[4:8], b"tenant-a")]


@pytest.mark.parametrize("impl", IMPLS)
def test_token_order_and_boundaries_matter(impl) -> None:
    root = impl.ROOT_HASH
    assert impl.hash_block(root, [1, 2]) != impl.hash_block(root, [2, 1])
    assert impl.hash_block(root, [1, 2]) != impl.hash_block(root, [1, 2, 0])
    assert impl.hash_block(root, [7]) != impl.hash_block(root + 1, [7])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.hash_block(m.ROOT_HASH, [-1]),
        lambda m: m.hash_block(m.ROOT_HASH, [1, 2**32]),
        lambda m: m.hash_block(-1, [1]),
        lambda m: m.hash_block(2**64, [1]),
        lambda m: m.hash_blocks([1, 2, -1, 4], 2),
        lambda m: m.hash_blocks([1, 2, 3, 2**32], 2),
        lambda m: m.hash_blocks([1, 2, 3, 4], 0),
        lambda m: m.hash_blocks([1, 2, 3, 4], -1),
        lambda m: m.hash_blocks([1, 2, 3, 4], 2, parent_hash=-1),
        lambda m: m.hash_blocks([1, 2, 3, 4], 2, parent_hash=2**64),
    ],
    ids=[
        "token-neg",
        "token-2^32",
        "parent-neg",
        "parent-2^64",
        "blocks-token-neg",
        "blocks-token-2^32",
        "block-size-0",
        "block-size-neg",
        "blocks-parent-neg",
        "blocks-parent-2^64",
    ],
)
def test_out_of_range_raises_value_error(impl, call) -> None:
    with pytest.raises(ValueError):
        call(impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_extreme_values_accepted(impl) -> None:
    assert impl.hash_block(2**64 - 1, [0, 2**32 - 1]) == _spec_hash(2**64 - 1, [0, 2**32 - 1], None)
    assert impl.hash_blocks([2**32 - 1] * 2, 1, parent_hash=0) == pyhash.hash_blocks(
        [2**32 - 1] * 2, 1, parent_hash=0
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", NOT_AN_EXTRA_KEY)
def test_extra_key_is_bytes_or_none(impl, kind: str) -> None:
    """The twin once turned any extra key into bytes(x): 5 hashed as five zero bytes, and
    2**33 tried to build 8 GiB of them."""
    bad = NOT_AN_EXTRA_KEY[kind]
    with pytest.raises(TypeError, match="extra_key must be bytes or None, got "):
        impl.hash_block(impl.ROOT_HASH, [1, 2], bad())
    with pytest.raises(TypeError, match="extra_key must be bytes or None, got "):
        impl.hash_blocks([1, 2, 3, 4], 2, bad())


@pytest.mark.parametrize("impl", IMPLS)
def test_extra_key_bytes_subclass_hashes_as_its_bytes(impl) -> None:
    class Salt(bytes):
        pass

    assert impl.hash_block(1, [2], Salt(b"t")) == impl.hash_block(1, [2], b"t")
    assert impl.hash_blocks([1, 2], 1, Salt(b"")) == impl.hash_blocks([1, 2], 1, b"")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", NOT_A_LIST)
def test_token_ids_are_a_list_or_tuple(impl, kind: str) -> None:
    bad = NOT_A_LIST[kind]
    with pytest.raises(TypeError):
        impl.hash_block(impl.ROOT_HASH, bad())
    with pytest.raises(TypeError):
        impl.hash_blocks(bad(), 1)
    assert impl.hash_blocks((0, 1), 1) == impl.hash_blocks([0, 1], 1)
    assert impl.hash_block(impl.ROOT_HASH, (0, 1)) == impl.hash_block(impl.ROOT_HASH, [0, 1])


@pytest.mark.parametrize("impl", IMPLS)
def test_parent_hash_none_is_refused(impl) -> None:
    """Omitted, parent_hash is ROOT_HASH; None is not an int."""
    assert impl.hash_blocks([1, 2], 2) == impl.hash_blocks([1, 2], 2, None, impl.ROOT_HASH)
    with pytest.raises(TypeError):
        impl.hash_blocks([1, 2], 2, None, None)
    with pytest.raises(TypeError):
        impl.hash_blocks([1, 2], 2, parent_hash=None)
    with pytest.raises(TypeError):
        impl.hash_block(None, [1, 2])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda m: m.hash_blocks(b"\x01", 0), TypeError),  # token_ids before block_size
        (lambda m: m.hash_blocks([1, 2**32], 0), ValueError),
        (lambda m: m.hash_blocks([1], 0, 5), ValueError),  # block_size before extra_key
        (lambda m: m.hash_blocks([1], 1, 5, -1), TypeError),  # extra_key before parent_hash
        (lambda m: m.hash_blocks([1], 1, None, -1), ValueError),
        (lambda m: m.hash_block(-1, b"\x01"), ValueError),  # parent_hash first
        (lambda m: m.hash_block(0, [2**32, "x"]), ValueError),  # items in order
        (lambda m: m.hash_block(0, ["x", 2**32]), TypeError),
    ],
)
def test_arguments_are_checked_left_to_right(impl, call, exc) -> None:
    with pytest.raises(exc) as info:
        call(impl)
    assert type(info.value) is exc
