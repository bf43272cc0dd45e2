//! `RadixTree::insert`: walking the path, splitting an edge the sequence leaves midway, adding
//! the new leaf, and letting a leaf that starts inside a block lend that block to its
//! ancestors.
//!
//! An insert is planned first, without changing the tree: the walk, the split, the new leaf,
//! the lending and the result are worked out, and every allocation they need (the edges and
//! block lists of the new nodes, room in the maps) is made, so that a host that cannot hold
//! them gets a `Memory` error with the tree unchanged. Committing the plan then allocates
//! nothing the caller's input sizes.

use std::collections::HashMap;

use super::{common_prefix, InsertResult, Node, RadixTree, ROOT};
use crate::error::{try_reserve, try_reserve_map, try_to_vec, try_with_capacity};
use crate::error::{KvError, KvResult, MAX_BLOCK_ID};
use crate::hash::FastBuild;

/// A split of node `id` after `k` tokens, its new parts made: the upper part becomes node
/// `upper_id`, `id` keeps the lower part.
struct SplitPlan {
    id: u64,
    k: usize,
    upper_id: u64,
    /// `id`'s edge from token `k` on, and its blocks before `lower_skip` dropped.
    lower_tokens: Vec<u32>,
    upper_blocks: Vec<u32>,
    lower_skip: usize,
    /// The upper part's children: room for the lower part and the new leaf.
    upper_children: HashMap<u32, u64, FastBuild>,
}

/// The new leaf: its id, parent, start and the caller's tokens and blocks for its range.
struct LeafPlan {
    id: u64,
    parent: u64,
    start: u64,
    tokens: Vec<u32>,
    blocks: Vec<u32>,
}

/// An insert worked out on the tree as it is, with what it needs allocated.
pub struct InsertPlan {
    split: Option<SplitPlan>,
    leaf: Option<LeafPlan>,
    /// The nodes (the split's upper part among them) whose last block becomes the leaf's
    /// first, from the parent up, and that old block.
    lend: Vec<u64>,
    lent: u32,
    /// The nodes to stamp, the root first.
    path: Vec<u64>,
    result: InsertResult,
}

impl InsertPlan {
    /// What the insert returns.
    pub fn result(&self) -> &InsertResult {
        &self.result
    }
}

/// What the lending walk needs of a node as the insert leaves it (before the lending).
#[derive(Clone, Copy)]
struct NodeView {
    start: u64,
    parent: u64,
    last_block: Option<u32>,
    first_block: Option<u32>,
    lock_count: u64,
    own_locks: u64,
    num_blocks: usize,
}

impl RadixTree {
    /// Stores `token_ids`; the token at position p lives in `block_ids[p / block_size]`. Nodes
    /// already on the path keep their own blocks; new nodes reference the caller's blocks,
    /// except where the new leaf starts inside a block: the caller's copy of that block holds
    /// the path's positions before the leaf too, so the ancestors referencing another copy of
    /// it (the copy-on-write source) take the caller's instead and release theirs
    /// (`released_block_refs`): one block, not two, for one range of positions. Errors
    /// (`Value`) for a block id above [`MAX_BLOCK_ID`] or fewer block ids than the tokens
    /// need, (`Memory`) if the host cannot hold the new nodes; an error changes nothing.
    pub fn insert(&mut self, token_ids: &[u32], block_ids: &[u32]) -> KvResult<InsertResult> {
        self.insert_then(token_ids, block_ids, |_| Ok::<_, KvError>(()))
            .map(|(_, r)| r)
    }

    /// [`insert`](Self::insert), its result shown to `emit` before the tree changes: returns
    /// what `emit` returns and the result, and changes the tree only if `emit` succeeds.
    pub fn insert_then<R, E: From<KvError>>(
        &mut self,
        token_ids: &[u32],
        block_ids: &[u32],
        emit: impl FnOnce(&InsertResult) -> Result<R, E>,
    ) -> Result<(R, InsertResult), E> {
        let plan = self.plan_insert(token_ids, block_ids)?;
        let r = emit(plan.result())?;
        Ok((r, self.commit_insert(plan)))
    }

    /// Works out an insert (see [`insert`](Self::insert)) without changing the tree; every
    /// error of the insert is raised here.
    pub fn plan_insert(&mut self, token_ids: &[u32], block_ids: &[u32]) -> KvResult<InsertPlan> {
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
        // The walk: down the path while the edges match; a split can only come last, right
        // before the new leaf (the sequence leaves the split edge where the leaf starts).
        let mut path = try_with_capacity(8, "the path")?;
        path.push(ROOT);
        let mut node_id = ROOT;
        let mut pos = 0usize;
        let mut split_at = None;
        let mut leaf_at = None;
        while pos < token_ids.len() {
            let rest = &token_ids[pos..];
            let Some(&child) = self.node(node_id).children.get(&rest[0]) else {
                leaf_at = Some(node_id);
                break;
            };
            let edge_len = self.node(child).tokens.len();
            let k = common_prefix(&self.node(child).tokens, rest);
            pos += k;
            try_reserve(&mut path, 1, "the path")?;
            if k == edge_len || pos == token_ids.len() {
                // The whole edge matched, or the sequence ends inside it: no split needed.
                node_id = child;
                path.push(child);
            } else {
                split_at = Some((child, k));
                node_id = self.next_id;
                path.push(node_id);
                leaf_at = Some(node_id);
                break;
            }
        }
        let split = match split_at {
            Some((id, k)) => Some(self.plan_split(id, k)?),
            None => None,
        };
        let mut refs = Vec::new();
        let mut leaf = None;
        let mut lend = Vec::new();
        let mut lent = 0;
        let mut released = Vec::new();
        let mut num_new_tokens = 0;
        if let Some(parent) = leaf_at {
            let id = self.next_id + u64::from(split.is_some());
            let start = pos as u64;
            let first = self.block_index(start) as usize;
            let count = self.span(start, len);
            let plan = LeafPlan {
                id,
                parent,
                start,
                tokens: try_to_vec(&token_ids[pos..], "the new leaf's tokens")?,
                blocks: try_to_vec(&block_ids[first..first + count], "the new leaf's blocks")?,
            };
            num_new_tokens = len - start;
            (lend, lent) = self.plan_lend(&plan, split.as_ref())?;
            let straddle = split.as_ref().and_then(|s| self.straddling_block(s));
            refs = try_with_capacity(
                usize::from(straddle.is_some()) + count + lend.len(),
                "the new block references",
            )?;
            refs.extend(straddle);
            refs.extend_from_slice(&plan.blocks);
            refs.extend(std::iter::repeat(plan.blocks[0]).take(lend.len()));
            released = try_with_capacity(lend.len(), "the released block references")?;
            released.extend(std::iter::repeat(lent).take(lend.len()));
            try_reserve_map(&mut self.block_counts.map, count, "the block counts")?;
            try_reserve_map(&mut self.nodes, 2, "the nodes")?;
            if split.is_none() {
                let p = self
                    .nodes
                    .get_mut(&parent)
                    .expect("node id from the tree itself");
                try_reserve_map(&mut p.children, 1, "a node's children")?;
            }
            try_reserve(&mut path, 1, "the path")?;
            path.push(id);
            node_id = id;
            leaf = Some(plan);
        }
        // A reference released to one the call itself created (a split's straddling block,
        // which the new leaf's copy then replaced) is no change: both are left out.
        released.retain(|b| match refs.iter().rposition(|r| r == b) {
            Some(i) => {
                refs.remove(i);
                false
            }
            None => true,
        });
        path.reverse();
        Ok(InsertPlan {
            split,
            leaf,
            lend,
            lent,
            path,
            result: InsertResult {
                num_new_tokens,
                new_block_refs: refs,
                node_id,
                released_block_refs: released,
            },
        })
    }

    /// Applies a plan made by [`plan_insert`](Self::plan_insert) on the tree as it still
    /// is; returns the insert's result.
    pub fn commit_insert(&mut self, plan: InsertPlan) -> InsertResult {
        let InsertPlan {
            split,
            leaf,
            lend,
            lent,
            path,
            result,
        } = plan;
        if let Some(s) = split {
            let upper_id = self.commit_split(s);
            self.next_id = upper_id + 1;
        }
        if let Some(leaf) = leaf {
            let new = leaf.blocks[0];
            self.commit_leaf(leaf);
            for id in lend {
                let n = self.node_mut(id);
                let last = n.blocks.len() - 1;
                n.blocks[last] = new;
                let locked = n.lock_count > 0;
                self.block_counts.add(&[new], locked);
                self.block_counts.remove(&[lent], locked);
            }
        }
        self.stamp_path(&path);
        result
    }

    /// The parts of node `id` split after `k` tokens (0 < k < edge length), made.
    fn plan_split(&mut self, id: u64, k: usize) -> KvResult<SplitPlan> {
        let bs = self.block_size;
        let n = self.node(id);
        let mid = n.start + k as u64;
        let upper_count = self.span(n.start, mid);
        let lower_skip = (mid / bs - n.start / bs) as usize;
        let lower_tokens = try_to_vec(&n.tokens[k..], "a split edge")?;
        let upper_blocks = try_to_vec(&n.blocks[..upper_count], "a split edge's blocks")?;
        let mut upper_children = HashMap::default();
        try_reserve_map(&mut upper_children, 2, "a node's children")?;
        Ok(SplitPlan {
            id,
            k,
            upper_id: self.next_id,
            lower_tokens,
            upper_blocks,
            lower_skip,
            upper_children,
        })
    }

    /// The block a split's point lies inside, which gains a reference (None on a block
    /// boundary).
    fn straddling_block(&self, s: &SplitPlan) -> Option<u32> {
        let mid = self.node(s.id).start + s.k as u64;
        (mid % self.block_size != 0).then(|| *s.upper_blocks.last().expect("k > 0"))
    }

    /// Splits node `s.id` after `s.k` tokens. The upper part becomes the new node
    /// `s.upper_id` with the original's lock count and stamp; `s.id` keeps the lower part
    /// and its own locks. A block straddling the split point gains a reference.
    fn commit_split(&mut self, s: SplitPlan) -> u64 {
        let SplitPlan {
            id,
            k,
            upper_id,
            lower_tokens,
            upper_blocks,
            lower_skip,
            mut upper_children,
        } = s;
        let straddle = {
            let mid = self.node(id).start + k as u64;
            (mid % self.block_size != 0).then(|| upper_blocks[upper_blocks.len() - 1])
        };
        let (parent, start, lock_count, stamp, first_token) = {
            let n = self.node(id);
            (n.parent, n.start, n.lock_count, n.stamp, n.tokens[0])
        };
        self.unlist(id);
        let n = self.node_mut(id);
        let mut upper_tokens = std::mem::replace(&mut n.tokens, lower_tokens);
        upper_tokens.truncate(k);
        n.blocks.drain(..lower_skip);
        n.start = start + k as u64;
        n.parent = upper_id;
        let lower_first = n.tokens[0];
        if let Some(b) = straddle {
            self.block_counts.add(&[b], lock_count > 0);
        }
        self.relist(id);
        upper_children.insert(lower_first, id);
        self.nodes.insert(
            upper_id,
            Node {
                parent,
                start,
                tokens: upper_tokens,
                blocks: upper_blocks,
                children: upper_children,
                lock_count,
                own_locks: 0,
                stamp,
            },
        );
        self.node_mut(parent).children.insert(first_token, upper_id);
        upper_id
    }

    /// Adds the planned leaf under its parent (its tokens and blocks made by the plan).
    fn commit_leaf(&mut self, leaf: LeafPlan) {
        let LeafPlan {
            id,
            parent,
            start,
            tokens,
            blocks,
        } = leaf;
        self.block_counts.add(&blocks, false);
        self.unlist(parent);
        self.node_mut(parent).children.insert(tokens[0], id);
        self.relist(parent);
        let stamp = self.clock;
        self.nodes.insert(
            id,
            Node {
                parent,
                start,
                tokens,
                blocks,
                children: HashMap::default(),
                lock_count: 0,
                own_locks: 0,
                stamp,
            },
        );
        self.relist(id);
        self.next_id = id + 1;
    }

    /// A node as the insert leaves it before the lending: the split's upper part as the
    /// plan makes it, any other node as it is.
    fn view(&self, id: u64, split: Option<&SplitPlan>) -> NodeView {
        match split {
            Some(s) if s.upper_id == id => {
                let original = self.node(s.id);
                NodeView {
                    start: original.start,
                    parent: original.parent,
                    last_block: s.upper_blocks.last().copied(),
                    first_block: s.upper_blocks.first().copied(),
                    lock_count: original.lock_count,
                    own_locks: 0,
                    num_blocks: s.upper_blocks.len(),
                }
            }
            _ => {
                let n = self.node(id);
                NodeView {
                    start: n.start,
                    parent: n.parent,
                    last_block: n.blocks.last().copied(),
                    first_block: n.blocks.first().copied(),
                    lock_count: n.lock_count,
                    own_locks: n.own_locks,
                    num_blocks: n.blocks.len(),
                }
            }
        }
    }

    /// Where the new leaf starts inside a block, its first block replaces another id for
    /// that block's index in its parent, and up through every ancestor that starts inside
    /// that block too and references that same other id, as long as no lock needs the other
    /// id: a lock taken on the ancestor itself (its request holds the ancestor's blocks) or
    /// on a child that starts with the other id. Returns those nodes, from the parent up, and
    /// the other id.
    fn plan_lend(&self, leaf: &LeafPlan, split: Option<&SplitPlan>) -> KvResult<(Vec<u64>, u32)> {
        let bs = self.block_size;
        let mut lend = Vec::new();
        if leaf.start % bs == 0 {
            return Ok((lend, 0));
        }
        let first_pos = leaf.start / bs * bs;
        let new = leaf.blocks[0];
        let Some(old) = self.view(leaf.parent, split).last_block else {
            return Ok((lend, 0));
        };
        if old == new {
            return Ok((lend, 0));
        }
        // The child on the way up whose first block the lending may have changed: (the id
        // its parent's children map holds now, its lock count, its first block after).
        let mut below: Option<(u64, u64, Option<u32>)> = None;
        let mut cur = leaf.parent;
        loop {
            let v = self.view(cur, split);
            if !self.can_lend(cur, &v, old, split, below) {
                break;
            }
            try_reserve(&mut lend, 1, "the lending nodes")?;
            lend.push(cur);
            if v.start <= first_pos || v.parent == ROOT {
                break;
            }
            let first_after = if v.num_blocks == 1 {
                Some(new)
            } else {
                v.first_block
            };
            // The parent's map still names the split node where the upper part will be.
            let key = match split {
                Some(s) if s.upper_id == cur => s.id,
                _ => cur,
            };
            below = Some((key, v.lock_count, first_after));
            cur = v.parent;
        }
        Ok((lend, old))
    }

    /// Whether node `id` (as `v` shows it) ends in block `old` and no lock needs it there:
    /// none on the node itself, none below a child whose first block is `old` (the children
    /// as the insert leaves them: the split's lower part under its upper part, `below` as
    /// the lending left it; the new leaf holds no lock).
    fn can_lend(
        &self,
        id: u64,
        v: &NodeView,
        old: u32,
        split: Option<&SplitPlan>,
        below: Option<(u64, u64, Option<u32>)>,
    ) -> bool {
        if v.last_block != Some(old) || v.own_locks != 0 {
            return false;
        }
        let needs_old = |lock_count: u64, first: Option<u32>| lock_count > 0 && first == Some(old);
        if let Some(s) = split.filter(|s| s.upper_id == id) {
            // The upper part's one child is the lower part of the split node.
            let lower = self.node(s.id);
            return !needs_old(lower.lock_count, lower.blocks.get(s.lower_skip).copied());
        }
        self.node(id).children.values().all(|&c| match below {
            Some((key, lock_count, first)) if key == c => !needs_old(lock_count, first),
            _ => {
                let child = self.node(c);
                !needs_old(child.lock_count, child.blocks.first().copied())
            }
        })
    }
}
