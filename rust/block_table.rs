//! Block tables: per sequence, logical block i -> physical block id.
//!
//! The tables hold no references themselves: callers incref/decref in the [`BlockPool`].
//! `grow` and `cache_blocks` take the pool to handle a whole batch in one call. Every stored
//! block id is at most `i32::MAX`, so any table exports to an int32 buffer.
//!
//! Holes: `release_front` turns leading entries into holes ([`HOLE`]), for a sliding window
//! that drops blocks a sequence can no longer attend to. A hole keeps its logical slot (the
//! table's length counts it) but references no block; holes always form a prefix of a table.
//! A call that errors changes nothing.

use std::cell::Cell;
use std::collections::HashMap;

use crate::block_pool::{cache_err, BlockPool, KvError, KvResult};
use crate::hash::FastBuild;

/// Largest block id a table accepts (ids must fit an int32 export).
pub const MAX_BLOCK_ID: u32 = i32::MAX as u32;

/// A released entry: outside the valid ids, shown to Python as -1.
pub const HOLE: u32 = u32::MAX;

/// The entries that are blocks, holes skipped.
fn held(entries: &[u32]) -> Vec<u32> {
    entries.iter().copied().filter(|&b| b != HOLE).collect()
}

#[derive(Debug, Clone)]
pub struct BlockTables {
    block_size: u64,
    tables: HashMap<u64, Vec<u32>, FastBuild>,
}

fn unknown<T>(seq_id: u64) -> KvResult<T> {
    cache_err(format!("unknown sequence {seq_id}"))
}

fn check_block_ids(block_ids: &[u32]) -> KvResult<()> {
    match block_ids.iter().find(|&&b| b > MAX_BLOCK_ID) {
        Some(b) => Err(KvError::Value(format!("block id {b} is not in [0, 2**31)"))),
        None => Ok(()),
    }
}

fn lengths_match(seq_ids: &[u64], num_tokens: &[u64]) -> KvResult<()> {
    if seq_ids.len() == num_tokens.len() {
        Ok(())
    } else {
        Err(KvError::Value(format!(
            "seq_ids and num_tokens differ in length ({} != {})",
            seq_ids.len(),
            num_tokens.len()
        )))
    }
}

impl BlockTables {
    pub fn new(block_size: u64) -> KvResult<Self> {
        if block_size < 1 {
            return Err(KvError::Value(format!(
                "block_size must be >= 1, got {block_size}"
            )));
        }
        Ok(BlockTables {
            block_size,
            tables: HashMap::default(),
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    pub fn num_sequences(&self) -> usize {
        self.tables.len()
    }

    pub fn has_sequence(&self, seq_id: u64) -> bool {
        self.tables.contains_key(&seq_id)
    }

    fn table(&self, seq_id: u64) -> KvResult<&Vec<u32>> {
        match self.tables.get(&seq_id) {
            Some(t) => Ok(t),
            None => unknown(seq_id),
        }
    }

    fn table_mut(&mut self, seq_id: u64) -> KvResult<&mut Vec<u32>> {
        match self.tables.get_mut(&seq_id) {
            Some(t) => Ok(t),
            None => unknown(seq_id),
        }
    }

    /// Blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size).
    pub fn blocks_for_tokens(&self, num_tokens: u64) -> u64 {
        num_tokens / self.block_size + u64::from(num_tokens % self.block_size != 0)
    }

    pub fn add_sequence(&mut self, seq_id: u64, block_ids: &[u32]) -> KvResult<()> {
        if self.tables.contains_key(&seq_id) {
            return cache_err(format!("sequence {seq_id} already exists"));
        }
        check_block_ids(block_ids)?;
        self.tables.insert(seq_id, block_ids.to_vec());
        Ok(())
    }

    /// Forgets the sequence; returns its blocks in logical order, holes skipped (the caller
    /// frees them).
    pub fn remove_sequence(&mut self, seq_id: u64) -> KvResult<Vec<u32>> {
        match self.tables.remove(&seq_id) {
            Some(t) => Ok(held(&t)),
            None => unknown(seq_id),
        }
    }

    pub fn append_blocks(&mut self, seq_id: u64, block_ids: &[u32]) -> KvResult<()> {
        let t = self.table_mut(seq_id)?;
        check_block_ids(block_ids)?;
        t.extend_from_slice(block_ids);
        Ok(())
    }

    /// Keeps the first `num_blocks` entries; returns the removed blocks in logical order, holes
    /// skipped.
    pub fn truncate(&mut self, seq_id: u64, num_blocks: u64) -> KvResult<Vec<u32>> {
        let t = self.table_mut(seq_id)?;
        if num_blocks > t.len() as u64 {
            return cache_err(format!(
                "cannot truncate sequence {seq_id} to {num_blocks} blocks: it has {}",
                t.len()
            ));
        }
        Ok(held(&t.split_off(num_blocks as usize)))
    }

    /// Makes the first `num_blocks` entries holes; returns the blocks that were there and not
    /// holes yet, in logical order (the caller frees them).
    pub fn release_front(&mut self, seq_id: u64, num_blocks: u64) -> KvResult<Vec<u32>> {
        let t = self.table_mut(seq_id)?;
        if num_blocks > t.len() as u64 {
            return cache_err(format!(
                "cannot release {num_blocks} blocks of sequence {seq_id}: it has {}",
                t.len()
            ));
        }
        let front = &mut t[..num_blocks as usize];
        let released = held(front);
        front.fill(HOLE);
        Ok(released)
    }

    /// Holes at the front of the table.
    pub fn num_holes(&self, seq_id: u64) -> KvResult<usize> {
        Ok(self
            .table(seq_id)?
            .iter()
            .take_while(|&&b| b == HOLE)
            .count())
    }

    /// The child gets a copy of the parent's table, holes included; returns its blocks, holes
    /// skipped (the caller increfs them).
    pub fn fork(&mut self, parent_id: u64, child_id: u64) -> KvResult<Vec<u32>> {
        let t = self.table(parent_id)?.clone();
        if self.tables.contains_key(&child_id) {
            return cache_err(format!(
                "cannot fork sequence {parent_id}: child {child_id} already exists"
            ));
        }
        let blocks = held(&t);
        self.tables.insert(child_id, t);
        Ok(blocks)
    }

    /// The error of a call that needs a block where the table has a hole.
    pub fn hole_error(seq_id: u64, index: u64) -> KvError {
        KvError::Cache(format!("block {index} of sequence {seq_id} is a hole"))
    }

    fn index_err<T>(seq_id: u64, index: u64, len: usize) -> KvResult<T> {
        cache_err(format!(
            "index {index} out of range for sequence {seq_id} with {len} blocks"
        ))
    }

    /// Replaces logical block `index` (copy-on-write); returns the old block id. A hole cannot
    /// be replaced.
    pub fn set_block(&mut self, seq_id: u64, index: u64, block_id: u32) -> KvResult<u32> {
        let t = self.table_mut(seq_id)?;
        if index >= t.len() as u64 {
            return Self::index_err(seq_id, index, t.len());
        }
        if t[index as usize] == HOLE {
            return Err(Self::hole_error(seq_id, index));
        }
        check_block_ids(&[block_id])?;
        Ok(std::mem::replace(&mut t[index as usize], block_id))
    }

    /// The table, holes as [`HOLE`].
    pub fn block_ids(&self, seq_id: u64) -> KvResult<&[u32]> {
        Ok(self.table(seq_id)?)
    }

    /// The entry at `index`: a block id or [`HOLE`].
    pub fn block_id_at(&self, seq_id: u64, index: u64) -> KvResult<u32> {
        let t = self.table(seq_id)?;
        match t.get(usize::try_from(index).unwrap_or(usize::MAX)) {
            Some(&b) => Ok(b),
            None => Self::index_err(seq_id, index, t.len()),
        }
    }

    /// Logical length: holes count.
    pub fn num_blocks(&self, seq_id: u64) -> KvResult<usize> {
        Ok(self.table(seq_id)?.len())
    }

    /// Sum over the batch of max(0, ceil(num_tokens / block_size) - num_blocks(seq)); a
    /// sequence listed twice counts twice (saturating at u64::MAX).
    pub fn num_blocks_to_grow(&self, seq_ids: &[u64], num_tokens: &[u64]) -> KvResult<u64> {
        lengths_match(seq_ids, num_tokens)?;
        let mut total = 0u64;
        for (&s, &n) in seq_ids.iter().zip(num_tokens) {
            let have = self.table(s)?.len() as u64;
            total = total.saturating_add(self.blocks_for_tokens(n).saturating_sub(have));
        }
        Ok(total)
    }

    /// Exact blocks `grow` allocates: a sequence listed twice grows to its largest target once.
    fn exact_blocks_to_grow(&self, seq_ids: &[u64], num_tokens: &[u64]) -> u64 {
        let mut target: HashMap<u64, u64, FastBuild> = HashMap::default();
        for (&s, &n) in seq_ids.iter().zip(num_tokens) {
            let t = target.entry(s).or_insert(0);
            *t = (*t).max(self.blocks_for_tokens(n));
        }
        target.iter().fold(0u64, |acc, (s, &t)| {
            acc.saturating_add(t.saturating_sub(self.tables[s].len() as u64))
        })
    }

    /// Allocates from `pool` and appends so that each sequence holds at least
    /// ceil(num_tokens / block_size) blocks, in batch order; returns the number allocated.
    /// All or nothing.
    pub fn grow(
        &mut self,
        pool: &mut BlockPool,
        seq_ids: &[u64],
        num_tokens: &[u64],
    ) -> KvResult<u64> {
        // Upper bound (exact unless a sequence is listed twice); validates every id.
        let bound = self.num_blocks_to_grow(seq_ids, num_tokens)?;
        let free = u64::from(pool.num_free_blocks());
        if bound > free {
            let exact = self.exact_blocks_to_grow(seq_ids, num_tokens);
            if exact > free {
                return Err(KvError::OutOfBlocks(format!(
                    "cannot allocate {exact} blocks: only {free} free"
                )));
            }
        }
        let mut total = 0u64;
        for (&s, &n) in seq_ids.iter().zip(num_tokens) {
            let want = self.blocks_for_tokens(n);
            let t = self
                .tables
                .get_mut(&s)
                .expect("sequence vanished after validation");
            let need = want.saturating_sub(t.len() as u64);
            if need > 0 {
                pool.allocate_into(need, t)
                    .expect("allocation failed after validation");
                total += need;
            }
        }
        Ok(total)
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
        let blocks = &t[first_index as usize..][..block_hashes.len()];
        if let Some(i) = blocks.iter().position(|&b| b == HOLE) {
            return Err(Self::hole_error(seq_id, first_index + i as u64));
        }
        // Blocks recorded by this call, to undo on error. Each block is recorded at most once:
        // a second cache_block on it returns false or errors.
        let mut recorded: Vec<u32> = Vec::new();
        for (&b, &h) in blocks.iter().zip(block_hashes) {
            match pool.cache_block(b, h) {
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
            for (cell, &b) in row.iter().zip(t) {
                cell.set(if b == HOLE { pad } else { b as i32 });
            }
            for cell in &row[t.len()..] {
                cell.set(pad);
            }
        }
        Ok(())
    }

    /// Every sequence id, ascending.
    pub fn seq_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.tables.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Every held id is inside the pool with ref_count > 0; without a pool, only that ids are
    /// valid table entries (non-negative as int32). Holes are skipped but must form a prefix.
    pub fn check_integrity(&self, pool: Option<&BlockPool>) -> KvResult<()> {
        for s in self.seq_ids() {
            let t = &self.tables[&s];
            let holes = t.iter().take_while(|&&b| b == HOLE).count();
            for (i, &b) in t.iter().enumerate().skip(holes) {
                if b == HOLE {
                    return cache_err(format!(
                        "block tables integrity: sequence {s} block {i} is a hole after a block"
                    ));
                }
                if b > MAX_BLOCK_ID {
                    return cache_err(format!(
                        "block tables integrity: sequence {s} block {i} holds invalid id {b}"
                    ));
                }
                if let Some(p) = pool {
                    match p.ref_count(b) {
                        Err(_) => {
                            return cache_err(format!(
                                "block tables integrity: sequence {s} block {i} holds id {b}, outside the pool of {} blocks",
                                p.num_blocks()
                            ))
                        }
                        Ok(0) => {
                            return cache_err(format!(
                                "block tables integrity: sequence {s} block {i} holds block {b} with ref_count 0"
                            ))
                        }
                        Ok(_) => {}
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "block_table_tests.rs"]
mod tests;
