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
mod tests {
    use super::*;

    fn msg<T: std::fmt::Debug>(r: KvResult<T>) -> String {
        match r {
            Err(KvError::Cache(m)) => m,
            other => panic!("expected KvError::Cache, got {other:?}"),
        }
    }

    fn value_msg<T: std::fmt::Debug>(r: KvResult<T>) -> String {
        match r {
            Err(KvError::Value(m)) => m,
            other => panic!("expected KvError::Value, got {other:?}"),
        }
    }

    fn setup() -> (BlockTables, BlockPool) {
        let mut bt = BlockTables::new(4).unwrap();
        let mut pool = BlockPool::new(10).unwrap();
        let a = pool.allocate(3).unwrap();
        bt.add_sequence(1, &a[..2]).unwrap();
        bt.add_sequence(2, &a[2..]).unwrap();
        bt.add_sequence(3, &[]).unwrap();
        (bt, pool)
    }

    #[test]
    fn new_and_basic_queries() {
        assert!(matches!(BlockTables::new(0), Err(KvError::Value(_))));
        let (bt, pool) = setup();
        assert_eq!(bt.block_size(), 4);
        assert_eq!(bt.num_sequences(), 3);
        assert!(bt.has_sequence(1));
        assert!(!bt.has_sequence(9));
        assert_eq!(bt.block_ids(1).unwrap(), &[0, 1]);
        assert_eq!(bt.block_id_at(1, 1).unwrap(), 1);
        assert_eq!(bt.num_blocks(2).unwrap(), 1);
        assert_eq!(bt.seq_ids(), vec![1, 2, 3]);
        assert_eq!(msg(bt.block_ids(9)), "unknown sequence 9");
        assert_eq!(msg(bt.num_blocks(9)), "unknown sequence 9");
        assert_eq!(
            msg(bt.block_id_at(1, 2)),
            "index 2 out of range for sequence 1 with 2 blocks"
        );
        assert_eq!(msg(bt.block_id_at(9, 0)), "unknown sequence 9");
        assert!(msg(bt.block_id_at(1, u64::MAX)).starts_with("index"));
        bt.check_integrity(Some(&pool)).unwrap();
        bt.check_integrity(None).unwrap();
        assert_eq!(bt.blocks_for_tokens(0), 0);
        assert_eq!(bt.blocks_for_tokens(4), 1);
        assert_eq!(bt.blocks_for_tokens(5), 2);
        assert_eq!(bt.blocks_for_tokens(u64::MAX), u64::MAX / 4 + 1);
    }

    #[test]
    fn add_remove_append() {
        let (mut bt, _) = setup();
        assert_eq!(msg(bt.add_sequence(1, &[])), "sequence 1 already exists");
        assert_eq!(
            value_msg(bt.add_sequence(7, &[1, MAX_BLOCK_ID + 1])),
            "block id 2147483648 is not in [0, 2**31)"
        );
        assert!(!bt.has_sequence(7));
        bt.append_blocks(3, &[7, 8]).unwrap();
        assert_eq!(bt.block_ids(3).unwrap(), &[7, 8]);
        assert!(value_msg(bt.append_blocks(3, &[u32::MAX])).starts_with("block id"));
        assert_eq!(bt.block_ids(3).unwrap(), &[7, 8]);
        assert_eq!(msg(bt.append_blocks(9, &[1])), "unknown sequence 9");
        assert_eq!(bt.remove_sequence(3).unwrap(), vec![7, 8]);
        assert_eq!(msg(bt.remove_sequence(3)), "unknown sequence 3");
        assert_eq!(bt.num_sequences(), 2);
    }

    #[test]
    fn truncate_fork_set_block() {
        let (mut bt, _) = setup();
        bt.append_blocks(1, &[5, 6]).unwrap();
        assert_eq!(
            msg(bt.truncate(1, 5)),
            "cannot truncate sequence 1 to 5 blocks: it has 4"
        );
        assert_eq!(msg(bt.truncate(9, 0)), "unknown sequence 9");
        assert_eq!(bt.truncate(1, 3).unwrap(), vec![6]);
        assert_eq!(bt.truncate(1, 3).unwrap(), Vec::<u32>::new());
        assert_eq!(bt.fork(1, 4).unwrap(), vec![0, 1, 5]);
        assert_eq!(bt.block_ids(4).unwrap(), &[0, 1, 5]);
        assert_eq!(
            msg(bt.fork(1, 2)),
            "cannot fork sequence 1: child 2 already exists"
        );
        assert_eq!(msg(bt.fork(9, 10)), "unknown sequence 9");
        assert!(!bt.has_sequence(10));
        assert_eq!(bt.set_block(4, 2, 9).unwrap(), 5);
        assert_eq!(bt.block_ids(4).unwrap(), &[0, 1, 9]);
        assert_eq!(bt.block_ids(1).unwrap(), &[0, 1, 5]);
        assert_eq!(
            msg(bt.set_block(4, 3, 9)),
            "index 3 out of range for sequence 4 with 3 blocks"
        );
        assert_eq!(msg(bt.set_block(9, 0, 9)), "unknown sequence 9");
        assert!(value_msg(bt.set_block(4, 0, u32::MAX)).starts_with("block id"));
        assert_eq!(bt.block_ids(4).unwrap(), &[0, 1, 9]);
    }

    #[test]
    fn num_blocks_to_grow_counts_batch_literally() {
        let (bt, _) = setup();
        assert_eq!(bt.num_blocks_to_grow(&[1, 2, 3], &[8, 9, 1]).unwrap(), 3);
        assert_eq!(bt.num_blocks_to_grow(&[1, 1], &[12, 12]).unwrap(), 2);
        assert_eq!(bt.num_blocks_to_grow(&[], &[]).unwrap(), 0);
        assert_eq!(bt.num_blocks_to_grow(&[1], &[0]).unwrap(), 0);
        let m = u64::MAX;
        assert_eq!(
            bt.num_blocks_to_grow(&[1, 2], &[m, m]).unwrap(),
            (1 << 63) - 3
        );
        assert_eq!(bt.num_blocks_to_grow(&[1, 2, 3, 3, 3], &[m; 5]).unwrap(), m);
        assert!(value_msg(bt.num_blocks_to_grow(&[1], &[])).contains("differ in length"));
        assert_eq!(
            msg(bt.num_blocks_to_grow(&[1, 9], &[1, 1])),
            "unknown sequence 9"
        );
    }

    #[test]
    fn grow_allocates_in_batch_order() {
        let (mut bt, mut pool) = setup();
        assert_eq!(bt.grow(&mut pool, &[3, 1, 2], &[5, 8, 13]).unwrap(), 5);
        assert_eq!(bt.block_ids(3).unwrap(), &[3, 4]);
        assert_eq!(bt.block_ids(1).unwrap(), &[0, 1]);
        assert_eq!(bt.block_ids(2).unwrap(), &[2, 5, 6, 7]);
        assert_eq!(pool.num_free_blocks(), 2);
        bt.check_integrity(Some(&pool)).unwrap();
        pool.check_integrity().unwrap();
        assert_eq!(bt.grow(&mut pool, &[], &[]).unwrap(), 0);
    }

    #[test]
    fn grow_is_all_or_nothing() {
        let (mut bt, mut pool) = setup();
        let before = (bt.block_ids(1).unwrap().to_vec(), pool.free_block_ids());
        let e = bt.grow(&mut pool, &[1, 3], &[12, 100]).unwrap_err();
        assert_eq!(
            e,
            KvError::OutOfBlocks("cannot allocate 26 blocks: only 7 free".into())
        );
        assert_eq!(
            msg(bt.grow(&mut pool, &[1, 9], &[12, 1])),
            "unknown sequence 9"
        );
        assert!(value_msg(bt.grow(&mut pool, &[1, 3], &[12])).contains("differ"));
        assert!(matches!(
            bt.grow(&mut pool, &[1], &[u64::MAX]),
            Err(KvError::OutOfBlocks(_))
        ));
        assert_eq!(
            (bt.block_ids(1).unwrap().to_vec(), pool.free_block_ids()),
            before
        );
        assert_eq!(bt.block_ids(3).unwrap(), &[] as &[u32]);
    }

    #[test]
    fn grow_with_duplicate_sequence_is_exact() {
        let (mut bt, mut pool) = setup();
        // Sequence 3 listed three times: it needs 7 blocks once, not 5 + 7 + 1.
        assert_eq!(bt.num_blocks_to_grow(&[3, 3, 3], &[20, 28, 4]).unwrap(), 13);
        assert_eq!(bt.grow(&mut pool, &[3, 3, 3], &[20, 28, 4]).unwrap(), 7);
        assert_eq!(bt.num_blocks(3).unwrap(), 7);
        assert_eq!(pool.num_free_blocks(), 0);
        bt.check_integrity(Some(&pool)).unwrap();
        let e = bt.grow(&mut pool, &[3, 3], &[32, 32]).unwrap_err();
        assert_eq!(
            e,
            KvError::OutOfBlocks("cannot allocate 1 blocks: only 0 free".into())
        );
    }

    #[test]
    fn cache_blocks_records_and_rolls_back() {
        let (mut bt, mut pool) = setup();
        bt.grow(&mut pool, &[3], &[16]).unwrap(); // seq 3 -> blocks 3, 4, 5, 6
        assert_eq!(bt.cache_blocks(&mut pool, 3, 1, &[41, 51]).unwrap(), 2);
        assert_eq!(pool.lookup(41), Some(4));
        // Again: already carried -> false; duplicate content in block 0 -> false.
        assert_eq!(bt.cache_blocks(&mut pool, 3, 1, &[41, 51]).unwrap(), 0);
        assert_eq!(bt.cache_blocks(&mut pool, 1, 0, &[41]).unwrap(), 0);
        assert_eq!(bt.cache_blocks(&mut pool, 3, 4, &[]).unwrap(), 0);
        // Range checked first.
        assert_eq!(
            msg(bt.cache_blocks(&mut pool, 3, 3, &[1, 2])),
            "cannot cache 2 blocks from index 3 of sequence 3: it has 4 blocks"
        );
        assert!(msg(bt.cache_blocks(&mut pool, 3, u64::MAX, &[1])).starts_with("cannot cache"));
        assert_eq!(
            msg(bt.cache_blocks(&mut pool, 9, 0, &[1])),
            "unknown sequence 9"
        );
        // Block 6 released -> cache_block on it errors; block 3's record is undone.
        let t = bt.truncate(3, 3).unwrap();
        pool.free(&t).unwrap();
        bt.append_blocks(3, &t).unwrap();
        let before: Vec<_> = {
            let mut c: Vec<_> = pool.cached_blocks().collect();
            c.sort_unstable();
            c
        };
        assert!(
            msg(bt.cache_blocks(&mut pool, 3, 0, &[30, 41, 51, 60])).contains("block 6 is free")
        );
        let mut after: Vec<_> = pool.cached_blocks().collect();
        after.sort_unstable();
        assert_eq!(after, before);
        assert_eq!(pool.block_hash(3).unwrap(), None);
        pool.check_integrity().unwrap();
        // Same block twice with different hashes errors on the second and undoes the first.
        bt.add_sequence(8, &[0, 0]).unwrap();
        assert!(msg(bt.cache_blocks(&mut pool, 8, 0, &[70, 71])).contains("already carries"));
        assert_eq!(pool.lookup(70), None);
        pool.check_integrity().unwrap();
    }

    #[test]
    fn max_num_blocks() {
        let (bt, _) = setup();
        assert_eq!(bt.max_num_blocks(&[]).unwrap(), 0);
        assert_eq!(bt.max_num_blocks(&[2, 1, 3]).unwrap(), 2);
        assert_eq!(msg(bt.max_num_blocks(&[2, 9])), "unknown sequence 9");
    }

    #[test]
    fn export_into_pads_rows() {
        let (bt, _) = setup();
        let mut buf = vec![99i32; 10];
        let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
        bt.export_into(&[2, 1, 3], cells, 3, -1).unwrap();
        assert_eq!(buf, vec![2, -1, -1, 0, 1, -1, -1, -1, -1, 99]);
        let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
        assert!(value_msg(bt.export_into(&[1], cells, 1, 0))
            .contains("sequence 1 has 2 blocks, more than width 1"));
        assert!(value_msg(bt.export_into(&[1, 2, 3, 1], cells, 3, 0)).contains("fewer than"));
        assert!(value_msg(bt.export_into(&[1; 2], cells, usize::MAX, 0)).contains("fewer than"));
        assert_eq!(
            msg(bt.export_into(&[1, 9], cells, 3, 0)),
            "unknown sequence 9"
        );
        bt.export_into(&[3, 3], cells, 0, 0).unwrap();
        bt.export_into(&[], cells, 5, 0).unwrap();
        assert_eq!(buf, vec![2, -1, -1, 0, 1, -1, -1, -1, -1, 99]);
    }

    #[test]
    fn release_front_makes_holes() {
        let (mut bt, mut pool) = setup();
        bt.grow(&mut pool, &[1], &[16]).unwrap(); // seq 1 -> 0, 1, 3, 4
        assert_eq!(bt.num_holes(1).unwrap(), 0);
        assert_eq!(bt.release_front(1, 2).unwrap(), vec![0, 1]);
        pool.free(&[0, 1]).unwrap();
        assert_eq!(bt.block_ids(1).unwrap(), &[HOLE, HOLE, 3, 4]);
        assert_eq!(bt.block_id_at(1, 0).unwrap(), HOLE);
        assert_eq!(
            (bt.num_holes(1).unwrap(), bt.num_blocks(1).unwrap()),
            (2, 4)
        );
        // Already-holes are skipped; 0 and a shorter front change nothing.
        assert_eq!(bt.release_front(1, 1).unwrap(), Vec::<u32>::new());
        assert_eq!(bt.release_front(1, 0).unwrap(), Vec::<u32>::new());
        assert_eq!(bt.release_front(1, 3).unwrap(), vec![3]);
        pool.decref(3).unwrap();
        bt.check_integrity(Some(&pool)).unwrap();
        bt.check_integrity(None).unwrap();
        assert_eq!(
            msg(bt.release_front(1, 5)),
            "cannot release 5 blocks of sequence 1: it has 4"
        );
        assert_eq!(msg(bt.release_front(9, 0)), "unknown sequence 9");
        assert_eq!(msg(bt.num_holes(9)), "unknown sequence 9");
        // Holes keep their slots: growth counts them.
        assert_eq!(bt.num_blocks_to_grow(&[1], &[20]).unwrap(), 1);
        assert_eq!(bt.grow(&mut pool, &[1], &[20]).unwrap(), 1);
        assert_eq!(bt.block_ids(1).unwrap(), &[HOLE, HOLE, HOLE, 4, 3]);
        // Holes refuse set_block and cache_blocks, before anything changes.
        assert_eq!(
            msg(bt.set_block(1, 2, 7)),
            "block 2 of sequence 1 is a hole"
        );
        assert_eq!(
            msg(bt.cache_blocks(&mut pool, 1, 2, &[5, 6])),
            "block 2 of sequence 1 is a hole"
        );
        assert_eq!(bt.cache_blocks(&mut pool, 1, 3, &[5, 6]).unwrap(), 2);
        assert_eq!(bt.set_block(1, 4, 1).unwrap(), 3);
        // Export writes holes as pad.
        let mut buf = vec![9i32; 6];
        let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
        bt.export_into(&[1], cells, 6, -7).unwrap();
        assert_eq!(buf, vec![-7, -7, -7, 4, 1, -7]);
        // Fork copies holes and returns only blocks; truncate and remove skip holes.
        assert_eq!(bt.fork(1, 5).unwrap(), vec![4, 1]);
        assert_eq!(bt.block_ids(5).unwrap(), &[HOLE, HOLE, HOLE, 4, 1]);
        assert_eq!(bt.truncate(5, 4).unwrap(), vec![1]);
        assert_eq!(bt.truncate(5, 1).unwrap(), vec![4]);
        assert_eq!(bt.remove_sequence(5).unwrap(), Vec::<u32>::new());
        assert_eq!(bt.remove_sequence(1).unwrap(), vec![4, 1]);
        // A hole after a block breaks integrity.
        bt.add_sequence(6, &[2]).unwrap();
        bt.tables.get_mut(&6).unwrap().push(HOLE);
        assert!(msg(bt.check_integrity(None)).contains("hole after a block"));
    }

    #[test]
    fn integrity_against_pool() {
        let (mut bt, pool) = setup();
        bt.check_integrity(Some(&pool)).unwrap();
        bt.append_blocks(3, &[9]).unwrap();
        assert_eq!(
            msg(bt.check_integrity(Some(&pool))),
            "block tables integrity: sequence 3 block 0 holds block 9 with ref_count 0"
        );
        bt.set_block(3, 0, 10).unwrap();
        assert!(msg(bt.check_integrity(Some(&pool))).contains("outside the pool of 10 blocks"));
        bt.check_integrity(None).unwrap();
        bt.tables.get_mut(&3).unwrap()[0] = MAX_BLOCK_ID + 1;
        assert!(msg(bt.check_integrity(None)).contains("invalid id"));
        pool.check_integrity().unwrap();
    }
}
