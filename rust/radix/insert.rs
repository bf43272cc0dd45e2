//! `RadixTree::insert`: walking the path, splitting an edge the sequence leaves midway, adding
//! the new leaf, and letting a leaf that starts inside a block lend that block to its
//! ancestors.

use std::collections::HashMap;

use super::{common_prefix, InsertResult, Node, RadixTree, ROOT};
use crate::error::{KvError, KvResult, MAX_BLOCK_ID};

impl RadixTree {
    /// Stores `token_ids`; the token at position p lives in `block_ids[p / block_size]`. Nodes
    /// already on the path keep their own blocks; new nodes reference the caller's blocks,
    /// except where the new leaf starts inside a block: the caller's copy of that block holds
    /// the path's positions before the leaf too, so the ancestors referencing another copy of
    /// it (the copy-on-write source) take the caller's instead and release theirs
    /// (`released_block_refs`): one block, not two, for one range of positions.
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
        let mut released = Vec::new();
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
                    self.lend_first_block(node_id, &mut refs, &mut released);
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
        self.stamp_path(&path);
        Ok(InsertResult {
            num_new_tokens,
            new_block_refs: refs,
            node_id,
            released_block_refs: released,
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

    /// Where the leaf `id` starts inside a block, its first block replaces another id for that
    /// block's index in its parent, and up through every ancestor that starts inside that
    /// block too and references that same other id, as long as no lock needs the other id:
    /// a lock taken on the ancestor itself (its request holds the ancestor's blocks) or on a
    /// child that starts with the other id. Each replacement is a reference gained (pushed on
    /// `refs`) and one released (pushed on `released`).
    fn lend_first_block(&mut self, id: u64, refs: &mut Vec<u32>, released: &mut Vec<u32>) {
        let bs = self.block_size;
        let (start, parent, new) = {
            let n = self.node(id);
            (n.start, n.parent, n.blocks[0])
        };
        if start % bs == 0 {
            return;
        }
        let first_pos = start / bs * bs;
        let Some(&old) = self.node(parent).blocks.last() else {
            return;
        };
        if old == new {
            return;
        }
        let mut cur = parent;
        loop {
            if !self.can_lend(cur, old) {
                break;
            }
            let n = self.node_mut(cur);
            let last = n.blocks.len() - 1;
            n.blocks[last] = new;
            let (locked, n_start, n_parent) = (n.lock_count > 0, n.start, n.parent);
            self.block_counts.add(&[new], locked);
            self.block_counts.remove(&[old], locked);
            refs.push(new);
            released.push(old);
            if n_start <= first_pos || n_parent == ROOT {
                break;
            }
            cur = n_parent;
        }
    }

    /// Whether node `id` ends in block `old` and no lock needs it there: none on the node
    /// itself, none below a child whose first block is `old`.
    fn can_lend(&self, id: u64, old: u32) -> bool {
        let n = self.node(id);
        n.blocks.last() == Some(&old)
            && n.own_locks == 0
            && n.children.values().all(|&c| {
                let child = self.node(c);
                child.lock_count == 0 || child.blocks[0] != old
            })
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
}
