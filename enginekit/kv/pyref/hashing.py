"""Pure-Python twin of the block hashing in ``enginekit._native`` (rust/hash.rs).

XXH64 is implemented from the public algorithm description (Yann Collet's xxHash): five 64-bit
primes, 32-byte stripes consumed by four accumulators, a merge of the accumulators, tail
processing in 8-, 4- and 1-byte pieces, and a final avalanche. All arithmetic is modulo 2**64.

A block's hash is XXH64 (seed 0) of this byte string:

- ``parent_hash`` as 8 bytes little-endian (``ROOT_HASH`` for a sequence's first block);
- ``0x00`` if there is no extra key, else ``0x01``, ``len(extra_key)`` as 4 bytes little-endian
  and the extra key's bytes (so ``None`` and ``b""`` hash differently);
- every token id as 4 bytes little-endian (u32).

This module is slow by design: it is the readable specification the Rust core is tested against.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence

from enginekit.kv.pyref.args import extra_key_arg, int_list, u32_buffer

__all__ = ["ROOT_HASH", "hash_block", "hash_blocks", "xxh64"]

ROOT_HASH = 0x656E67696E656B69
"""Parent hash of a sequence's first block (ASCII ``"engineki"`` read big-endian)."""

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_MAX_TOKEN = 1 << 32

_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _MASK64
    acc = _rotl(acc, 31)
    return (acc * _P1) & _MASK64


def _merge_round(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _MASK64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` with ``seed`` (in [0, 2**64)), as an unsigned 64-bit int."""
    data = bytes(data)
    n = len(data)
    pos = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _MASK64
        v2 = (seed + _P2) & _MASK64
        v3 = seed & _MASK64
        v4 = (seed - _P1) & _MASK64
        limit = n - 32
        while pos <= limit:
            a, b, c, d = struct.unpack_from("<4Q", data, pos)
            v1 = _round(v1, a)
            v2 = _round(v2, b)
            v3 = _round(v3, c)
            v4 = _round(v4, d)
            pos += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK64
        for v in (v1, v2, v3, v4):
            h = _merge_round(h, v)
    else:
        h = (seed + _P5) & _MASK64
    h = (h + n) & _MASK64

    while pos + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, pos)
        h ^= _round(0, lane)
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK64
        pos += 8
    if pos + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, pos)
        h ^= (lane * _P1) & _MASK64
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK64
        pos += 4
    while pos < n:
        h ^= (data[pos] * _P5) & _MASK64
        h = (_rotl(h, 11) * _P1) & _MASK64
        pos += 1

    # Avalanche: every input bit affects every output bit.
    h ^= h >> 33
    h = (h * _P2) & _MASK64
    h ^= h >> 29
    h = (h * _P3) & _MASK64
    h ^= h >> 32
    return h


def _check_parent(parent_hash: int) -> int:
    parent_hash = operator.index(parent_hash)
    if not 0 <= parent_hash <= _MASK64:
        raise ValueError(f"parent_hash {parent_hash} is not in [0, 2**64)")
    return parent_hash


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    def check(t: int) -> int:
        if not 0 <= t < _MAX_TOKEN:
            raise ValueError(f"token id {t} is not in [0, 2**32)")
        return t

    tokens = u32_buffer(token_ids)
    if tokens is None:
        tokens = int_list(token_ids, "token_ids", check)
    return struct.pack(f"<{len(tokens)}I", *tokens)


def _extra_prefix(extra_key: bytes | None) -> bytes:
    extra = extra_key_arg(extra_key)
    if extra is None:
        return b"\x00"
    if len(extra) > _MASK32:
        raise ValueError(f"extra_key is {len(extra)} bytes, more than 2**32 - 1")
    return b"\x01" + struct.pack("<I", len(extra)) + extra


def hash_block(parent_hash: int, token_ids: Sequence[int], extra_key: bytes | None = None) -> int:
    """Chained 64-bit hash of one block: XXH64 of (parent, extra key, tokens) as described above.

    Raises ValueError if parent_hash is not in [0, 2**64) or a token id is not in [0, 2**32);
    TypeError if token_ids is not a list or tuple of ints (or a 1-D buffer of u32, an
    ``array("I")``) or extra_key not bytes or None. Checked in that order.
    """
    parent = _check_parent(parent_hash)
    body = _token_bytes(token_ids)
    return xxh64(struct.pack("<Q", parent) + _extra_prefix(extra_key) + body)


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_key: bytes | None = None,
    parent_hash: int = ROOT_HASH,
) -> list[int]:
    """Chained hashes of every full block of ``token_ids``; a trailing partial block is ignored.

    Block i's parent is block i-1's hash (``parent_hash`` for block 0); every block carries the
    same ``extra_key``. Raises as hash_block (every token is checked, including those of an
    ignored trailing partial block), and ValueError if block_size is not in [1, 2**64);
    checked in the order token_ids, block_size, extra_key, parent_hash.
    """
    body = _token_bytes(token_ids)
    block_size = operator.index(block_size)
    if not 1 <= block_size <= _MASK64:
        raise ValueError(f"block_size must be in [1, 2**64), got {block_size}")
    prefix = _extra_prefix(extra_key)
    parent = _check_parent(parent_hash)
    stride = 4 * block_size
    hashes = []
    for start in range(0, len(body) - stride + 1, stride):
        parent = xxh64(struct.pack("<Q", parent) + prefix + body[start : start + stride])
        hashes.append(parent)
    return hashes
