//! `BlockTables` operations over a batch of sequences: growth from the pool, publishing
//! blocks to the pool's hash map, and the int32 export of block tables.

use std::cell::Cell;
use std::collections::HashMap;

use super::{held, lengths_match, unknown, BlockTables, HOLE};

/// Most positions the scratch of `grow` keeps room for between calls.
const GROWING_KEPT: usize = 1 << 16;
use crate::block_pool::BlockPool;
use crate::error::{cache_err, try_reserve, try_reserve_map, try_with_capacity};
use crate::error::{KvError, KvResult};
use crate::hash::FastBuild;

impl BlockTables {
    /// Sum over the batch of max(0, ceil(num_tokens / block_size) - num_blocks(seq)); a
    /// sequence listed twice counts twice. Exact: a batch of at most 2**64 entries of at
    /// most 2**64 - 1 blocks each sums below 2**128.
    pub fn num_blocks_to_grow(&self, seq_ids: &[u64], num_tokens: &[u64]) -> KvResult<u128> {
        lengths_match(seq_ids, num_tokens)?;
        let mut total = 0u64;
        for (&s, &n) in seq_ids.iter().zip(num_tokens) {
            let have = self.table(s)?.len() as u64;
            total = total.saturating_add(self.blocks_for_tokens(n).saturating_sub(have));
        }
        if total < u64::MAX {
            return Ok(u128::from(total));
        }
        Ok(self.exact_sum(seq_ids, num_tokens))
    }

    /// `num_blocks_to_grow` of a batch already checked, summed in u128: the loops sum in
    /// u64 (saturating) and come here only past it (a batch no pool can grow).
    fn exact_sum(&self, seq_ids: &[u64], num_tokens: &[u64]) -> u128 {
        seq_ids
            .iter()
            .zip(num_tokens)
            .map(|(s, &n)| {
                let have = self.tables[s].len() as u64;
                u128::from(self.blocks_for_tokens(n).saturating_sub(have))
            })
            .sum()
    }

    /// `num_blocks_to_grow`, also listing in `growing` (cleared first) the batch positions
    /// whose sequence needs blocks, ascending: the rest of the batch needs none. Errors
    /// (`Memory`) if the host cannot hold the positions.
    pub fn positions_to_grow(
        &self,
        seq_ids: &[u64],
        num_tokens: &[u64],
        growing: &mut Vec<usize>,
    ) -> KvResult<u128> {
        growing.clear();
        self.count_growth(seq_ids, num_tokens, |i| {
            if growing.len() == growing.capacity() {
                try_reserve(growing, 1, "the growing positions")?;
            }
            growing.push(i);
            Ok(())
        })
    }

    fn count_growth(
        &self,
        seq_ids: &[u64],
        num_tokens: &[u64],
        mut on_growing: impl FnMut(usize) -> KvResult<()>,
    ) -> KvResult<u128> {
        lengths_match(seq_ids, num_tokens)?;
        let mut total = 0u64;
        for (i, (&s, &n)) in seq_ids.iter().zip(num_tokens).enumerate() {
            let have = self.table(s)?.len() as u64;
            let need = self.blocks_for_tokens(n).saturating_sub(have);
            if need > 0 {
                on_growing(i)?;
                total = total.saturating_add(need);
            }
        }
        if total < u64::MAX {
            return Ok(u128::from(total));
        }
        Ok(self.exact_sum(seq_ids, num_tokens))
    }

    /// Exact blocks `grow` allocates: a sequence listed twice grows to its largest target
    /// once. Errors (`Memory`) if the host cannot hold the batch's targets.
    fn exact_blocks_to_grow(&self, seq_ids: &[u64], num_tokens: &[u64]) -> KvResult<u128> {
        let mut target: HashMap<u64, u64, FastBuild> = HashMap::default();
        try_reserve_map(&mut target, seq_ids.len(), "the batch's targets")?;
        for (&s, &n) in seq_ids.iter().zip(num_tokens) {
            let t = target.entry(s).or_insert(0);
            *t = (*t).max(self.blocks_for_tokens(n));
        }
        Ok(target.iter().fold(0u128, |acc, (s, &t)| {
            acc + u128::from(t.saturating_sub(self.tables[s].len() as u64))
        }))
    }

    /// Allocates from `pool` and appends so that each sequence holds at least
    /// ceil(num_tokens / block_size) blocks, in batch order; returns the number allocated.
    /// All or nothing: the tables' room is reserved while the batch is checked, before any
    /// block is allocated (`Memory` error, nothing grown).
    pub fn grow(
        &mut self,
        pool: &mut BlockPool,
        seq_ids: &[u64],
        num_tokens: &[u64],
    ) -> KvResult<u64> {
        let mut growing = std::mem::take(&mut self.growing);
        let r = self.grow_with_scratch(pool, seq_ids, num_tokens, &mut growing);
        if growing.capacity() <= GROWING_KEPT {
            self.growing = growing;
        }
        r
    }

    fn grow_with_scratch(
        &mut self,
        pool: &mut BlockPool,
        seq_ids: &[u64],
        num_tokens: &[u64],
        growing: &mut Vec<usize>,
    ) -> KvResult<u64> {
        lengths_match(seq_ids, num_tokens)?;
        // Validates every id and finds the positions that need blocks (only those can need
        // any below: tables only grow), reserving each one's room: at most the free blocks,
        // since a batch that needs more is refused below anyway.
        growing.clear();
        let free = pool.num_free_blocks();
        let mut bound = 0u64; // exact unless a sequence is listed twice (saturating)
        for (i, (&s, &n)) in seq_ids.iter().zip(num_tokens).enumerate() {
            let want = self.blocks_for_tokens(n);
            let Some(t) = self.tables.get_mut(&s) else {
                return unknown(s);
            };
            let need = want.saturating_sub(t.len() as u64);
            if need > 0 {
                let room = need.min(u64::from(free)) as usize;
                try_reserve(&mut t.entries, room, "the grown entries")?;
                if growing.len() == growing.capacity() {
                    try_reserve(growing, 1, "the growing positions")?;
                }
                growing.push(i);
                bound = bound.saturating_add(need);
            }
        }
        if bound > u64::from(free) {
            let exact = self.exact_blocks_to_grow(seq_ids, num_tokens)?;
            if exact > u128::from(free) {
                return Err(KvError::OutOfBlocks(format!(
                    "cannot allocate {exact} blocks: only {free} free"
                )));
            }
        }
        let mut total = 0u64;
        for &i in growing.iter() {
            let (s, n) = (seq_ids[i], num_tokens[i]);
            let want = self.blocks_for_tokens(n);
            let t = self
                .tables
                .get_mut(&s)
                .expect("sequence vanished after validation");
            let need = want.saturating_sub(t.len() as u64);
            if need > 0 {
                pool.allocate_into(need, &mut t.entries)
                    .expect("allocation failed after validation");
                total += need;
            }
        }
        Ok(total)
    }

    /// Forgets the sequence and frees its blocks into `pool`, last logical block first (so
    /// that evictable ones leave the pool's LRU order tail first, prefix last), holes
    /// skipped; returns how many: `remove_sequence` and `pool.free` of its blocks reversed.
    /// All or nothing: an unknown sequence, or a block the pool refuses to free (one it
    /// holds no reference on), changes neither.
    pub fn free_sequence(&mut self, pool: &mut BlockPool, seq_id: u64) -> KvResult<u64> {
        let mut block_ids = held(&self.table(seq_id)?.entries)?;
        block_ids.reverse();
        pool.free(&block_ids)?;
        self.tables.remove(&seq_id);
        Ok(block_ids.len() as u64)
    }

    /// `pool.cache_block(block_id_at(seq_id, first_index + i), block_hashes[i])` for each i;
    /// returns how many recorded. The range is checked first; if a `cache_block` errors, the
    /// ones already recorded by this call are undone, so an error changes nothing.
    pub fn cache_blocks(
        &self,
        pool: &mut BlockPool,
        seq_id: u64,
        first_index: u64,
        block_hashes: &[u64],
    ) -> KvResult<usize> {
        let t = self.table(seq_id)?;
        let in_range = match first_index.checked_add(block_hashes.len() as u64) {
            Some(end) => end <= t.len() as u64,
            None => false,
        };
        if !in_range {
            return cache_err(format!(
                "cannot cache {} blocks from index {first_index} of sequence {seq_id}: it has {} blocks",
                block_hashes.len(),
                t.len()
            ));
        }
        let first = first_index as usize;
        let blocks = &t.entries[first..][..block_hashes.len()];
        if let Some(i) = blocks.iter().position(|&b| b == HOLE) {
            return Err(Self::hole_error(seq_id, first_index + i as u64));
        }
        let mut parents = Vec::new();
        if pool.is_recording_accesses() && !blocks.is_empty() {
            // Each block's parent is the one before it: the batch's previous hash, or for
            // the first, the hash the table's block before it carries (if any).
            try_reserve(&mut parents, blocks.len(), "the parents")?;
            let before = first.checked_sub(1).map(|i| t.entries[i]);
            parents.push(before.and_then(|b| pool.hash_of(b)));
            parents.extend(block_hashes[..blocks.len() - 1].iter().map(|&h| Some(h)));
        }
        Self::record_hashes(pool, blocks, block_hashes, &parents)
    }

    /// `pool.cache_block(block_id_at(seq_ids[i], block_indices[i]), block_hashes[i])` for
    /// each i: one block of each of many sequences (a step's decodes that filled one), in
    /// one call; returns how many recorded. Checked first, in order: the three lengths
    /// (Value), then each entry's sequence, index and hole (Cache); if a `cache_block`
    /// errors, the ones already recorded by this call are undone, so an error changes
    /// nothing.
    pub fn cache_blocks_at(
        &self,
        pool: &mut BlockPool,
        seq_ids: &[u64],
        block_indices: &[u64],
        block_hashes: &[u64],
    ) -> KvResult<usize> {
        self.cache_blocks_after(pool, seq_ids, block_indices, block_hashes, &[])
    }

    /// [`cache_blocks_at`](Self::cache_blocks_at), with each block's parent hash for the
    /// pool's access log (`parents[i]`; an empty slice: the hash the table's block before
    /// it carries, if any).
    pub(crate) fn cache_blocks_after(
        &self,
        pool: &mut BlockPool,
        seq_ids: &[u64],
        block_indices: &[u64],
        block_hashes: &[u64],
        parents: &[Option<u64>],
    ) -> KvResult<usize> {
        if seq_ids.len() != block_indices.len() || seq_ids.len() != block_hashes.len() {
            return Err(KvError::Value(format!(
                "seq_ids, block_indices and block_hashes differ in length ({}, {}, {})",
                seq_ids.len(),
                block_indices.len(),
                block_hashes.len()
            )));
        }
        let mut blocks = try_with_capacity(seq_ids.len(), "the blocks to cache")?;
        for (&s, &index) in seq_ids.iter().zip(block_indices) {
            let t = self.table(s)?;
            let b = match usize::try_from(index).ok().and_then(|i| t.entries.get(i)) {
                Some(&b) => b,
                None => return Self::index_err(s, index, t.len()),
            };
            if b == HOLE {
                return Err(Self::hole_error(s, index));
            }
            blocks.push(b);
        }
        let mut table_parents = Vec::new();
        let parents = if parents.is_empty() && pool.is_recording_accesses() {
            try_reserve(&mut table_parents, blocks.len(), "the parents")?;
            for (&s, &index) in seq_ids.iter().zip(block_indices) {
                let before = index
                    .checked_sub(1)
                    .map(|i| self.table(s).map(|t| t.entries[i as usize]));
                table_parents.push(before.transpose()?.and_then(|b| pool.hash_of(b)));
            }
            &table_parents[..]
        } else {
            parents
        };
        Self::record_hashes(pool, &blocks, block_hashes, parents)
    }

    /// `pool.cache_block(blocks[i], block_hashes[i], parents[i])` for each i (a missing
    /// parent is None); returns how many were recorded. If one errors, the ones this call
    /// recorded are undone (each block is recorded at most once: a second `cache_block` on
    /// it returns false or errors), and logged as evicted again. The room for all is
    /// reserved first (`Memory` error, nothing recorded).
    pub(crate) fn record_hashes(
        pool: &mut BlockPool,
        blocks: &[u32],
        block_hashes: &[u64],
        parents: &[Option<u64>],
    ) -> KvResult<usize> {
        let n = blocks.len().min(block_hashes.len());
        let mut recorded: Vec<u32> = try_with_capacity(n, "the recorded blocks")?;
        pool.reserve_hashes(n)?;
        for (i, (&b, &h)) in blocks.iter().zip(block_hashes).enumerate() {
            match pool.cache_block(b, h, parents.get(i).copied().flatten()) {
                Ok(true) => recorded.push(b),
                Ok(false) => {}
                Err(e) => {
                    for &b2 in recorded.iter().rev() {
                        pool.uncache_used(b2);
                    }
                    return Err(e);
                }
            }
        }
        Ok(recorded.len())
    }

    /// The longest table among `seq_ids` (0 for an empty batch).
    pub fn max_num_blocks(&self, seq_ids: &[u64]) -> KvResult<usize> {
        let mut m = 0;
        for &s in seq_ids {
            m = m.max(self.table(s)?.len());
        }
        Ok(m)
    }

    /// Writes the batch's tables row by row (row stride `width`) into `out`, padding each row
    /// with `pad`; a hole is written as `pad` too. Checks everything before writing anything.
    pub fn export_into(
        &self,
        seq_ids: &[u64],
        out: &[Cell<i32>],
        width: usize,
        pad: i32,
    ) -> KvResult<()> {
        let fits = match seq_ids.len().checked_mul(width) {
            Some(n) => n <= out.len(),
            None => false,
        };
        if !fits {
            return Err(KvError::Value(format!(
                "out holds {} int32 items, fewer than {} rows x width {width}",
                out.len(),
                seq_ids.len()
            )));
        }
        for &s in seq_ids {
            let len = self.table(s)?.len();
            if len > width {
                return Err(KvError::Value(format!(
                    "sequence {s} has {len} blocks, more than width {width}"
                )));
            }
        }
        if width == 0 {
            return Ok(());
        }
        for (&s, row) in seq_ids.iter().zip(out.chunks_exact(width)) {
            let t = &self.tables[&s];
            // Ids are <= MAX_BLOCK_ID, so the casts are lossless.
            for (cell, &b) in row.iter().zip(&t.entries) {
                cell.set(if b == HOLE { pad } else { b as i32 });
            }
            for cell in &row[t.len()..] {
                cell.set(pad);
            }
        }
        Ok(())
    }
}
