//! `RadixTree::evict`: block-granular eviction from the tails of unlocked leaves, in
//! [`EvictKey`](super::EvictKey) order.

use super::RadixTree;
use crate::error::{cache_err, try_collect, try_with_capacity, KvResult};

impl RadixTree {
    /// Releases tree references at block granularity until `num_blocks` distinct blocks have
    /// lost their last tree reference (`num_evictable_blocks` then falls by exactly
    /// `min(num_blocks, num_evictable_blocks())`) or nothing unlocked is left. Each round
    /// takes the first unlocked leaf in eviction order ([`EvictKey`](super::EvictKey): a leaf
    /// ending inside a block first, then least recent) and trims the last block off its edge:
    /// the edge is cut back to the start of that block (or to the node's start), and the
    /// block's reference is released; a block the node shares with another (the parent's
    /// straddling block) drops a reference without freeing a distinct block. A node left
    /// without tokens is removed, and its parent may become an unlocked leaf, listed at its
    /// own stamp. A trimmed leaf keeps its stamp, so it stays in its place in the order until
    /// it is gone: a released sequence loses its tail before its prefix, as a block LRU list
    /// gives blocks back. Returns every released reference in release order (the caller frees
    /// each once). The room for them is reserved first: a `Memory` error changes nothing.
    pub fn evict(&mut self, num_blocks: u64) -> KvResult<Vec<u32>> {
        let counts = &self.block_counts;
        let target = counts.num_unlocked_only.saturating_sub(num_blocks);
        // Each round releases one reference of an unlocked node; those that free no counted
        // block are at most the unlocked references beyond one per counted block.
        let most = counts.num_unlocked_refs - counts.num_unlocked_only
            + (counts.num_unlocked_only - target);
        let most = usize::try_from(most).unwrap_or(usize::MAX);
        let mut released = try_with_capacity(most, "the released block references")?;
        while self.block_counts.num_unlocked_only > target {
            let Some(&(_, _, id)) = self.evictable.first() else {
                break;
            };
            released.push(self.trim_last_block(id));
        }
        Ok(released)
    }

    /// Every eviction candidate (an unlocked leaf) with the block [`evict`](Self::evict)
    /// would trim off it next (its last), in eviction order: what a policy choosing its
    /// own victims chooses among (`Memory` error if the host cannot hold them).
    pub fn evictable_tails(&self) -> KvResult<Vec<(u64, u32)>> {
        try_collect(
            self.evictable.iter().map(|&(_, _, id)| {
                let block = self.node(id).blocks.last();
                (id, *block.expect("a non-root node references a block"))
            }),
            "the evictable tails",
        )
    }

    /// One round of [`evict`](Self::evict) on the candidate a caller chose: trims the last
    /// block off the unlocked leaf `node_id` and returns the released reference (the caller
    /// frees it once). `Cache` error, changing nothing, for an unknown node or one that is
    /// not a candidate (the root, a locked node, a node with children).
    pub fn evict_tail(&mut self, node_id: u64) -> KvResult<u32> {
        self.check_node(node_id)?;
        if !self.is_candidate(node_id) {
            return cache_err(format!(
                "node {node_id} is not an unlocked leaf: cannot evict its tail"
            ));
        }
        Ok(self.trim_last_block(node_id))
    }

    /// Cuts the edge of the unlocked leaf `id` back to the start of its last block and drops
    /// that block's reference (returned); removes the node if no token is left.
    fn trim_last_block(&mut self, id: u64) -> u32 {
        let bs = self.block_size;
        self.unlist(id);
        let n = self.node_mut(id);
        let first_token = n.tokens[0];
        let block = n.blocks.pop().expect("a non-root node references a block");
        let cut = ((n.end() - 1) / bs * bs).max(n.start);
        n.tokens.truncate((cut - n.start) as usize);
        let (is_empty, parent) = (n.tokens.is_empty(), n.parent);
        self.block_counts.remove(&[block], false);
        if is_empty {
            self.nodes.remove(&id);
            self.unlist(parent);
            self.node_mut(parent).children.remove(&first_token);
            self.relist(parent);
        } else {
            self.relist(id);
        }
        block
    }
}
