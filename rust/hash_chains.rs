//! Hash chains: per sequence, the names of its leading full blocks (chained block hashes,
//! spec in [`crate::hash`]) and how many of them are published in the pool's hash map. The
//! memo of block-hash prefix caching: a waiting prompt is named once and looked up at every
//! admission attempt, and a step's decodes that fill a block name and publish it in one call.
//!
//! A chain is created by the first [`HashChains::extend`] of its sequence and lives until
//! [`HashChains::remove`]; the sequence's extra key is the caller's to pass alike each time.

use std::collections::{HashMap, HashSet};

use crate::block_pool::BlockPool;
use crate::block_table::{BlockTables, HOLE};
use crate::error::{memory_err, try_collect, try_reserve, try_reserve_map, try_with_capacity};
use crate::error::{KvError, KvResult};
use crate::hash::{hash_block, hash_blocks, FastBuild};

#[derive(Default)]
struct Chain {
    names: Vec<u64>,
    /// Names `0..num_published` went to the pool (through the table's blocks, holes skipped).
    num_published: usize,
}

impl Chain {
    fn is_all_published(&self) -> bool {
        self.num_published == self.names.len()
    }
}

pub struct HashChains {
    block_size: usize,
    root_hash: u64,
    chains: HashMap<u64, Chain, FastBuild>,
}

fn value_err<T>(msg: String) -> KvResult<T> {
    Err(KvError::Value(msg))
}

impl HashChains {
    /// No chains; `block_size` tokens a block (`Value` error if 0), first blocks chained to
    /// `root_hash`.
    pub fn new(block_size: u64, root_hash: u64) -> KvResult<Self> {
        if block_size == 0 {
            return value_err("block_size must be in [1, 2**64), got 0".to_string());
        }
        Ok(HashChains {
            block_size: usize::try_from(block_size).unwrap_or(usize::MAX),
            root_hash,
            chains: HashMap::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Names the sequence has (0 for one without a chain).
    pub fn num_names(&self, seq_id: u64) -> usize {
        self.chains.get(&seq_id).map_or(0, |c| c.names.len())
    }

    /// Names of the sequence published (0 for one without a chain).
    pub fn num_published(&self, seq_id: u64) -> usize {
        self.chains.get(&seq_id).map_or(0, |c| c.num_published)
    }

    /// The sequence's names (empty for one without a chain).
    pub fn names(&self, seq_id: u64) -> &[u64] {
        self.chains.get(&seq_id).map_or(&[], |c| &c.names)
    }

    /// Names the sequence's first `num_blocks` blocks, creating its chain: `tokens` are its
    /// tokens from block `num_names(seq_id)` on, at least the blocks up to `num_blocks`
    /// (`Value` error otherwise, changing nothing); those after are not read. Returns
    /// `num_names(seq_id)` after (never fewer than before). Errors (`Memory`) if the host
    /// cannot hold the new names, changing nothing.
    pub fn extend(
        &mut self,
        seq_id: u64,
        tokens: &[u32],
        num_blocks: usize,
        extra_key: Option<&[u8]>,
    ) -> KvResult<usize> {
        let have = self.num_names(seq_id);
        let needed = num_blocks
            .saturating_sub(have)
            .saturating_mul(self.block_size);
        if tokens.len() < needed {
            let start = have.saturating_mul(self.block_size);
            return value_err(format!(
                "naming {num_blocks} blocks of sequence {seq_id} needs its tokens up to {}, it has {}",
                start.saturating_add(needed),
                start.saturating_add(tokens.len())
            ));
        }
        let names = if num_blocks > have {
            let parent = self.names(seq_id).last().copied().unwrap_or(self.root_hash);
            hash_blocks(&tokens[..needed], self.block_size, extra_key, parent)?
        } else {
            Vec::new()
        };
        match self.chains.get_mut(&seq_id) {
            Some(chain) => {
                try_reserve(&mut chain.names, names.len(), "the names")?;
                chain.names.extend_from_slice(&names);
                Ok(chain.names.len())
            }
            None => {
                try_reserve_map(&mut self.chains, 1, "the chains")?;
                let num_names = names.len();
                let chain = Chain {
                    names,
                    num_published: 0,
                };
                self.chains.insert(seq_id, chain);
                Ok(num_names)
            }
        }
    }

    /// The pool's blocks for the longest run of the sequence's first `num_blocks` names
    /// that the pool holds (fewer names: all of them; no chain: none).
    pub fn lookup(&self, pool: &BlockPool, seq_id: u64, num_blocks: usize) -> KvResult<Vec<u32>> {
        let names = self.names(seq_id);
        pool.lookup_prefix(&names[..num_blocks.min(names.len())])
    }

    /// Whether the sequence has a name at `index` and the pool holds it.
    pub fn is_cached(&self, pool: &BlockPool, seq_id: u64, index: usize) -> bool {
        self.names(seq_id)
            .get(index)
            .is_some_and(|&h| pool.is_cached(h))
    }

    /// Publishes names `num_published(seq_id)..end` through the sequence's blocks at those
    /// indices of `tables`, skipping holes, then counts the first `end` as published;
    /// returns how many blocks were recorded. `Value` error if `end` passes its names (it
    /// has no chain: it has none), `Cache` if the table is unknown or shorter than `end`,
    /// or a recording is refused; every error changes nothing.
    pub fn publish(
        &mut self,
        tables: &BlockTables,
        pool: &mut BlockPool,
        seq_id: u64,
        end: usize,
    ) -> KvResult<usize> {
        let num_names = self.num_names(seq_id);
        if end > num_names {
            return value_err(format!(
                "cannot publish {end} blocks of sequence {seq_id}: it has {num_names} names"
            ));
        }
        let first = self.num_published(seq_id);
        if end <= first {
            return Ok(0);
        }
        let num_blocks = tables.num_blocks(seq_id)?;
        if end > num_blocks {
            return Err(KvError::Cache(format!(
                "cannot publish {end} blocks of sequence {seq_id}: its table has {num_blocks}"
            )));
        }
        let chain = self.chains.get_mut(&seq_id).expect("it has names");
        let mut blocks = try_with_capacity(end - first, "the blocks to publish")?;
        let mut names = try_with_capacity(end - first, "the names to publish")?;
        let mut parents = Vec::new();
        let logged = pool.is_recording_accesses();
        if logged {
            try_reserve(&mut parents, end - first, "the parents")?;
        }
        for index in first..end {
            let b = tables.block_id_at(seq_id, index as u64)?;
            if b != HOLE {
                blocks.push(b);
                names.push(chain.names[index]);
                if logged {
                    parents.push(index.checked_sub(1).map(|i| chain.names[i]));
                }
            }
        }
        let recorded = BlockTables::record_hashes(pool, &blocks, &names, &parents)?;
        chain.num_published = end;
        Ok(recorded)
    }

    /// Whether a decode of the sequence whose first `num_tokens` tokens are scheduled fills
    /// the block that comes right after its names, all published: `num_tokens` is a
    /// positive multiple of the block size and the sequence has `num_tokens / block_size -
    /// 1` names, all published.
    #[inline(always)]
    pub fn fills_next(&self, seq_id: u64, num_tokens: u64) -> bool {
        let bs = self.block_size as u64;
        if num_tokens == 0 || num_tokens % bs != 0 {
            return false;
        }
        self.chains
            .get(&seq_id)
            .is_some_and(|c| c.names.len() as u64 == num_tokens / bs - 1 && c.is_all_published())
    }

    /// For each i, names the block after sequence `seq_ids[i]`'s names (each must have a
    /// chain whose names are all published, as [`fills_next`](Self::fills_next) checks, and
    /// appear once: `Value` error otherwise) from its
    /// tokens `block_tokens[i * block_size..][..block_size]`, chained to its last name
    /// with `extra_keys[i]`, and publishes it through the table: one recording for all, so
    /// an error (`Cache`: a table refuses; `Memory`) changes nothing. Returns how many
    /// recorded.
    pub fn publish_filled(
        &mut self,
        tables: &BlockTables,
        pool: &mut BlockPool,
        seq_ids: &[u64],
        block_tokens: &[u32],
        extra_keys: &[Option<&[u8]>],
    ) -> KvResult<usize> {
        let bs = self.block_size;
        let num_tokens = seq_ids.len().checked_mul(bs);
        if extra_keys.len() != seq_ids.len() || num_tokens != Some(block_tokens.len()) {
            return value_err(format!(
                "{} sequences, {} extra keys and {} tokens (block size {bs})",
                seq_ids.len(),
                extra_keys.len(),
                block_tokens.len()
            ));
        }
        let mut seen: HashSet<u64, FastBuild> = HashSet::default();
        seen.try_reserve(seq_ids.len())
            .map_err(|e| memory_err("the filling sequences", e))?;
        let mut indices = try_with_capacity(seq_ids.len(), "the filled blocks' indices")?;
        let mut names = try_with_capacity(seq_ids.len(), "the filled blocks' names")?;
        let logged = pool.is_recording_accesses();
        let mut parents = Vec::new();
        if logged {
            try_reserve(&mut parents, seq_ids.len(), "the filled blocks' parents")?;
        }
        for (i, &s) in seq_ids.iter().enumerate() {
            let chain = match self.chains.get(&s) {
                Some(c) if c.is_all_published() && seen.insert(s) => c,
                _ => {
                    return value_err(format!(
                        "sequence {s} does not fill the block after its published names once"
                    ))
                }
            };
            let parent = chain.names.last().copied().unwrap_or(self.root_hash);
            if logged {
                parents.push(chain.names.last().copied());
            }
            indices.push(chain.names.len() as u64);
            names.push(hash_block(
                parent,
                &block_tokens[i * bs..][..bs],
                extra_keys[i],
            )?);
        }
        for s in seq_ids {
            let chain = self.chains.get_mut(s).expect("checked above");
            try_reserve(&mut chain.names, 1, "a name")?;
        }
        let recorded = tables.cache_blocks_after(pool, seq_ids, &indices, &names, &parents)?;
        for (&s, &name) in seq_ids.iter().zip(&names) {
            let chain = self.chains.get_mut(&s).expect("checked above");
            chain.names.push(name);
            chain.num_published = chain.names.len();
        }
        Ok(recorded)
    }

    /// Forgets the sequence's chain (nothing if it has none).
    pub fn remove(&mut self, seq_id: u64) {
        self.chains.remove(&seq_id);
    }

    /// The sequences that have a chain, ascending (`Memory` error if the host cannot hold
    /// them).
    pub fn seq_ids(&self) -> KvResult<Vec<u64>> {
        let mut v = try_collect(self.chains.keys().copied(), "the sequence ids")?;
        v.sort_unstable();
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::ROOT_HASH;

    fn tokens(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn extend_names_blocks_once_and_refuses_short_tokens() {
        let mut c = HashChains::new(4, ROOT_HASH).unwrap();
        assert_eq!(c.extend(7, &tokens(10), 2, None).unwrap(), 2);
        assert_eq!(
            c.names(7),
            hash_blocks(&tokens(8), 4, None, ROOT_HASH)
                .unwrap()
                .as_slice()
        );
        // From block 2 on: tokens 8.. of the sequence.
        let rest: Vec<u32> = (8..16).collect();
        assert_eq!(c.extend(7, &rest, 4, None).unwrap(), 4);
        assert_eq!(
            c.names(7),
            hash_blocks(&tokens(16), 4, None, ROOT_HASH)
                .unwrap()
                .as_slice()
        );
        assert_eq!(c.extend(7, &[], 3, None).unwrap(), 4);
        assert!(matches!(
            c.extend(7, &[1, 2, 3], 5, None),
            Err(KvError::Value(_))
        ));
        assert_eq!(c.num_names(7), 4);
        assert_eq!(c.num_names(8), 0);
    }

    #[test]
    fn publish_and_publish_filled_record_through_the_table() {
        let mut pool = BlockPool::new(8).unwrap();
        let mut tables = BlockTables::new(4).unwrap();
        let mut c = HashChains::new(4, ROOT_HASH).unwrap();
        tables.add_sequence(1, &[]).unwrap();
        tables.grow(&mut pool, &[1], &[8]).unwrap();
        c.extend(1, &tokens(8), 2, None).unwrap();
        assert!(matches!(
            c.publish(&tables, &mut pool, 1, 3),
            Err(KvError::Value(_))
        ));
        assert_eq!(c.publish(&tables, &mut pool, 1, 2).unwrap(), 2);
        assert_eq!(c.lookup(&pool, 1, 9).unwrap(), vec![0, 1]);
        assert!(c.is_cached(&pool, 1, 1) && !c.is_cached(&pool, 1, 2));
        // A decode fills block 2.
        tables.grow(&mut pool, &[1], &[12]).unwrap();
        assert!(c.fills_next(1, 12) && !c.fills_next(1, 8) && !c.fills_next(1, 11));
        assert_eq!(
            c.publish_filled(&tables, &mut pool, &[1], &[8, 9, 10, 11], &[None])
                .unwrap(),
            1
        );
        assert_eq!(
            c.names(1),
            hash_blocks(&tokens(12), 4, None, ROOT_HASH)
                .unwrap()
                .as_slice()
        );
        assert_eq!(c.num_published(1), 3);
        let twice = c.publish_filled(&tables, &mut pool, &[1, 1], &[0; 8], &[None, None]);
        assert!(matches!(twice, Err(KvError::Value(_))));
        assert_eq!(c.num_names(1), 3);
        c.remove(1);
        assert_eq!(c.seq_ids().unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn names_the_host_cannot_hold_are_memory_errors_that_change_nothing() {
        use crate::error::test_alloc::with_alloc_limit;
        let mut c = HashChains::new(1, ROOT_HASH).unwrap();
        let many = tokens(1 << 18); // 2 MiB of names
        with_alloc_limit(1 << 20, || {
            assert!(matches!(
                c.extend(7, &many, 1 << 18, None),
                Err(KvError::Memory(_))
            ));
            assert_eq!(c.seq_ids().unwrap(), Vec::<u64>::new());
            assert_eq!(c.extend(7, &many, 3, None).unwrap(), 3);
            assert!(matches!(
                c.extend(7, &many[3..], 1 << 18, None),
                Err(KvError::Memory(_))
            ));
        });
        assert_eq!(
            c.names(7),
            &hash_blocks(&many[..3], 1, None, ROOT_HASH).unwrap()[..]
        );
    }
}
