//! The block pool: a fixed set of KV blocks with reference counts, a free stack, an LRU list of
//! evictable (cached, unreferenced) blocks and a block-hash -> block map.
//!
//! Every block is in exactly one state:
//! - used: `ref_count > 0` (it may also carry a hash, i.e. be cached);
//! - evictable: `ref_count == 0` and cached; linked into the LRU list (head = least recently
//!   released);
//! - free: `ref_count == 0` and not cached; on the free stack (top = next allocated).
//!
//! Every mutating method validates fully before it mutates: a call that errors changes nothing.
//!
//! While [`record_accesses`](BlockPool::record_accesses) is on, the pool also logs every
//! access an eviction policy may want to hear, in the order they happen (see [`Access`]);
//! off (the default), the log costs one untaken branch per access.
//! The calls that hand ids out (`allocate`, `allocate_run`, `evict_lru`) have `_then` forms
//! that show the ids to a caller's `emit` first (the Python wrapper builds its result list
//! there) and change the pool only if `emit` succeeds.

use std::collections::HashMap;
use std::iter::{Copied, Rev};
use std::ops::Range;
use std::slice::Iter;

use crate::error::{
    cache_err, memory_err, try_collect, try_filled, try_reserve_map, try_with_capacity,
};
use crate::error::{KvError, KvResult, MAX_BLOCKS};
use crate::hash::FastBuild;

/// "No block" in the LRU links.
const NIL: u32 = u32::MAX;

/// Free block ids in the order `allocate` hands them out.
pub type FreeIds<'a> = Copied<Rev<Iter<'a, u32>>>;

/// Evictable block ids, least recently released first (see [`BlockPool::evictable_ids`]).
pub struct LruIds<'a> {
    next: &'a [u32],
    block: u32,
    left: usize,
}

impl Iterator for LruIds<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.left == 0 || self.block == NIL {
            return None;
        }
        let b = self.block;
        self.block = self.next[b as usize];
        self.left -= 1;
        Some(b)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for LruIds<'_> {}

/// What happened to a cached block (see [`Access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AccessKind {
    /// A used block was cached: it now carries `content`, chained to `parent`.
    Insert = 0,
    /// A cached block gained a reference (a prefix hit, or a fork sharing it).
    Hit = 1,
    /// A cached block lost its last reference: it became evictable.
    Release = 2,
    /// An evictable block was evicted, or a just-cached block uncached again (a batch
    /// rolled back): it is no longer cached.
    Evict = 3,
}

/// One logged access: `kind` of `block`, which carries `content` (its hash); for an
/// insertion, `parent` is the hash of the block before it in its sequence (None: the
/// first block, or a parent that carried no hash when it was published).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub kind: AccessKind,
    pub block: u32,
    pub content: u64,
    pub parent: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_count: Vec<u32>,
    /// The hash each block carries; mirrors `cached`.
    hash: Vec<Option<u64>>,
    /// hash -> the block carrying it.
    cached: HashMap<u64, u32, FastBuild>,
    /// LRU links of evictable blocks; `NIL` for blocks not in the list.
    prev: Vec<u32>,
    next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    num_evictable: u32,
    /// Free stack: the last element is allocated next.
    free: Vec<u32>,
    /// The accesses logged since the last `take_accesses`; None while not recording.
    accesses: Option<Vec<Access>>,
}

impl Access {
    fn new(kind: AccessKind, block: u32, content: u64, parent: Option<u64>) -> Self {
        Access {
            kind,
            block,
            content,
            parent,
        }
    }
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks handing out 0, 1, 2, ... in that order. Errors
    /// (`Value`) outside [1, [`MAX_BLOCKS`]], (`Memory`) if the host cannot hold it.
    pub fn new(num_blocks: u32) -> KvResult<Self> {
        if !(1..=MAX_BLOCKS).contains(&num_blocks) {
            return Err(Self::bad_size(num_blocks));
        }
        let n = num_blocks as usize;
        let what = format!("a pool of {num_blocks} blocks");
        let mut free = Vec::new();
        free.try_reserve_exact(n)
            .map_err(|e| memory_err(&what, e))?;
        free.extend((0..num_blocks).rev());
        Ok(BlockPool {
            ref_count: try_filled(n, 0, &what)?,
            hash: try_filled(n, None, &what)?,
            cached: HashMap::default(),
            prev: try_filled(n, NIL, &what)?,
            next: try_filled(n, NIL, &what)?,
            lru_head: NIL,
            lru_tail: NIL,
            num_evictable: 0,
            free,
            accesses: None,
        })
    }

    /// The error of a pool size outside [1, [`MAX_BLOCKS`]] (`num_blocks` as the caller wrote
    /// it).
    pub fn bad_size(num_blocks: impl std::fmt::Display) -> KvError {
        KvError::Value(format!(
            "num_blocks must be in [1, 2**26], got {num_blocks}"
        ))
    }

    pub fn num_blocks(&self) -> u32 {
        self.ref_count.len() as u32
    }

    /// Blocks allocatable without eviction.
    pub fn num_free_blocks(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn num_evictable_blocks(&self) -> u32 {
        self.num_evictable
    }

    pub fn num_used_blocks(&self) -> u32 {
        self.num_blocks() - self.num_free_blocks() - self.num_evictable
    }

    fn check_id(&self, block_id: u32) -> KvResult<usize> {
        if (block_id as usize) < self.ref_count.len() {
            Ok(block_id as usize)
        } else {
            cache_err(format!(
                "unknown block {block_id} (pool has {} blocks)",
                self.ref_count.len()
            ))
        }
    }

    fn is_evictable(&self, b: usize) -> bool {
        self.ref_count[b] == 0 && self.hash[b].is_some()
    }

    fn state_name(&self, b: usize) -> &'static str {
        match (self.ref_count[b], self.hash[b]) {
            (0, None) => "free",
            (0, Some(_)) => "evictable",
            _ => "used",
        }
    }

    fn lru_unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.lru_head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.lru_tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.num_evictable -= 1;
    }

    fn lru_push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.lru_tail;
        self.next[b as usize] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = b;
        } else {
            self.next[self.lru_tail as usize] = b;
        }
        self.lru_tail = b;
        self.num_evictable += 1;
    }

    fn out_of_blocks(&self, num_blocks: u64) -> KvError {
        KvError::OutOfBlocks(format!(
            "cannot allocate {num_blocks} blocks: only {} free",
            self.free.len()
        ))
    }

    /// Pops `num_blocks` blocks off the free stack (never evicts); each gets ref_count 1.
    pub fn allocate(&mut self, num_blocks: u64) -> KvResult<Vec<u32>> {
        self.allocate_then(num_blocks, |ids| try_collect(ids, "block ids"))
    }

    /// [`allocate`](Self::allocate), the ids it hands out shown to `emit` first, in order:
    /// returns what `emit` returns, and allocates only if it succeeds (an error of `emit`,
    /// or `OutOfBlocks`, changes nothing).
    pub fn allocate_then<R, E: From<KvError>>(
        &mut self,
        num_blocks: u64,
        emit: impl FnOnce(FreeIds<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        if num_blocks > self.free.len() as u64 {
            return Err(self.out_of_blocks(num_blocks).into());
        }
        let start = self.free.len() - num_blocks as usize;
        let r = emit(self.free[start..].iter().rev().copied())?;
        for &b in &self.free[start..] {
            self.ref_count[b as usize] = 1;
        }
        self.free.truncate(start);
        Ok(r)
    }

    /// As [`allocate`](Self::allocate), appending the ids to `out`.
    pub fn allocate_into(&mut self, num_blocks: u64, out: &mut Vec<u32>) -> KvResult<()> {
        if num_blocks > self.free.len() as u64 {
            return Err(self.out_of_blocks(num_blocks));
        }
        let start = self.free.len() - num_blocks as usize;
        out.try_reserve(num_blocks as usize)
            .map_err(|e| memory_err(&format!("{num_blocks} block ids"), e))?;
        for &b in self.free[start..].iter().rev() {
            self.ref_count[b as usize] = 1;
            out.push(b);
        }
        self.free.truncate(start);
        Ok(())
    }

    /// Free means on the free stack: `ref_count == 0` and not cached.
    fn is_free(&self, b: usize) -> bool {
        self.ref_count[b] == 0 && self.hash[b].is_none()
    }

    /// Length of the longest run of consecutive free block ids.
    pub fn longest_free_run(&self) -> u32 {
        let (mut best, mut cur) = (0u32, 0u32);
        for b in 0..self.ref_count.len() {
            cur = if self.is_free(b) { cur + 1 } else { 0 };
            best = best.max(cur);
        }
        best
    }

    /// First fit: the lowest `b` such that blocks `b .. b + num_blocks` are all free. Takes them
    /// off the free stack, keeping the order of the rest; each gets ref_count 1. Never evicts.
    pub fn allocate_run(&mut self, num_blocks: u64) -> KvResult<Vec<u32>> {
        self.allocate_run_then(num_blocks, |ids| try_collect(ids, "block ids"))
    }

    /// [`allocate_run`](Self::allocate_run), the run shown to `emit` first: returns what
    /// `emit` returns, and allocates only if it succeeds.
    pub fn allocate_run_then<R, E: From<KvError>>(
        &mut self,
        num_blocks: u64,
        emit: impl FnOnce(Range<u32>) -> Result<R, E>,
    ) -> Result<R, E> {
        if num_blocks > self.free.len() as u64 {
            return Err(self.out_of_blocks(num_blocks).into());
        }
        if num_blocks == 0 {
            return emit(0..0);
        }
        let n = num_blocks as usize;
        let mut cur = 0usize;
        let mut start = None;
        for b in 0..self.ref_count.len() {
            cur = if self.is_free(b) { cur + 1 } else { 0 };
            if cur == n {
                start = Some(b + 1 - n);
                break;
            }
        }
        let Some(start) = start else {
            return Err(KvError::OutOfBlocks(format!(
                "no run of {num_blocks} consecutive free blocks (longest: {})",
                self.longest_free_run()
            ))
            .into());
        };
        let run = start as u32..(start + n) as u32;
        let r = emit(run.clone())?;
        self.free.retain(|b| !run.contains(b));
        for b in run {
            self.ref_count[b as usize] = 1;
        }
        Ok(r)
    }

    /// Adds a reference; an evictable block leaves the LRU list (a prefix-cache hit).
    pub fn incref(&mut self, block_id: u32) -> KvResult<()> {
        self.check_incref(block_id, 1)?;
        self.incref_unchecked(block_id);
        Ok(())
    }

    /// `incref` of each id, in order (an id listed twice gains two references). Checked as a
    /// whole first, so an error changes nothing: an unknown id, a free block, or a count
    /// within the batch's length of u32::MAX (it might overflow; checked without counting
    /// repeats).
    pub fn incref_all(&mut self, block_ids: &[u32]) -> KvResult<()> {
        let headroom = u32::try_from(block_ids.len()).unwrap_or(u32::MAX);
        for &id in block_ids {
            self.check_incref(id, headroom)?;
        }
        for &id in block_ids {
            self.incref_unchecked(id);
        }
        Ok(())
    }

    /// Whether `block_id` may gain up to `headroom` (>= 1) references: a known block, not
    /// free, whose count stays within u32.
    fn check_incref(&self, block_id: u32, headroom: u32) -> KvResult<()> {
        let b = self.check_id(block_id)?;
        if self.ref_count[b] == 0 && self.hash[b].is_none() {
            return cache_err(format!("block {block_id} is free: cannot incref"));
        }
        if self.ref_count[b] > u32::MAX - headroom {
            return cache_err(format!(
                "block {block_id}: reference count overflow: cannot incref"
            ));
        }
        Ok(())
    }

    /// Adds a reference to a block `check_incref` let through.
    fn incref_unchecked(&mut self, block_id: u32) {
        let b = block_id as usize;
        if self.ref_count[b] == 0 {
            self.lru_unlink(block_id);
        }
        self.ref_count[b] += 1;
        if let Some(log) = &mut self.accesses {
            // The hash is read only while recording: a pool that does not record pays
            // this branch alone.
            if let Some(h) = self.hash[b] {
                log.push(Access::new(AccessKind::Hit, block_id, h, None));
            }
        }
    }

    /// Drops a reference. At zero a cached block goes to the most recent end of the LRU list and
    /// an uncached block is pushed on the free stack. The caller checked ref_count > 0.
    fn decref_unchecked(&mut self, block_id: u32) {
        let b = block_id as usize;
        self.ref_count[b] -= 1;
        if self.ref_count[b] == 0 {
            if let Some(h) = self.hash[b] {
                self.lru_push_back(block_id);
                if let Some(log) = &mut self.accesses {
                    log.push(Access::new(AccessKind::Release, block_id, h, None));
                }
            } else {
                self.free.push(block_id);
            }
        }
    }

    /// Drops one reference per id, in order (see `decref_unchecked`), checked as a whole first
    /// (duplicates counted).
    pub fn free(&mut self, block_ids: &[u32]) -> KvResult<()> {
        // Dry run on the counts alone, undone afterwards, so that an error changes nothing.
        let mut failed = None;
        for (i, &id) in block_ids.iter().enumerate() {
            let err = match self.check_id(id) {
                Err(e) => Some(e),
                Ok(b) if self.ref_count[b] == 0 => {
                    Some(KvError::Cache(format!("double free of block {id}")))
                }
                Ok(b) => {
                    self.ref_count[b] -= 1;
                    None
                }
            };
            if let Some(e) = err {
                failed = Some((i, e));
                break;
            }
        }
        let done = failed.as_ref().map_or(block_ids.len(), |(i, _)| *i);
        for &id in &block_ids[..done] {
            self.ref_count[id as usize] += 1;
        }
        if let Some((_, e)) = failed {
            return Err(e);
        }
        for &id in block_ids {
            self.decref_unchecked(id);
        }
        Ok(())
    }

    /// Records that a used block holds the content named by `block_hash`, chained to the
    /// content `parent` (logged only). Returns false, changing nothing, if this block already
    /// carries this hash or the hash names another block.
    /// [`BlockTables::cache_blocks`](crate::block_table::BlockTables::cache_blocks) publishes
    /// blocks through it.
    pub(crate) fn cache_block(
        &mut self,
        block_id: u32,
        block_hash: u64,
        parent: Option<u64>,
    ) -> KvResult<bool> {
        let b = self.check_id(block_id)?;
        if self.ref_count[b] == 0 {
            return cache_err(format!(
                "block {block_id} is {} (ref_count 0): cannot cache",
                self.state_name(b)
            ));
        }
        match self.hash[b] {
            Some(h) if h == block_hash => return Ok(false),
            Some(h) => {
                return cache_err(format!(
                    "block {block_id} already carries hash {h:#018x}: cannot cache it as {block_hash:#018x}"
                ))
            }
            None => {}
        }
        if self.cached.contains_key(&block_hash) {
            return Ok(false);
        }
        self.cached.insert(block_hash, block_id);
        self.hash[b] = Some(block_hash);
        if let Some(log) = &mut self.accesses {
            log.push(Access::new(
                AccessKind::Insert,
                block_id,
                block_hash,
                parent,
            ));
        }
        Ok(true)
    }

    /// Undoes a `cache_block` that returned true on a block still used (for batch rollback):
    /// logged as an eviction, so that a policy hearing both forgets the block.
    pub(crate) fn uncache_used(&mut self, block_id: u32) {
        let b = block_id as usize;
        debug_assert!(self.ref_count[b] > 0);
        if let Some(h) = self.hash[b].take() {
            self.cached.remove(&h);
            if let Some(log) = &mut self.accesses {
                log.push(Access::new(AccessKind::Evict, block_id, h, None));
            }
        }
    }

    /// The hash block `block_id` carries (None: not cached, or not a block of the pool).
    pub(crate) fn hash_of(&self, block_id: u32) -> Option<u64> {
        self.hash.get(block_id as usize).copied().flatten()
    }

    /// Starts (`on`) or stops logging accesses; stopping drops what was logged.
    pub fn record_accesses(&mut self, on: bool) {
        match (on, self.accesses.is_some()) {
            (true, false) => self.accesses = Some(Vec::new()),
            (false, true) => self.accesses = None,
            _ => {}
        }
    }

    /// Whether accesses are being logged.
    pub fn is_recording_accesses(&self) -> bool {
        self.accesses.is_some()
    }

    /// The accesses logged since the last call, oldest first (empty while not recording).
    pub fn take_accesses(&mut self) -> Vec<Access> {
        self.accesses
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Block ids of the longest run of leading hashes that are all cached. Errors (`Memory`)
    /// if the host cannot hold them.
    pub fn lookup_prefix(&self, block_hashes: &[u64]) -> KvResult<Vec<u32>> {
        // At most one block per hash: one reservation, no growth while matching.
        let mut out = try_with_capacity(block_hashes.len(), "the cached block ids")?;
        out.extend(
            block_hashes
                .iter()
                .map_while(|h| self.cached.get(h).copied()),
        );
        Ok(out)
    }

    /// Whether some block carries `block_hash`.
    pub fn is_cached(&self, block_hash: u64) -> bool {
        self.cached.contains_key(&block_hash)
    }

    /// Room in the hash map for `n` more cached blocks, so that recording them cannot fail
    /// halfway (`Memory` error if the host cannot hold it).
    pub(crate) fn reserve_hashes(&mut self, n: usize) -> KvResult<()> {
        try_reserve_map(&mut self.cached, n, "the hash map")
    }

    pub fn ref_count(&self, block_id: u32) -> KvResult<u32> {
        Ok(self.ref_count[self.check_id(block_id)?])
    }

    /// How many of `block_ids` (each counted as often as listed) have no reference: the
    /// free and the evictable ones. All ids are checked first.
    pub fn num_unreferenced(&self, block_ids: &[u32]) -> KvResult<u64> {
        for &b in block_ids {
            self.check_id(b)?;
        }
        Ok(block_ids
            .iter()
            .filter(|&&b| self.ref_count[b as usize] == 0)
            .count() as u64)
    }

    /// Evictable -> free: drops the block's hash and returns it.
    pub fn evict(&mut self, block_id: u32) -> KvResult<u64> {
        let b = self.check_id(block_id)?;
        if !self.is_evictable(b) {
            return cache_err(format!(
                "block {block_id} is {}, not evictable: cannot evict",
                self.state_name(b)
            ));
        }
        Ok(self.evict_unchecked(block_id))
    }

    fn evict_unchecked(&mut self, block_id: u32) -> u64 {
        self.lru_unlink(block_id);
        let h = self.hash[block_id as usize]
            .take()
            .expect("evictable block without a hash");
        self.cached.remove(&h);
        self.free.push(block_id);
        if let Some(log) = &mut self.accesses {
            log.push(Access::new(AccessKind::Evict, block_id, h, None));
        }
        h
    }

    /// Evicts the `num_blocks` least recently released evictable blocks; returns them oldest first.
    pub fn evict_lru(&mut self, num_blocks: u64) -> KvResult<Vec<u32>> {
        self.evict_lru_then(num_blocks, |ids| try_collect(ids, "block ids"))
    }

    /// [`evict_lru`](Self::evict_lru), the blocks it evicts shown to `emit` first, oldest
    /// first: returns what `emit` returns, and evicts only if it succeeds.
    pub fn evict_lru_then<R, E: From<KvError>>(
        &mut self,
        num_blocks: u64,
        emit: impl FnOnce(LruIds<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        if num_blocks > u64::from(self.num_evictable) {
            return Err(KvError::OutOfBlocks(format!(
                "cannot evict {num_blocks} blocks: only {} evictable",
                self.num_evictable
            ))
            .into());
        }
        let r = emit(self.lru_ids(num_blocks as usize))?;
        self.evict_oldest(num_blocks);
        Ok(r)
    }

    /// The first `n` evictable blocks, least recently released first.
    fn lru_ids(&self, n: usize) -> LruIds<'_> {
        LruIds {
            next: &self.next,
            block: self.lru_head,
            left: n.min(self.num_evictable as usize),
        }
    }

    /// Evicts the `num_blocks` least recently released evictable blocks (at most
    /// `num_evictable`, checked by the callers).
    fn evict_oldest(&mut self, num_blocks: u64) {
        for _ in 0..num_blocks {
            let b = self.lru_head;
            self.evict_unchecked(b);
        }
    }

    /// Makes `num_blocks` blocks free beyond `num_kept_free`, evicting the least recently
    /// released evictable blocks (as `evict_lru`) for what the free ones lack: true if
    /// that many are free then; false, evicting nothing, if the free and evictable blocks
    /// together fall short.
    pub fn make_room_lru(&mut self, num_blocks: u64, num_kept_free: u64) -> bool {
        let wanted = num_blocks.saturating_add(num_kept_free);
        let num_free = u64::from(self.num_free_blocks());
        if wanted <= num_free {
            return true;
        }
        let shortfall = wanted - num_free;
        if shortfall > u64::from(self.num_evictable) {
            return false;
        }
        self.evict_oldest(shortfall);
        true
    }

    /// Free blocks in the order `allocate` would hand them out.
    pub fn free_ids(&self) -> FreeIds<'_> {
        self.free.iter().rev().copied()
    }

    /// [`free_ids`](Self::free_ids) in a vector (`Memory` error if the host cannot hold it).
    pub fn free_block_ids(&self) -> KvResult<Vec<u32>> {
        try_collect(self.free_ids(), "the free block ids")
    }

    /// Evictable blocks, least recently released first.
    pub fn evictable_ids(&self) -> LruIds<'_> {
        self.lru_ids(self.num_evictable as usize)
    }

    /// [`evictable_ids`](Self::evictable_ids) in a vector (`Memory` error if the host cannot
    /// hold it).
    pub fn evictable_block_ids(&self) -> KvResult<Vec<u32>> {
        try_collect(self.evictable_ids(), "the evictable block ids")
    }

    /// ref_count of every block, indexed by block id.
    pub fn ref_counts(&self) -> &[u32] {
        &self.ref_count
    }

    /// (hash, block id) of every cached block, in no particular order.
    pub fn cached_blocks(&self) -> impl ExactSizeIterator<Item = (u64, u32)> + '_ {
        self.cached.iter().map(|(&h, &b)| (h, b))
    }

    /// Test-only access for corrupting state in integrity tests.
    #[cfg(test)]
    pub(crate) fn raw_ref_counts_mut(&mut self) -> &mut Vec<u32> {
        &mut self.ref_count
    }
}

mod check;

#[cfg(test)]
mod tests;
