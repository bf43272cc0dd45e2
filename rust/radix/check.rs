//! `RadixTree::check_integrity`: every invariant re-derived from the nodes.

use std::collections::{BTreeSet, HashMap};

use super::block_counts::BlockRefs;
use super::{RadixTree, ROOT};
use crate::error::{cache_err, KvResult, MAX_BLOCK_ID};

impl RadixTree {
    /// Checks every invariant; the error names the first broken one.
    pub fn check_integrity(&self) -> KvResult<()> {
        let fail = |msg: String| cache_err(format!("radix tree integrity: {msg}"));
        let Some(root) = self.nodes.get(&ROOT) else {
            return fail("no root".into());
        };
        if !root.tokens.is_empty() || !root.blocks.is_empty() || root.start != 0 {
            return fail("the root holds tokens or blocks".into());
        }
        // Walk from the root: every node reached once, through its parent's children map.
        let mut seen = 0usize;
        let mut stack = vec![ROOT];
        let mut candidates = BTreeSet::new();
        let mut block_refs: HashMap<u32, BlockRefs> = HashMap::new();
        while let Some(id) = stack.pop() {
            seen += 1;
            if seen > self.nodes.len() {
                return fail("the parent links form a cycle".into());
            }
            let n = self.node(id);
            if id != ROOT {
                if id >= self.next_id {
                    return fail(format!("node {id} has an id not yet handed out"));
                }
                if n.tokens.is_empty() {
                    return fail(format!("node {id} holds no tokens"));
                }
                let want = self.span(n.start, n.end());
                if n.blocks.len() != want {
                    return fail(format!(
                        "node {id} covers positions [{}, {}) but holds {} blocks, not {want}",
                        n.start,
                        n.end(),
                        n.blocks.len()
                    ));
                }
                if let Some(b) = n.blocks.iter().find(|&&b| b > MAX_BLOCK_ID) {
                    return fail(format!("node {id} holds invalid block id {b}"));
                }
                if n.stamp > self.node(n.parent).stamp {
                    return fail(format!("node {id} is more recent than its parent"));
                }
                for &b in &n.blocks {
                    let e = block_refs.entry(b).or_default();
                    e.refs += 1;
                    e.locked += u64::from(n.lock_count > 0);
                }
                if n.lock_count == 0 && n.children.is_empty() {
                    candidates.insert((n.end() % self.block_size == 0, n.stamp, id));
                }
            }
            if n.stamp > self.clock {
                return fail(format!("node {id} has a stamp from the future"));
            }
            let mut child_locks = 0u64;
            for (&first, &c) in &n.children {
                let Some(child) = self.nodes.get(&c) else {
                    return fail(format!("node {id} has unknown child {c}"));
                };
                if child.parent != id || c == ROOT {
                    return fail(format!("child {c} of node {id} names another parent"));
                }
                if child.tokens.first() != Some(&first) {
                    return fail(format!(
                        "child {c} of node {id} is keyed by the wrong token"
                    ));
                }
                if child.start != n.end() {
                    return fail(format!(
                        "child {c} starts at {}, not at its parent's end {}",
                        child.start,
                        n.end()
                    ));
                }
                child_locks += child.lock_count;
                stack.push(c);
            }
            if n.lock_count != n.own_locks + child_locks {
                return fail(format!(
                    "node {id} has lock_count {} but {} own locks and {child_locks} below",
                    n.lock_count, n.own_locks
                ));
            }
        }
        if seen != self.nodes.len() {
            return fail(format!(
                "{} nodes are not reachable from the root",
                self.nodes.len() - seen
            ));
        }
        let counted: HashMap<u32, BlockRefs> = self
            .block_counts
            .map
            .iter()
            .map(|(&b, &e)| (b, e))
            .collect();
        if counted != block_refs {
            return fail("the per-block reference counts disagree with the nodes".into());
        }
        let unlocked_refs: u64 = block_refs.values().map(|e| e.refs - e.locked).sum();
        if unlocked_refs != self.block_counts.num_unlocked_refs {
            return fail(format!(
                "unlocked nodes hold {unlocked_refs} references but the count says {}",
                self.block_counts.num_unlocked_refs
            ));
        }
        let unlocked_only = block_refs.values().filter(|e| e.locked == 0).count() as u64;
        if unlocked_only != self.block_counts.num_unlocked_only {
            return fail(format!(
                "num_evictable_blocks is {} but {unlocked_only} blocks only unlocked nodes hold",
                self.block_counts.num_unlocked_only
            ));
        }
        if candidates != self.evictable {
            return fail("the eviction set is not the set of unlocked leaves".into());
        }
        Ok(())
    }
}
