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
//! so that it can tell how many distinct blocks only unlocked nodes reference. Recency: a logical clock ticks once per `insert`, `lock`
//! and `unlock`, which stamp every node from the root to the node concerned, so a parent's stamp
//! is never older than its children's. `evict` removes unlocked leaves, least recent stamp
//! first (ties: lower id). A call that errors changes nothing.

use std::collections::{BTreeSet, HashMap};

use crate::error::{cache_err, KvError, KvResult, MAX_BLOCK_ID};
use crate::hash::FastBuild;

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

/// References to one block: from every node, and from nodes with `lock_count > 0`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct BlockRefs {
    refs: u64,
    locked: u64,
}

/// Per distinct block, its [`BlockRefs`]; and how many of those blocks no locked node
/// references. Invariant: a block is in the map iff some node references it.
#[derive(Debug, Clone, Default)]
struct BlockCounts {
    map: HashMap<u32, BlockRefs, FastBuild>,
    num_unlocked_only: u64,
}

impl BlockCounts {
    /// Changes the counts of block `b`, keeping `num_unlocked_only` in step.
    fn update(&mut self, b: u32, f: impl FnOnce(&mut BlockRefs)) {
        let e = self.map.entry(b).or_default();
        let was = e.refs > 0 && e.locked == 0;
        f(e);
        let is = e.refs > 0 && e.locked == 0;
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
    fn add(&mut self, blocks: &[u32], locked: bool) {
        for &b in blocks {
            self.update(b, |e| {
                e.refs += 1;
                e.locked += u64::from(locked);
            });
        }
    }

    /// A node whose lock status is `locked` drops its references to `blocks`.
    fn remove(&mut self, blocks: &[u32], locked: bool) {
        for &b in blocks {
            self.update(b, |e| {
                e.refs -= 1;
                e.locked -= u64::from(locked);
            });
        }
    }

    /// A node holding `blocks` became locked (`true`) or unlocked (`false`).
    fn set_locked(&mut self, blocks: &[u32], locked: bool) {
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

#[derive(Debug, Clone)]
pub struct RadixTree {
    block_size: u64,
    nodes: HashMap<u64, Node, FastBuild>,
    /// Next node id; ids are never reused.
    next_id: u64,
    clock: u64,
    /// (stamp, id) of every non-root leaf with lock_count 0: the eviction candidates.
    evictable: BTreeSet<(u64, u64)>,
    num_tokens: u64,
    num_block_refs: u64,
    /// References held by non-root nodes with lock_count 0 (what `evict` could release).
    num_evictable_refs: u64,
    /// References per distinct block.
    block_counts: BlockCounts,
}

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
            num_tokens: 0,
            num_block_refs: 0,
            num_evictable_refs: 0,
            block_counts: BlockCounts::default(),
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Nodes, the root included.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Tokens stored over all edges.
    pub fn num_tokens(&self) -> u64 {
        self.num_tokens
    }

    /// Block references held by all nodes.
    pub fn num_block_refs(&self) -> u64 {
        self.num_block_refs
    }

    /// References `evict` could release: those of non-root nodes with lock_count 0.
    pub fn evictable_block_refs(&self) -> u64 {
        self.num_evictable_refs
    }

    /// Distinct blocks that nodes with lock_count 0 reference and no other node does: those
    /// evicting every unlocked node would take all the tree's references off. A block straddling
    /// two nodes counts once.
    pub fn num_evictable_blocks(&self) -> u64 {
        self.block_counts.num_unlocked_only
    }

    pub fn has_node(&self, node_id: u64) -> bool {
        self.nodes.contains_key(&node_id)
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

    /// Takes the node out of the eviction set before a change to its stamp, locks or children.
    fn unlist(&mut self, id: u64) {
        let stamp = self.node(id).stamp;
        self.evictable.remove(&(stamp, id));
    }

    /// Puts the node back in the eviction set if it is a candidate after the change.
    fn relist(&mut self, id: u64) {
        if self.is_candidate(id) {
            let stamp = self.node(id).stamp;
            self.evictable.insert((stamp, id));
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

    /// The longest prefix of `token_ids` stored in the tree, at token granularity. Pure.
    pub fn match_prefix(&self, token_ids: &[u32]) -> RadixMatch {
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
        RadixMatch {
            num_tokens: pos as u64,
            block_ids,
            node_id,
        }
    }

    /// Stores `token_ids`; the token at position p lives in `block_ids[p / block_size]`. Nodes
    /// already on the path keep their own blocks; new nodes reference the caller's blocks.
    pub fn insert(&mut self, token_ids: &[u32], block_ids: &[u32]) -> KvResult<InsertResult> {
        if let Some(b) = block_ids.iter().find(|&&b| b > MAX_BLOCK_ID) {
            return Err(KvError::Value(format!("block id {b} is not in [0, 2**31)")));
        }
        let len = token_ids.len() as u64;
        let need = len / self.block_size + u64::from(len % self.block_size != 0);
        if (block_ids.len() as u64) < need {
            return Err(KvError::Value(format!(
                "block_ids holds {} blocks, fewer than the {need} that {len} tokens need",
                block_ids.len()
            )));
        }
        // Nothing below fails.
        let mut refs = Vec::new();
        let mut num_new_tokens = 0u64;
        let mut path = vec![ROOT];
        let mut node_id = ROOT;
        let mut pos = 0usize;
        while pos < token_ids.len() {
            let rest = &token_ids[pos..];
            let child = match self.node(node_id).children.get(&rest[0]) {
                Some(&c) => c,
                None => {
                    node_id = self.add_leaf(node_id, pos as u64, rest, block_ids, &mut refs);
                    num_new_tokens = rest.len() as u64;
                    path.push(node_id);
                    break;
                }
            };
            let edge_len = self.node(child).tokens.len();
            let k = common_prefix(&self.node(child).tokens, rest);
            pos += k;
            if k == edge_len || pos == token_ids.len() {
                // The whole edge matched, or the sequence ends inside it: no split needed.
                node_id = child;
            } else {
                node_id = self.split(child, k, &mut refs);
            }
            path.push(node_id);
        }
        path.reverse();
        self.stamp_path(&path);
        Ok(InsertResult {
            num_new_tokens,
            new_block_refs: refs,
            node_id,
        })
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A new leaf under `parent` holding `tokens` from absolute position `start` (the parent's
    /// end), referencing the caller's blocks for that range.
    fn add_leaf(
        &mut self,
        parent: u64,
        start: u64,
        tokens: &[u32],
        block_ids: &[u32],
        refs: &mut Vec<u32>,
    ) -> u64 {
        let first = self.block_index(start) as usize;
        let count = self.span(start, start + tokens.len() as u64);
        let blocks = block_ids[first..first + count].to_vec();
        refs.extend_from_slice(&blocks);
        self.block_counts.add(&blocks, false);
        let id = self.take_id();
        self.unlist(parent);
        self.node_mut(parent).children.insert(tokens[0], id);
        self.relist(parent);
        self.num_tokens += tokens.len() as u64;
        self.num_block_refs += count as u64;
        self.num_evictable_refs += count as u64;
        let stamp = self.clock;
        self.nodes.insert(
            id,
            Node {
                parent,
                start,
                tokens: tokens.to_vec(),
                blocks,
                children: HashMap::default(),
                lock_count: 0,
                own_locks: 0,
                stamp,
            },
        );
        self.relist(id);
        id
    }

    /// Splits node `id` after `k` tokens (0 < k < edge length). The upper part becomes a new
    /// node with the original's lock count and stamp; `id` keeps the lower part and its own
    /// locks. A block straddling the split point gains a reference (pushed on `refs`).
    fn split(&mut self, id: u64, k: usize, refs: &mut Vec<u32>) -> u64 {
        let upper_id = self.take_id();
        let bs = self.block_size;
        let (parent, start, lock_count, stamp, first_token) = {
            let n = self.node(id);
            (n.parent, n.start, n.lock_count, n.stamp, n.tokens[0])
        };
        let mid = start + k as u64;
        let upper_count = self.span(start, mid);
        let lower_skip = (mid / bs - start / bs) as usize;
        let straddles = mid % bs != 0;
        self.unlist(id);
        let n = self.node_mut(id);
        let lower_tokens = n.tokens.split_off(k);
        let upper_tokens = std::mem::replace(&mut n.tokens, lower_tokens);
        let upper_blocks = n.blocks[..upper_count].to_vec();
        n.blocks.drain(..lower_skip);
        n.start = mid;
        n.parent = upper_id;
        let lower_first = n.tokens[0];
        if straddles {
            refs.push(upper_blocks[upper_count - 1]);
            self.block_counts
                .add(&upper_blocks[upper_count - 1..], lock_count > 0);
            self.num_block_refs += 1;
            if lock_count == 0 {
                self.num_evictable_refs += 1;
            }
        }
        self.relist(id);
        let mut children = HashMap::default();
        children.insert(lower_first, id);
        self.nodes.insert(
            upper_id,
            Node {
                parent,
                start,
                tokens: upper_tokens,
                blocks: upper_blocks,
                children,
                lock_count,
                own_locks: 0,
                stamp,
            },
        );
        self.node_mut(parent).children.insert(first_token, upper_id);
        upper_id
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
                self.num_evictable_refs -= n.blocks.len() as u64;
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
                self.num_evictable_refs += n.blocks.len() as u64;
                self.block_counts.set_locked(&n.blocks, false);
            }
            self.relist(id);
        }
        self.stamp_path(&path);
        Ok(())
    }

    /// Removes unlocked leaves, least recent stamp first (ties: lower id), a parent that becomes
    /// an unlocked leaf included, until at least `num_blocks` references were released or none
    /// is left to release; returns every released reference (the caller decrefs each once).
    pub fn evict(&mut self, num_blocks: u64) -> Vec<u32> {
        let mut released = Vec::new();
        while (released.len() as u64) < num_blocks {
            let Some((_, id)) = self.evictable.pop_first() else {
                break;
            };
            let node = self.nodes.remove(&id).expect("listed node exists");
            self.unlist(node.parent);
            self.node_mut(node.parent).children.remove(&node.tokens[0]);
            self.relist(node.parent);
            self.num_tokens -= node.tokens.len() as u64;
            self.num_block_refs -= node.blocks.len() as u64;
            self.num_evictable_refs -= node.blocks.len() as u64;
            self.block_counts.remove(&node.blocks, false);
            released.extend_from_slice(&node.blocks);
        }
        released
    }

    /// Every node, sorted by id.
    pub fn nodes(&self) -> Vec<RadixNode> {
        let mut ids: Vec<u64> = self.nodes.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter()
            .map(|id| {
                let n = self.node(id);
                RadixNode {
                    node_id: id,
                    parent_id: (id != ROOT).then_some(n.parent),
                    token_ids: n.tokens.clone(),
                    block_ids: n.blocks.clone(),
                    lock_count: n.lock_count,
                    stamp: n.stamp,
                }
            })
            .collect()
    }
}

mod check;

#[cfg(test)]
mod tests;
