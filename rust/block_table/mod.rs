//! Block tables: per sequence, logical block i -> physical block id.
//!
//! The tables hold no references themselves: callers incref and free in the [`BlockPool`].
//! `grow` and `cache_blocks` take the pool to handle a whole batch in one call. Every stored
//! block id is at most `i32::MAX`, so any table exports to an int32 buffer.
//!
//! Holes: `release_range` turns entries into holes
//! ([`HOLE`]), for a sliding window that drops blocks a sequence can no longer attend to,
//! possibly keeping attention-sink blocks in front of them; `append_holes` recreates them
//! for a sequence brought back from a swap. A hole keeps its logical slot (the table's length
//! counts it) but references no block. Holes may sit anywhere in a table; each table counts
//! its own, so `num_holes` is O(1). A call that errors changes nothing. The calls that hand
//! blocks back (`remove_sequence`, `release_range`, `fork`) have `_then` forms that show
//! them to a caller's `emit` first (the Python wrapper builds its result list there) and
//! change the tables only if `emit` succeeds.

use std::collections::HashMap;

use crate::error::{cache_err, memory_err, try_collect, try_reserve, try_reserve_map};
use crate::error::{try_to_vec, try_with_capacity, KvError, KvResult, MAX_BLOCK_ID, MAX_TABLE_LEN};
use crate::hash::FastBuild;

/// A released entry: outside the valid ids, shown to Python as -1.
pub const HOLE: u32 = u32::MAX;

/// The entries that are blocks, holes skipped (`Memory` error if the host cannot hold them).
fn held(entries: &[u32]) -> KvResult<Vec<u32>> {
    let mut out = try_with_capacity(entries.len(), "the held block ids")?;
    out.extend(entries.iter().copied().filter(|&b| b != HOLE));
    Ok(out)
}

/// One sequence's table: logical block i -> `entries[i]` (a block id or [`HOLE`]).
/// Invariant: `num_holes` is the number of [`HOLE`] entries.
#[derive(Debug, Clone, Default)]
struct Table {
    entries: Vec<u32>,
    num_holes: usize,
}

impl Table {
    fn of_blocks(block_ids: &[u32]) -> KvResult<Self> {
        Ok(Table {
            entries: try_to_vec(block_ids, "a block table")?,
            num_holes: 0,
        })
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[derive(Debug, Clone)]
pub struct BlockTables {
    block_size: u64,
    tables: HashMap<u64, Table, FastBuild>,
    /// Scratch of `grow`: the batch positions that need blocks, reused across calls.
    growing: Vec<usize>,
}

#[cold]
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
                "block_size must be in [1, 2**64), got {block_size}"
            )));
        }
        Ok(BlockTables {
            block_size,
            tables: HashMap::default(),
            growing: Vec::new(),
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    pub fn num_sequences(&self) -> usize {
        self.tables.len()
    }

    fn table(&self, seq_id: u64) -> KvResult<&Table> {
        match self.tables.get(&seq_id) {
            Some(t) => Ok(t),
            None => unknown(seq_id),
        }
    }

    fn table_mut(&mut self, seq_id: u64) -> KvResult<&mut Table> {
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
        let table = Table::of_blocks(block_ids)?;
        try_reserve_map(&mut self.tables, 1, "the tables")?;
        self.tables.insert(seq_id, table);
        Ok(())
    }

    /// Forgets the sequence; returns its blocks in logical order, holes skipped (the caller
    /// frees them).
    pub fn remove_sequence(&mut self, seq_id: u64) -> KvResult<Vec<u32>> {
        self.remove_sequence_then(seq_id, Ok)
    }

    /// [`remove_sequence`](Self::remove_sequence), its blocks shown to `emit` first: returns
    /// what `emit` returns, and forgets the sequence only if it succeeds.
    pub fn remove_sequence_then<R, E: From<KvError>>(
        &mut self,
        seq_id: u64,
        emit: impl FnOnce(Vec<u32>) -> Result<R, E>,
    ) -> Result<R, E> {
        let r = emit(held(&self.table(seq_id)?.entries)?)?;
        self.tables.remove(&seq_id);
        Ok(r)
    }

    /// Appends existing blocks to the table, in order. The tables hold no references: each
    /// id stands for a reference the caller holds and hands over, which `remove_sequence` or
    /// `release_range` hands back. Errors (`Value`) for a block id above [`MAX_BLOCK_ID`].
    pub fn append_blocks(&mut self, seq_id: u64, block_ids: &[u32]) -> KvResult<()> {
        let t = self.table_mut(seq_id)?;
        check_block_ids(block_ids)?;
        try_reserve(&mut t.entries, block_ids.len(), "the appended entries")?;
        t.entries.extend_from_slice(block_ids);
        Ok(())
    }

    /// Appends `num_holes` holes: logical slots that hold no block (a sequence restored with
    /// the blocks it had released still released). Errors (`Value`) if the table would pass
    /// [`MAX_TABLE_LEN`] entries, (`Memory`) if the host cannot hold them.
    pub fn append_holes(&mut self, seq_id: u64, num_holes: u64) -> KvResult<()> {
        let t = self.table_mut(seq_id)?;
        let len = t.len();
        if num_holes > MAX_TABLE_LEN.saturating_sub(len as u64) {
            return Err(Self::too_many_holes(seq_id, num_holes, len));
        }
        let n = num_holes as usize;
        t.entries
            .try_reserve(n)
            .map_err(|e| memory_err(&format!("{num_holes} holes"), e))?;
        t.entries.resize(len + n, HOLE);
        t.num_holes += n;
        Ok(())
    }

    /// The error of `append_holes` past [`MAX_TABLE_LEN`] (`num_holes` as the caller wrote it).
    pub fn too_many_holes(seq_id: u64, num_holes: impl std::fmt::Display, len: usize) -> KvError {
        KvError::Value(format!(
            "cannot append {num_holes} holes to sequence {seq_id} of {len} blocks: a table \
             holds at most 2**26 entries"
        ))
    }

    /// Makes entries `first .. end` holes; returns the blocks that were there and not holes
    /// yet, in logical order (the caller frees them). Entries already holes are skipped, so
    /// releasing a range again returns nothing. Errors unless `first <= end <= ` the table's
    /// length.
    pub fn release_range(&mut self, seq_id: u64, first: u64, end: u64) -> KvResult<Vec<u32>> {
        self.release_range_then(seq_id, first, end, Ok)
    }

    /// [`release_range`](Self::release_range), the released blocks shown to `emit` first:
    /// returns what `emit` returns, and releases only if it succeeds.
    pub fn release_range_then<R, E: From<KvError>>(
        &mut self,
        seq_id: u64,
        first: u64,
        end: u64,
        emit: impl FnOnce(Vec<u32>) -> Result<R, E>,
    ) -> Result<R, E> {
        let t = self.table_mut(seq_id)?;
        if first > end || end > t.len() as u64 {
            return Err(KvError::Cache(format!(
                "cannot release blocks [{first}, {end}) of sequence {seq_id}: it has {}",
                t.len()
            ))
            .into());
        }
        let range = &mut t.entries[first as usize..end as usize];
        let released = held(range)?;
        let num_released = released.len();
        let r = emit(released)?;
        range.fill(HOLE);
        t.num_holes += num_released;
        Ok(r)
    }

    /// Holes in the table, wherever they are (O(1): each table counts its own).
    pub fn num_holes(&self, seq_id: u64) -> KvResult<usize> {
        Ok(self.table(seq_id)?.num_holes)
    }

    /// The child gets a copy of the parent's table, holes included; returns its blocks, holes
    /// skipped (the caller increfs them).
    pub fn fork(&mut self, parent_id: u64, child_id: u64) -> KvResult<Vec<u32>> {
        self.fork_then(parent_id, child_id, Ok)
    }

    /// [`fork`](Self::fork), the child's blocks shown to `emit` first: returns what `emit`
    /// returns, and forks only if it succeeds.
    pub fn fork_then<R, E: From<KvError>>(
        &mut self,
        parent_id: u64,
        child_id: u64,
        emit: impl FnOnce(Vec<u32>) -> Result<R, E>,
    ) -> Result<R, E> {
        let parent = self.table(parent_id)?;
        if self.tables.contains_key(&child_id) {
            return Err(KvError::Cache(format!(
                "cannot fork sequence {parent_id}: child {child_id} already exists"
            ))
            .into());
        }
        let child = Table {
            entries: try_to_vec(&parent.entries, "a block table")?,
            num_holes: parent.num_holes,
        };
        let blocks = held(&child.entries)?;
        try_reserve_map(&mut self.tables, 1, "the tables")?;
        let r = emit(blocks)?;
        self.tables.insert(child_id, child);
        Ok(r)
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
        if t.entries[index as usize] == HOLE {
            return Err(Self::hole_error(seq_id, index));
        }
        check_block_ids(&[block_id])?;
        Ok(std::mem::replace(&mut t.entries[index as usize], block_id))
    }

    /// The table, holes as [`HOLE`].
    pub fn block_ids(&self, seq_id: u64) -> KvResult<&[u32]> {
        Ok(&self.table(seq_id)?.entries)
    }

    /// The entry at `index`: a block id or [`HOLE`].
    pub fn block_id_at(&self, seq_id: u64, index: u64) -> KvResult<u32> {
        let t = self.table(seq_id)?;
        match t.entries.get(usize::try_from(index).unwrap_or(usize::MAX)) {
            Some(&b) => Ok(b),
            None => Self::index_err(seq_id, index, t.len()),
        }
    }

    /// Logical length: holes count.
    pub fn num_blocks(&self, seq_id: u64) -> KvResult<usize> {
        Ok(self.table(seq_id)?.len())
    }

    /// Every sequence id, ascending (`Memory` error if the host cannot hold them).
    pub fn seq_ids(&self) -> KvResult<Vec<u64>> {
        let mut v = try_collect(self.tables.keys().copied(), "the sequence ids")?;
        v.sort_unstable();
        Ok(v)
    }
}

mod batch;

mod check;

#[cfg(test)]
mod tests;
