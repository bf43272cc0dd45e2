//! A token-granular radix (prefix) tree whose nodes reference paged KV blocks.
//!
//! Node 0 is the root and holds no tokens. Every other node holds a non-empty edge of tokens
//! covering the absolute positions `[start, end)` of every sequence through it, and references
//! the blocks `floor(start / bs) ..= floor((end - 1) / bs)` (block `i` holds positions
//! `[i * bs, (i + 1) * bs)`). A block straddling a node boundary is referenced by both nodes;
//! each reference is one tree reference, which the caller mirrors as one pool reference:
//! `insert` returns the references it created, `evict` the ones it released.
//!
//! Locks: `lock_count` of a node counts the locks taken on it or on any descendant; a node with
//! `lock_count > 0` is never evicted. Since one block may be referenced by several nodes (a
//! block straddling a split, or a chunk inserted after the one before it ended mid-block), the
//! tree also counts the references to each distinct block, from all nodes and from locked ones,
//! so that it can tell how many distinct blocks only unlocked nodes reference. Recency: a
//! logical clock ticks once per `insert`, `lock` and `unlock`, which stamp every node from the
//! root to the node concerned, so a parent's stamp is never older than its children's.
//!
//! Eviction is at block granularity, from the tails of leaves: `evict(n)` trims the last block
//! off the first unlocked leaf in eviction order ([`EvictKey`]), again and again, until `n`
//! distinct blocks have lost their last tree reference or nothing unlocked is left. Leaves
//! whose edge ends inside a block come first: that partly filled block is one a block-granular
//! cache (block LRU) would not hold at all, so the tree never keeps one at the cost of a full
//! block such a cache would keep. Then the least recent stamp (ties: lower id). A trimmed leaf
//! keeps its stamp, so it stays in its place in the order until it is gone; a leaf left
//! without tokens is removed, and its parent, once an unlocked leaf, takes its place at its
//! own stamp. So the tail of a released sequence goes before its prefix, and a request for
//! one block costs one block, as in a block LRU list.
//!
//! Where a new leaf starts inside a block, its block (the caller's copy: copy-on-write of a
//! partial match) holds the path's positions before it too; `insert` lets the ancestors that
//! hold another copy of that block take the new one and release theirs, unless a lock needs
//! their copy, so one range of positions does not keep two blocks. A call that errors changes
//! nothing.

use std::collections::{BTreeSet, HashMap};

use crate::error::{cache_err, try_collect, try_reserve, try_to_vec, KvError, KvResult};
use crate::hash::FastBuild;
use block_counts::BlockCounts;

/// Id of the root node.
pub const ROOT: u64 = 0;

#[derive(Debug, Clone)]
struct Node {
    /// The parent's id; the root's is `ROOT` itself (never read).
    parent: u64,
    /// Absolute position of the first token of the edge.
    start: u64,
    tokens: Vec<u32>,
    /// Blocks `floor(start / bs) ..= floor((end - 1) / bs)`; empty for the root.
    blocks: Vec<u32>,
    /// First token of each child's edge -> child id.
    children: HashMap<u32, u64, FastBuild>,
    /// Locks taken on this node or any descendant.
    lock_count: u64,
    /// Locks taken on this node itself (what `unlock` may undo).
    own_locks: u64,
    stamp: u64,
}

impl Node {
    fn end(&self) -> u64 {
        self.start + self.tokens.len() as u64
    }
}

/// Result of [`RadixTree::match_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadixMatch {
    pub num_tokens: u64,
    /// The blocks covering positions `[0, num_tokens)`; the last may be partially matched.
    pub block_ids: Vec<u32>,
    /// The node holding the last matched token (`ROOT` if none matched).
    pub node_id: u64,
}

/// Result of [`RadixTree::insert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertResult {
    pub num_new_tokens: u64,
    /// Every tree reference the call created, in creation order (the caller increfs each).
    pub new_block_refs: Vec<u32>,
    /// The node holding the last token of the inserted sequence (`ROOT` if it was empty).
    pub node_id: u64,
    /// Every tree reference the call released, in release order (the caller frees each,
    /// after the increfs).
    pub released_block_refs: Vec<u32>,
}

/// One node, as [`RadixTree::nodes`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadixNode {
    pub node_id: u64,
    /// `None` for the root.
    pub parent_id: Option<u64>,
    pub token_ids: Vec<u32>,
    pub block_ids: Vec<u32>,
    pub lock_count: u64,
    pub stamp: u64,
}

#[derive(Debug, Clone)]
pub struct RadixTree {
    block_size: u64,
    nodes: HashMap<u64, Node, FastBuild>,
    /// Next node id; ids are never reused.
    next_id: u64,
    clock: u64,
    /// [`EvictKey`] of every non-root leaf with lock_count 0: the eviction candidates, in
    /// eviction order.
    evictable: BTreeSet<EvictKey>,
    /// References per distinct block.
    block_counts: BlockCounts,
}

/// Eviction order of a candidate leaf: (whether its edge ends on a block boundary, stamp, id).
/// Leaves ending inside a block come first, so a partly filled last block (one a block-granular
/// cache would not hold at all) goes before any full block; then least recent stamp first,
/// ties to the lower id.
type EvictKey = (bool, u64, u64);

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl RadixTree {
    pub fn new(block_size: u64) -> KvResult<Self> {
        if block_size < 1 {
            return Err(KvError::Value(format!(
                "block_size must be in [1, 2**64), got {block_size}"
            )));
        }
        let root = Node {
            parent: ROOT,
            start: 0,
            tokens: Vec::new(),
            blocks: Vec::new(),
            children: HashMap::default(),
            lock_count: 0,
            own_locks: 0,
            stamp: 0,
        };
        let mut nodes = HashMap::default();
        nodes.insert(ROOT, root);
        Ok(RadixTree {
            block_size,
            nodes,
            next_id: 1,
            clock: 0,
            evictable: BTreeSet::new(),
            block_counts: BlockCounts::default(),
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Distinct blocks that nodes with lock_count 0 reference and no other node does: those
    /// evicting every unlocked node would take all the tree's references off. A block straddling
    /// two nodes counts once.
    pub fn num_evictable_blocks(&self) -> u64 {
        self.block_counts.num_unlocked_only
    }

    /// How many distinct blocks of `block_ids` `num_evictable_blocks` counts (a sequence
    /// that shares them takes them out of what eviction can free). Pure; errors (`Memory`)
    /// if the host cannot hold a copy of `block_ids`.
    pub fn num_evictable_among(&self, block_ids: &[u32]) -> KvResult<u64> {
        let mut ids = try_to_vec(block_ids, "a copy of the block ids")?;
        ids.sort_unstable();
        ids.dedup();
        Ok(ids
            .iter()
            .filter(|b| self.block_counts.map.get(b).is_some_and(|e| e.locked == 0))
            .count() as u64)
    }

    fn node(&self, id: u64) -> &Node {
        self.nodes.get(&id).expect("node id from the tree itself")
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes
            .get_mut(&id)
            .expect("node id from the tree itself")
    }

    /// Index of the block holding absolute position `pos`.
    fn block_index(&self, pos: u64) -> u64 {
        pos / self.block_size
    }

    /// Blocks covering `[start, end)`, `end > start`.
    fn span(&self, start: u64, end: u64) -> usize {
        (self.block_index(end - 1) - self.block_index(start) + 1) as usize
    }

    fn is_candidate(&self, id: u64) -> bool {
        let n = self.node(id);
        id != ROOT && n.lock_count == 0 && n.children.is_empty()
    }

    fn evict_key(&self, id: u64) -> EvictKey {
        let n = self.node(id);
        (n.end() % self.block_size == 0, n.stamp, id)
    }

    /// Takes the node out of the eviction set before a change to its stamp, locks, children
    /// or tokens.
    fn unlist(&mut self, id: u64) {
        let key = self.evict_key(id);
        self.evictable.remove(&key);
    }

    /// Puts the node back in the eviction set if it is a candidate after the change.
    fn relist(&mut self, id: u64) {
        if self.is_candidate(id) {
            let key = self.evict_key(id);
            self.evictable.insert(key);
        }
    }

    /// Ids from `id` up to the root, both included.
    fn path_to_root(&self, id: u64) -> Vec<u64> {
        let mut path = vec![id];
        let mut cur = id;
        while cur != ROOT {
            cur = self.node(cur).parent;
            path.push(cur);
        }
        path
    }

    /// Ticks the clock and stamps every node of `path`.
    fn stamp_path(&mut self, path: &[u64]) {
        self.clock += 1;
        let now = self.clock;
        for &id in path {
            self.unlist(id);
            self.node_mut(id).stamp = now;
            self.relist(id);
        }
    }

    /// The longest prefix of `token_ids` stored in the tree, at token granularity. Pure;
    /// errors (`Memory`) if the host cannot hold the matched blocks' ids.
    pub fn match_prefix(&self, token_ids: &[u32]) -> KvResult<RadixMatch> {
        let mut node_id = ROOT;
        let mut pos = 0usize;
        let mut block_ids: Vec<u32> = Vec::new();
        while pos < token_ids.len() {
            let Some(&child) = self.node(node_id).children.get(&token_ids[pos]) else {
                break;
            };
            let n = self.node(child);
            let k = common_prefix(&n.tokens, &token_ids[pos..]);
            let first = self.block_index(n.start) as usize;
            let count = self.span(n.start, n.start + k as u64);
            try_reserve(&mut block_ids, count, "the matched block ids")?;
            // Where a block straddles the boundary, the deeper node's block holds the
            // positions of both nodes for this sequence, so it wins.
            for (j, &b) in n.blocks[..count].iter().enumerate() {
                match block_ids.get_mut(first + j) {
                    Some(slot) => *slot = b,
                    None => block_ids.push(b),
                }
            }
            pos += k;
            node_id = child;
            if k < n.tokens.len() {
                break;
            }
        }
        Ok(RadixMatch {
            num_tokens: pos as u64,
            block_ids,
            node_id,
        })
    }

    fn check_node(&self, node_id: u64) -> KvResult<()> {
        if self.nodes.contains_key(&node_id) {
            Ok(())
        } else {
            cache_err(format!("unknown node {node_id}"))
        }
    }

    /// +1 lock on the node (and on the lock_count of every ancestor); stamps the path.
    pub fn lock(&mut self, node_id: u64) -> KvResult<()> {
        self.check_node(node_id)?;
        let path = self.path_to_root(node_id);
        for &id in &path {
            self.unlist(id);
            let n = self
                .nodes
                .get_mut(&id)
                .expect("node id from the tree itself");
            n.lock_count += 1;
            if n.lock_count == 1 && id != ROOT {
                self.block_counts.set_locked(&n.blocks, true);
            }
            self.relist(id);
        }
        self.node_mut(node_id).own_locks += 1;
        self.stamp_path(&path);
        Ok(())
    }

    /// Undoes one `lock(node_id)`; stamps the path. Refused for a node without locks of its own.
    pub fn unlock(&mut self, node_id: u64) -> KvResult<()> {
        self.check_node(node_id)?;
        if self.node(node_id).own_locks == 0 {
            return cache_err(format!("node {node_id} is not locked: cannot unlock"));
        }
        self.node_mut(node_id).own_locks -= 1;
        let path = self.path_to_root(node_id);
        for &id in &path {
            self.unlist(id);
            let n = self
                .nodes
                .get_mut(&id)
                .expect("node id from the tree itself");
            n.lock_count -= 1;
            if n.lock_count == 0 && id != ROOT {
                self.block_counts.set_locked(&n.blocks, false);
            }
            self.relist(id);
        }
        self.stamp_path(&path);
        Ok(())
    }

    /// Every node, sorted by id (`Memory` error if the host cannot hold the copy).
    pub fn nodes(&self) -> KvResult<Vec<RadixNode>> {
        let mut ids = try_collect(self.nodes.keys().copied(), "the node ids")?;
        ids.sort_unstable();
        let mut out = Vec::new();
        try_reserve(&mut out, ids.len(), "the nodes")?;
        for id in ids {
            let n = self.node(id);
            out.push(RadixNode {
                node_id: id,
                parent_id: (id != ROOT).then_some(n.parent),
                token_ids: try_to_vec(&n.tokens, "a node's tokens")?,
                block_ids: try_to_vec(&n.blocks, "a node's blocks")?,
                lock_count: n.lock_count,
                stamp: n.stamp,
            });
        }
        Ok(out)
    }
}

mod block_counts;
mod check;
mod evict;
mod insert;

#[cfg(test)]
mod tests;
