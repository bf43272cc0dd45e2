//! Chained 64-bit block hashes for the prefix cache, and the fast hasher of the id maps.
//!
//! # Block hash specification (stable across versions and platforms)
//!
//! `hash_block(parent_hash, token_ids, extra_key)` is XXH64 with seed 0 over the byte string
//!
//! 1. `parent_hash` as 8 bytes, little-endian;
//! 2. `0x00` if there is no extra key, or `0x01` followed by `len(extra_key)` as 4 bytes
//!    little-endian (u32) and then the extra key's bytes;
//! 3. every token id as 4 bytes, little-endian (u32), in order.
//!
//! The first block of a sequence has parent [`ROOT_HASH`]; `hash_blocks` chains the full blocks
//! of a token list (block `i`'s parent is block `i - 1`'s hash, the extra key goes into every
//! block) and ignores a trailing partial block.

use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh64::xxh64;

use crate::error::{try_with_capacity, KvResult};

/// Parent hash of a sequence's first block: the ASCII bytes "engineki" read big-endian.
pub const ROOT_HASH: u64 = 0x656e_6769_6e65_6b69;

/// Bytes of the spec's byte string for a block of `num_tokens` tokens (saturating: a size
/// no host can hold fails its reservation).
fn encoded_len(num_tokens: usize, extra_key: Option<&[u8]>) -> usize {
    13usize
        .saturating_add(extra_key.map_or(0, <[u8]>::len))
        .saturating_add(num_tokens.saturating_mul(4))
}

/// Writes the spec's byte string for one block into `buf` (cleared first); `buf` has room
/// for it (`encoded_len`), so nothing is allocated here.
///
/// Panics if `extra_key` is longer than `u32::MAX` bytes; callers validate that first.
fn encode_block(buf: &mut Vec<u8>, parent_hash: u64, token_ids: &[u32], extra_key: Option<&[u8]>) {
    buf.clear();
    buf.extend_from_slice(&parent_hash.to_le_bytes());
    match extra_key {
        None => buf.push(0),
        Some(extra) => {
            let len = u32::try_from(extra.len()).expect("extra key longer than u32::MAX bytes");
            buf.push(1);
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(extra);
        }
    }
    // Sized once and filled in place: a loop the compiler vectorizes, where pushing each
    // token's bytes checks the capacity every time.
    let start = buf.len();
    buf.resize(start + token_ids.len() * 4, 0);
    for (bytes, &t) in buf[start..].chunks_exact_mut(4).zip(token_ids) {
        bytes.copy_from_slice(&t.to_le_bytes());
    }
}

/// Hash of one block; see the module docs for the exact byte string. Errors (`Memory`) if
/// the host cannot hold that byte string.
pub fn hash_block(parent_hash: u64, token_ids: &[u32], extra_key: Option<&[u8]>) -> KvResult<u64> {
    let mut buf = try_with_capacity(encoded_len(token_ids.len(), extra_key), "a block's bytes")?;
    encode_block(&mut buf, parent_hash, token_ids, extra_key);
    Ok(xxh64(&buf, 0))
}

/// Chained hashes of every full block of `token_ids`, the first chained to `parent_hash`.
/// Errors (`Memory`) if the host cannot hold the hashes or one block's byte string.
///
/// Panics if `block_size == 0` (callers validate).
pub fn hash_blocks(
    token_ids: &[u32],
    block_size: usize,
    extra_key: Option<&[u8]>,
    parent_hash: u64,
) -> KvResult<Vec<u64>> {
    assert!(block_size > 0, "block_size must be >= 1");
    let num_blocks = token_ids.len() / block_size;
    let mut out = try_with_capacity(num_blocks, "the block hashes")?;
    if num_blocks == 0 {
        return Ok(out);
    }
    let mut buf = try_with_capacity(encoded_len(block_size, extra_key), "a block's bytes")?;
    let mut parent = parent_hash;
    for block in token_ids.chunks_exact(block_size) {
        encode_block(&mut buf, parent, block, extra_key);
        parent = xxh64(&buf, 0);
        out.push(parent);
    }
    Ok(out)
}

/// Hasher for maps keyed by a single `u64` (sequence ids, block hashes): one multiply-xorshift
/// finalizer, much cheaper than SipHash. Not DoS resistant; keys come from the engine itself.
#[derive(Default, Clone, Copy)]
pub struct U64Hasher(u64);

const MIX: u64 = 0xff51_afd7_ed55_8ccd;

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(MIX);
        x ^ (x >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(29) ^ n;
    }
}

/// `BuildHasher` for [`U64Hasher`].
pub type FastBuild = BuildHasherDefault<U64Hasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn root_hash_value() {
        assert_eq!(ROOT_HASH, 0x656e67696e656b69);
    }

    #[test]
    fn encoding_matches_spec() {
        let mut buf = Vec::new();
        encode_block(&mut buf, 0x0102_0304_0506_0708, &[1, 0x0a0b_0c0d], None);
        assert_eq!(
            buf,
            [8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 0, 0, 0, 0x0d, 0x0c, 0x0b, 0x0a]
        );
        encode_block(&mut buf, 0, &[2], Some(b"ab"));
        assert_eq!(
            buf,
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, b'a', b'b', 2, 0, 0, 0]
        );
        // An empty extra key is distinct from no extra key.
        encode_block(&mut buf, 0, &[], Some(b""));
        assert_eq!(buf, [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
    }

    /// Pinned known answers: these must never change (the Python twin tests the same values).
    #[test]
    fn known_answers() {
        assert_eq!(
            hash_block(ROOT_HASH, &[], None).unwrap(),
            0x174a_387a_b285_b83f
        );
        assert_eq!(
            hash_block(ROOT_HASH, &[1, 2, 3, 4], None).unwrap(),
            0xdfba_5463_1c0c_ae29
        );
        assert_eq!(
            hash_block(ROOT_HASH, &[1, 2, 3, 4], Some(b"tenant-a")).unwrap(),
            0xb529_f0a1_c5d6_2336
        );
        assert_eq!(
            hash_block(0, &[0, 4_294_967_295], None).unwrap(),
            0x9f37_50ea_d32d_4055
        );
        assert_eq!(
            hash_blocks(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, None, ROOT_HASH).unwrap(),
            vec![0xdfba_5463_1c0c_ae29, 0xe4b2_d1b2_343a_51f5]
        );
    }

    #[test]
    fn xxh64_reference_vector() {
        // Sanity check of the underlying XXH64 (official test vector for empty input, seed 0).
        assert_eq!(xxh64(b"", 0), 0xef46_db37_51d8_e999);
    }

    #[test]
    fn chaining_and_partial_blocks() {
        let tokens: Vec<u32> = (0..10).collect();
        let hs = hash_blocks(&tokens, 3, Some(b"x"), ROOT_HASH).unwrap();
        assert_eq!(hs.len(), 3);
        assert_eq!(
            hs[0],
            hash_block(ROOT_HASH, &tokens[0..3], Some(b"x")).unwrap()
        );
        assert_eq!(hs[1], hash_block(hs[0], &tokens[3..6], Some(b"x")).unwrap());
        assert_eq!(hs[2], hash_block(hs[1], &tokens[6..9], Some(b"x")).unwrap());
        assert!(hash_blocks(&tokens, 11, None, ROOT_HASH)
            .unwrap()
            .is_empty());
        assert!(hash_blocks(&[], 1, None, ROOT_HASH).unwrap().is_empty());
        assert_eq!(
            hash_blocks(&tokens, 5, None, 7).unwrap()[0],
            hash_block(7, &tokens[..5], None).unwrap()
        );
    }

    #[test]
    fn inputs_are_distinguished() {
        let a = hash_block(ROOT_HASH, &[1, 2], None).unwrap();
        assert_ne!(a, hash_block(ROOT_HASH, &[2, 1], None).unwrap());
        assert_ne!(a, hash_block(ROOT_HASH + 1, &[1, 2], None).unwrap());
        assert_ne!(a, hash_block(ROOT_HASH, &[1, 2], Some(b"")).unwrap());
        assert_ne!(
            hash_block(ROOT_HASH, &[1, 2], Some(b"a")).unwrap(),
            hash_block(ROOT_HASH, &[1, 2], Some(b"b")).unwrap()
        );
    }

    #[test]
    fn hashes_the_host_cannot_hold_are_memory_errors() {
        use crate::error::test_alloc::with_alloc_limit;
        use crate::error::KvError;
        let tokens = vec![1u32; 1 << 20]; // 4 MiB as one block's bytes, 8 MiB of hashes
        with_alloc_limit(1 << 20, || {
            assert!(matches!(
                hash_block(ROOT_HASH, &tokens, None),
                Err(KvError::Memory(_))
            ));
            assert!(matches!(
                hash_blocks(&tokens, 1, None, ROOT_HASH),
                Err(KvError::Memory(_))
            ));
            assert!(matches!(
                hash_blocks(&tokens, 1 << 20, None, ROOT_HASH),
                Err(KvError::Memory(_))
            ));
            assert_eq!(
                hash_blocks(&tokens, 1 << 10, None, 0).unwrap().len(),
                1 << 10
            );
        });
    }

    #[test]
    #[should_panic(expected = "block_size")]
    fn zero_block_size_panics() {
        hash_blocks(&[1], 0, None, ROOT_HASH).unwrap();
    }

    #[test]
    fn fast_hasher_works_in_map() {
        let mut m: HashMap<u64, u32, FastBuild> = HashMap::default();
        for i in 0..1000u64 {
            m.insert(i << 20, i as u32);
        }
        for i in 0..1000u64 {
            assert_eq!(m[&(i << 20)], i as u32);
        }
        let mut h = U64Hasher::default();
        h.write(b"abc");
        let x = h.finish();
        let mut h2 = U64Hasher::default();
        h2.write(b"abd");
        assert_ne!(x, h2.finish());
    }
}
