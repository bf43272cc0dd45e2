//! Reference counts per distinct block of a radix tree, so that the tree tells in O(1) how
//! many distinct blocks only unlocked nodes reference (`RadixTree::num_evictable_blocks`).

use std::collections::HashMap;

use crate::hash::FastBuild;

/// References to one block: from every node, and from nodes with `lock_count > 0`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct BlockRefs {
    pub(super) refs: u64,
    pub(super) locked: u64,
}

/// Per distinct block, its [`BlockRefs`]; how many of those blocks no locked node
/// references; and how many references unlocked nodes hold in all. Invariant: a block is in
/// the map iff some node references it.
#[derive(Debug, Clone, Default)]
pub(super) struct BlockCounts {
    pub(super) map: HashMap<u32, BlockRefs, FastBuild>,
    pub(super) num_unlocked_only: u64,
    /// The sum over blocks of `refs - locked`: what evicting every unlocked node releases.
    pub(super) num_unlocked_refs: u64,
}

impl BlockCounts {
    /// Changes the counts of block `b`, keeping `num_unlocked_only` in step.
    pub(super) fn update(&mut self, b: u32, f: impl FnOnce(&mut BlockRefs)) {
        let e = self.map.entry(b).or_default();
        let was = e.refs > 0 && e.locked == 0;
        let unlocked_before = e.refs - e.locked;
        f(e);
        let is = e.refs > 0 && e.locked == 0;
        self.num_unlocked_refs = self.num_unlocked_refs + (e.refs - e.locked) - unlocked_before;
        if e.refs == 0 {
            self.map.remove(&b);
        }
        match (was, is) {
            (false, true) => self.num_unlocked_only += 1,
            (true, false) => self.num_unlocked_only -= 1,
            _ => {}
        }
    }

    /// A node whose lock status is `locked` gains a reference to each of `blocks`.
    pub(super) fn add(&mut self, blocks: &[u32], locked: bool) {
        for &b in blocks {
            self.update(b, |e| {
                e.refs += 1;
                e.locked += u64::from(locked);
            });
        }
    }

    /// A node whose lock status is `locked` drops its references to `blocks`.
    pub(super) fn remove(&mut self, blocks: &[u32], locked: bool) {
        for &b in blocks {
            self.update(b, |e| {
                e.refs -= 1;
                e.locked -= u64::from(locked);
            });
        }
    }

    /// A node holding `blocks` became locked (`true`) or unlocked (`false`).
    pub(super) fn set_locked(&mut self, blocks: &[u32], locked: bool) {
        for &b in blocks {
            self.update(b, |e| {
                if locked {
                    e.locked += 1;
                } else {
                    e.locked -= 1;
                }
            });
        }
    }
}
