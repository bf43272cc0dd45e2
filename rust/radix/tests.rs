//! Unit tests of the radix tree (module `radix`).

use super::*;
use crate::error::MAX_BLOCK_ID;

fn tree(bs: u64) -> RadixTree {
    RadixTree::new(bs).unwrap()
}

fn cache_msg<T: std::fmt::Debug>(r: KvResult<T>) -> String {
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

fn node(id: u64, parent: Option<u64>, t: &[u32], b: &[u32], locks: u64, stamp: u64) -> RadixNode {
    RadixNode {
        node_id: id,
        parent_id: parent,
        token_ids: t.to_vec(),
        block_ids: b.to_vec(),
        lock_count: locks,
        stamp,
    }
}

fn m(num_tokens: u64, block_ids: &[u32], node_id: u64) -> RadixMatch {
    RadixMatch {
        num_tokens,
        block_ids: block_ids.to_vec(),
        node_id,
    }
}

/// Nodes (the root included), tokens and block references of the tree, counted from its
/// nodes.
fn totals(t: &RadixTree) -> (usize, u64, u64) {
    let nodes = t.nodes().unwrap();
    let tokens = nodes.iter().map(|n| n.token_ids.len() as u64).sum();
    let refs = nodes.iter().map(|n| n.block_ids.len() as u64).sum();
    (nodes.len(), tokens, refs)
}

/// References `evict` could release: those of non-root nodes with lock_count 0.
fn evictable_refs(t: &RadixTree) -> u64 {
    t.nodes()
        .unwrap()
        .iter()
        .filter(|n| n.parent_id.is_some() && n.lock_count == 0)
        .map(|n| n.block_ids.len() as u64)
        .sum()
}

/// Tokens 0..10 and a sequence sharing the first 6 of them, 12 tokens long.
fn seqs() -> (Vec<u32>, Vec<u32>) {
    let a: Vec<u32> = (0..10).collect();
    let mut b: Vec<u32> = (0..6).collect();
    b.extend(100..106);
    (a, b)
}

/// The example of the stub: block_size 4, a mid-block split at position 6. The new leaf's
/// block 20 holds positions [4, 8) of B, [4, 6) shared with A: the upper half of the split
/// takes it instead of A's block 8 (the split's reference to 8 is not made).
fn split_example() -> RadixTree {
    let (a, b) = seqs();
    let mut t = tree(4);
    let r = t.insert(&a, &[7, 8, 9]).unwrap();
    assert_eq!(
        r,
        InsertResult {
            num_new_tokens: 10,
            new_block_refs: vec![7, 8, 9],
            node_id: 1,
            released_block_refs: vec![],
        }
    );
    let r = t.insert(&b, &[7, 20, 21]).unwrap();
    assert_eq!(
        r,
        InsertResult {
            num_new_tokens: 6,
            new_block_refs: vec![20, 21, 20],
            node_id: 3,
            released_block_refs: vec![],
        }
    );
    t.check_integrity().unwrap();
    t
}

#[test]
fn new_tree() {
    let t = tree(4);
    assert_eq!(t.block_size(), 4);
    assert_eq!(totals(&t), (1, 0, 0));
    assert_eq!(evictable_refs(&t), 0);
    assert_eq!(t.nodes().unwrap(), vec![node(0, None, &[], &[], 0, 0)]);
    assert_eq!(t.match_prefix(&[1, 2]).unwrap(), m(0, &[], 0));
    assert!(t.nodes.contains_key(&0) && !t.nodes.contains_key(&1));
    t.check_integrity().unwrap();
    assert_eq!(
        value_msg(RadixTree::new(0)),
        "block_size must be in [1, 2**64), got 0"
    );
}

#[test]
fn mid_block_split() {
    let (a, b) = seqs();
    let mut t = split_example();
    assert_eq!(
        t.nodes().unwrap(),
        vec![
            node(0, None, &[], &[], 0, 2),
            node(1, Some(2), &a[6..], &[8, 9], 0, 1),
            node(2, Some(0), &a[..6], &[7, 20], 0, 2),
            node(3, Some(2), &b[6..], &[20, 21], 0, 2),
        ]
    );
    assert_eq!(totals(&t), (4, 16, 6));
    assert_eq!(evictable_refs(&t), 6);
    assert_eq!(t.match_prefix(&a).unwrap(), m(10, &[7, 8, 9], 1));
    assert_eq!(t.match_prefix(&b).unwrap(), m(12, &[7, 20, 21], 3));
    assert_eq!(t.match_prefix(&a[..5]).unwrap(), m(5, &[7, 20], 2));
    assert_eq!(t.match_prefix(&b[..7]).unwrap(), m(7, &[7, 20], 3));
    assert_eq!(t.match_prefix(&a[..4]).unwrap(), m(4, &[7], 2));
    let mut longer = a.clone();
    longer.extend([1, 2, 3]);
    assert_eq!(t.match_prefix(&longer).unwrap(), m(10, &[7, 8, 9], 1));
    assert_eq!(t.match_prefix(&[0, 1, 2, 99]).unwrap(), m(3, &[7], 2));
    assert_eq!(t.match_prefix(&[5]).unwrap(), m(0, &[], 0));
    assert_eq!(t.match_prefix(&[]).unwrap(), m(0, &[], 0));
    // Oldest leaf first: node 1 (stamp 1) loses its last block, 9, and keeps [6, 8).
    assert_eq!(t.evict(1).unwrap(), vec![9]);
    assert_eq!(t.match_prefix(&a).unwrap(), m(8, &[7, 8], 1));
    t.check_integrity().unwrap();
    // Then node 1's block 8, node 3 tail first (its 20 frees no block: node 2 references it
    // too, so eviction goes on), and its parent 2, which became a leaf.
    assert_eq!(t.evict(100).unwrap(), vec![8, 21, 20, 20, 7]);
    assert_eq!(t.nodes().unwrap(), vec![node(0, None, &[], &[], 0, 2)]);
    assert_eq!((totals(&t).1, totals(&t).2), (0, 0));
    t.check_integrity().unwrap();
}

#[test]
fn split_on_a_block_boundary_adds_no_reference() {
    let mut t = tree(4);
    let a: Vec<u32> = (0..12).collect();
    let mut b: Vec<u32> = (0..8).collect();
    b.push(50);
    t.insert(&a, &[1, 2, 3]).unwrap();
    let r = t.insert(&b, &[1, 2, 4]).unwrap();
    assert_eq!(r.new_block_refs, vec![4]);
    assert_eq!(r.num_new_tokens, 1);
    let ns = t.nodes().unwrap();
    assert_eq!(ns[1].block_ids, vec![3]);
    assert_eq!(ns[2].block_ids, vec![1, 2]);
    assert_eq!(totals(&t).2, 4);
    t.check_integrity().unwrap();
}

#[test]
fn insert_existing_or_prefix_adds_nothing_but_stamps() {
    let (a, _) = seqs();
    let mut t = tree(4);
    t.insert(&a, &[7, 8, 9]).unwrap();
    let r = t.insert(&a[..3], &[40]).unwrap();
    assert_eq!(
        r,
        InsertResult {
            num_new_tokens: 0,
            new_block_refs: vec![],
            node_id: 1,
            released_block_refs: vec![],
        }
    );
    assert_eq!(totals(&t).0, 2); // no split for a sequence ending inside an edge
    assert_eq!(t.nodes().unwrap()[1].stamp, 2);
    let r = t.insert(&[], &[]).unwrap();
    assert_eq!(r.node_id, ROOT);
    assert_eq!(t.nodes().unwrap()[0].stamp, 3);
    // Extending a leaf adds a child, not a longer edge; the caller's blocks for the new range.
    // The child starts inside block 2, whose copy 30 holds the leaf's positions [8, 10) too:
    // node 1 takes it and releases its own 9.
    let mut longer = a.clone();
    longer.extend([10, 11, 12]);
    let r = t.insert(&longer, &[0, 0, 30, 31]).unwrap();
    assert_eq!(r.new_block_refs, vec![30, 31, 30]);
    assert_eq!(r.released_block_refs, vec![9]);
    assert_eq!(r.node_id, 2);
    assert_eq!(t.nodes().unwrap()[1].block_ids, vec![7, 8, 30]);
    assert_eq!(t.match_prefix(&longer).unwrap(), m(13, &[7, 8, 30, 31], 2));
    t.check_integrity().unwrap();
}

#[test]
fn insert_errors_change_nothing() {
    let mut t = split_example();
    let before = t.nodes().unwrap();
    assert_eq!(
        value_msg(t.insert(&[1, 2, 3, 4, 5], &[1])),
        "block_ids holds 1 blocks, fewer than the 2 that 5 tokens need"
    );
    assert_eq!(
        value_msg(t.insert(&[1], &[MAX_BLOCK_ID + 1])),
        "block id 2147483648 is not in [0, 2**31)"
    );
    assert_eq!(t.nodes().unwrap(), before);
    // Extra blocks are ignored.
    t.insert(&[1], &[5, 6]).unwrap();
    t.check_integrity().unwrap();
}

#[test]
fn locks_protect_and_propagate() {
    let (a, b) = seqs();
    let mut t = split_example();
    t.lock(3).unwrap();
    let ns = t.nodes().unwrap();
    assert_eq!(
        (ns[0].lock_count, ns[2].lock_count, ns[3].lock_count),
        (1, 1, 1)
    );
    assert_eq!(ns[1].lock_count, 0);
    assert_eq!((ns[0].stamp, ns[2].stamp, ns[3].stamp), (3, 3, 3));
    assert_eq!(evictable_refs(&t), 2);
    // Only node 1 can go, tail first.
    assert_eq!(t.num_evictable_blocks(), 2);
    assert_eq!(t.evict(10).unwrap(), vec![9, 8]);
    assert_eq!(t.evict(10).unwrap(), Vec::<u32>::new());
    assert_eq!(t.match_prefix(&a).unwrap(), m(6, &[7, 20], 2));
    assert_eq!(t.match_prefix(&b).unwrap().num_tokens, 12);
    assert_eq!(
        cache_msg(t.unlock(2)),
        "node 2 is not locked: cannot unlock"
    );
    assert_eq!(cache_msg(t.lock(1)), "unknown node 1");
    assert_eq!(cache_msg(t.unlock(99)), "unknown node 99");
    t.unlock(3).unwrap();
    assert_eq!(evictable_refs(&t), 4);
    assert_eq!(
        cache_msg(t.unlock(3)),
        "node 3 is not locked: cannot unlock"
    );
    t.check_integrity().unwrap();
    // Locking the root is allowed and protects nothing.
    t.lock(ROOT).unwrap();
    assert_eq!(evictable_refs(&t), 4);
    t.unlock(ROOT).unwrap();
    // A split of a locked node: the upper part inherits its lock count. Node 4 (under 2)
    // starts inside block 1 with A's block 8, which node 2 takes back (no lock needs its 20).
    let r = t.insert(&a, &[7, 8, 9]).unwrap();
    assert_eq!(
        (r.new_block_refs, r.released_block_refs, r.node_id),
        (vec![8, 9, 8], vec![20], 4)
    );
    t.lock(4).unwrap();
    let mut c: Vec<u32> = (0..3).collect();
    c.push(77);
    // Node 6 starts inside block 0, but the locked lower part (node 2, held by node 4's lock)
    // starts with the upper part's block 7: the upper part keeps it.
    let r = t.insert(&c, &[60]).unwrap();
    assert_eq!(r.new_block_refs, vec![7, 60]);
    assert_eq!(r.released_block_refs, Vec::<u32>::new());
    let upper = t
        .nodes()
        .unwrap()
        .into_iter()
        .find(|n| n.node_id == 5)
        .unwrap();
    assert_eq!((upper.token_ids, upper.lock_count), (vec![0, 1, 2], 1));
    assert_eq!(evictable_refs(&t), 3); // node 3 (20, 21) and node 6 (60)
    t.check_integrity().unwrap();
    t.unlock(4).unwrap();
    t.check_integrity().unwrap();
}

#[test]
fn evict_order_is_stamp_then_id() {
    let mut t = tree(2);
    t.insert(&[1, 1], &[10]).unwrap(); // node 1, stamp 1
    t.insert(&[2, 2], &[20]).unwrap(); // node 2, stamp 2
    t.insert(&[3, 3], &[30]).unwrap(); // node 3, stamp 3
    t.lock(1).unwrap(); // stamp 4
    t.unlock(1).unwrap(); // stamp 5: node 1 is now the most recent
    assert_eq!(evictable_refs(&t), 3);
    assert_eq!(t.evict(2).unwrap(), vec![20, 30]);
    assert_eq!(t.evict(0).unwrap(), Vec::<u32>::new());
    assert_eq!(t.evict(u64::MAX).unwrap(), vec![10]);
    t.check_integrity().unwrap();
}

#[test]
fn evict_releases_exactly_what_was_asked_from_the_tail() {
    let mut t = tree(1);
    t.insert(&[1, 2, 3], &[4, 5, 6]).unwrap();
    t.insert(&[9], &[7]).unwrap();
    // The oldest leaf holds three blocks: a request for one trims its last one only.
    assert_eq!(t.evict(1).unwrap(), vec![6]);
    assert_eq!(t.match_prefix(&[1, 2, 3]).unwrap(), m(2, &[4, 5], 1));
    t.check_integrity().unwrap();
    // The trimmed leaf keeps its stamp, so it goes on first, tail first, before node 2.
    assert_eq!(t.evict(2).unwrap(), vec![5, 4]);
    assert_eq!(t.nodes().unwrap().len(), 2);
    assert_eq!(t.evict(1).unwrap(), vec![7]);
    t.check_integrity().unwrap();
}

#[test]
fn evict_cuts_an_edge_back_to_a_block_boundary() {
    let mut t = tree(4);
    // [0, 10) in blocks 7, 8, 9: a trim of block 9 leaves [0, 8); of 8, [0, 4).
    let a: Vec<u32> = (0..10).collect();
    t.insert(&a, &[7, 8, 9]).unwrap();
    assert_eq!(t.evict(1).unwrap(), vec![9]);
    assert_eq!(t.nodes().unwrap()[1].token_ids, a[..8].to_vec());
    assert_eq!(t.evict(1).unwrap(), vec![8]);
    assert_eq!(t.nodes().unwrap()[1].token_ids, a[..4].to_vec());
    assert_eq!(t.match_prefix(&a).unwrap(), m(4, &[7], 1));
    t.check_integrity().unwrap();
    // A leaf starting inside a block: node 1 holds [0, 6) in blocks 7, 8, node 2 [6, 9) in
    // 8, 9. Trimming node 2 down to block 8, which its parent references too, releases that
    // reference and removes node 2 but frees no block, so the eviction goes on to the
    // parent's last block.
    let mut t = tree(4);
    t.insert(&a[..6], &[7, 8]).unwrap();
    t.insert(&a[..9], &[7, 8, 9]).unwrap();
    assert_eq!(t.num_evictable_blocks(), 3);
    assert_eq!(t.evict(1).unwrap(), vec![9]);
    assert_eq!(t.evict(1).unwrap(), vec![8, 8]);
    assert_eq!(t.nodes().unwrap().len(), 2);
    assert_eq!(t.match_prefix(&a).unwrap(), m(4, &[7], 1));
    t.check_integrity().unwrap();
    // With the parent locked, block 8 is not evictable: only 9 goes, node 2 keeps [6, 8).
    let mut t = tree(4);
    let r = t.insert(&a[..6], &[7, 8]).unwrap();
    t.insert(&a[..9], &[7, 8, 9]).unwrap();
    t.lock(r.node_id).unwrap();
    assert_eq!(t.num_evictable_blocks(), 1);
    assert_eq!(t.evict(5).unwrap(), vec![9]);
    assert_eq!(t.match_prefix(&a).unwrap(), m(8, &[7, 8], 2));
    assert_eq!(t.evict(5).unwrap(), Vec::<u32>::new());
    t.check_integrity().unwrap();
}

#[test]
fn evict_lowers_the_evictable_count_by_exactly_what_was_asked() {
    // Shared prefixes, splits inside blocks, some paths locked: every evict(n) takes
    // min(n, num_evictable_blocks) off the count, and the references it returns are the ones
    // the nodes gave up.
    for bs in 1..=5u64 {
        let mut t = tree(bs);
        let mut next = 0u32;
        let mut locked = Vec::new();
        for i in 0..40u32 {
            let cut = ((i * 7) % 23) as usize;
            let mut s: Vec<u32> = (0..cut as u32).collect();
            s.extend([1000 + i % 5, i % 3, 7]);
            let need = s.len().div_ceil(bs as usize) as u32;
            let blocks: Vec<u32> = (next..next + need).collect();
            next += need;
            let r = t.insert(&s, &blocks).unwrap();
            if i % 4 == 0 {
                t.lock(r.node_id).unwrap();
                locked.push(r.node_id);
            }
        }
        for n in [0u64, 1, 2, 3, 5, 8, 13, u64::MAX] {
            let before = t.num_evictable_blocks();
            let refs_before = totals(&t).2;
            let released = t.evict(n).unwrap();
            assert_eq!(
                t.num_evictable_blocks(),
                before - n.min(before),
                "bs {bs} n {n}"
            );
            assert_eq!(totals(&t).2, refs_before - released.len() as u64);
            t.check_integrity().unwrap();
        }
        assert_eq!(t.num_evictable_blocks(), 0);
        for id in locked {
            t.unlock(id).unwrap();
        }
        let refs = totals(&t).2;
        assert_eq!(t.evict(u64::MAX).unwrap().len() as u64, refs);
        assert_eq!(totals(&t).0, 1);
        t.check_integrity().unwrap();
    }
}

#[test]
fn deep_paths_and_many_branches() {
    let mut t = tree(3);
    let base: Vec<u32> = (0..40).collect();
    let mut refs = 0u64;
    for cut in (1..40).step_by(3) {
        let mut s = base[..cut].to_vec();
        s.push(1000 + cut as u32);
        s.push(7);
        let blocks: Vec<u32> = (0..s.len() as u32).map(|i| i + 100 * cut as u32).collect();
        let r = t.insert(&s, &blocks).unwrap();
        refs += r.new_block_refs.len() as u64;
        t.check_integrity().unwrap();
        assert_eq!(t.match_prefix(&s).unwrap().num_tokens, s.len() as u64);
    }
    let blocks: Vec<u32> = (0..14).collect();
    let r = t.insert(&base, &blocks).unwrap();
    refs += r.new_block_refs.len() as u64;
    assert_eq!(totals(&t).2, refs);
    let got = t.match_prefix(&base).unwrap();
    assert_eq!(got.num_tokens, 40);
    assert_eq!(got.block_ids.len(), 14);
    let released = t.evict(u64::MAX).unwrap();
    assert_eq!(released.len() as u64, refs);
    assert_eq!(totals(&t).0, 1);
    t.check_integrity().unwrap();
}

#[test]
fn large_inserts_are_fast() {
    // 1000 sequences of 1000 tokens sharing prefixes of varying length: linear work.
    let mut t = tree(16);
    let base: Vec<u32> = (0..1000).collect();
    let blocks: Vec<u32> = (0..63).collect();
    for i in 0..1000u32 {
        let mut s = base.clone();
        let at = (i as usize * 7919) % 1000;
        s[at] = 5000 + i;
        t.insert(&s, &blocks).unwrap();
        assert_eq!(t.match_prefix(&s).unwrap().num_tokens, 1000);
    }
    t.check_integrity().unwrap();
}

#[test]
fn integrity_detects_corruption() {
    let fresh = split_example;
    let mut t = fresh();
    t.node_mut(1).blocks.push(3);
    assert!(cache_msg(t.check_integrity()).contains("holds 3 blocks"));
    let mut t = fresh();
    t.node_mut(1).start = 7;
    assert!(cache_msg(t.check_integrity()).contains("parent's end"));
    let mut t = fresh();
    t.node_mut(3).lock_count = 1;
    assert!(cache_msg(t.check_integrity()).contains("lock_count"));
    let mut t = fresh();
    t.node_mut(3).parent = 1;
    assert!(cache_msg(t.check_integrity()).contains("another parent"));
    let mut t = fresh();
    t.node_mut(1).stamp = 2;
    assert!(cache_msg(t.check_integrity()).contains("eviction set"));
    let mut t = fresh();
    t.node_mut(1).stamp = 5;
    assert!(cache_msg(t.check_integrity()).contains("more recent"));
    let mut t = fresh();
    t.block_counts.num_unlocked_only += 1;
    assert!(cache_msg(t.check_integrity()).contains("num_evictable_blocks"));
    let mut t = fresh();
    t.block_counts.map.get_mut(&7).unwrap().refs += 1;
    assert!(cache_msg(t.check_integrity()).contains("per-block reference counts"));
    let mut t = fresh();
    t.node_mut(0).children.clear();
    assert!(cache_msg(t.check_integrity()).contains("not reachable"));
    let mut t = fresh();
    let first = t.node(1).tokens[0];
    t.node_mut(1).tokens[0] = first + 1;
    assert!(cache_msg(t.check_integrity()).contains("wrong token"));
    let mut t = fresh();
    t.node_mut(1).tokens.clear();
    assert!(cache_msg(t.check_integrity()).contains("wrong token"));
    let mut t = fresh();
    t.node_mut(0).children.clear();
    t.node_mut(1).tokens.clear();
    t.node_mut(0).children.insert(7, 1);
    t.node_mut(1).parent = 0;
    t.node_mut(1).start = 0;
    assert!(cache_msg(t.check_integrity()).contains("wrong token"));
    let mut t = fresh();
    t.node_mut(2).children.insert(555, 99);
    assert!(cache_msg(t.check_integrity()).contains("unknown child"));
    let mut t = fresh();
    t.node_mut(0).tokens.push(1);
    assert!(cache_msg(t.check_integrity()).contains("root"));
    let mut t = fresh();
    t.nodes.remove(&ROOT);
    assert!(cache_msg(t.check_integrity()).contains("no root"));
}

#[test]
fn evictable_blocks_count_a_shared_block_once() {
    let mut t = tree(4);
    // A prompt of 7 tokens in blocks 10, 11; then the same sequence one token longer: the new
    // leaf starts inside block 11, which both nodes reference.
    let a: Vec<u32> = (1..=8).collect();
    let r = t.insert(&a[..7], &[10, 11]).unwrap();
    t.lock(r.node_id).unwrap();
    assert_eq!(t.num_evictable_blocks(), 0);
    let r2 = t.insert(&a, &[10, 11]).unwrap();
    assert_eq!(r2.new_block_refs, vec![11]);
    assert_eq!(t.num_evictable_blocks(), 0); // block 11 is still referenced by a locked node
    t.unlock(r.node_id).unwrap();
    assert_eq!((evictable_refs(&t), t.num_evictable_blocks()), (3, 2));
    // A sequence leaving the first node's edge inside block 11 splits it there; the new
    // leaf's copy 12 of block 1 replaces 11 in the upper part (11 stays in the lower nodes).
    let b = [1, 2, 3, 4, 5, 9, 9, 9];
    let r3 = t.insert(&b, &[10, 12]).unwrap();
    assert_eq!(r3.new_block_refs, vec![12, 12]);
    assert_eq!((evictable_refs(&t), t.num_evictable_blocks()), (5, 3));
    t.lock(r3.node_id).unwrap();
    // The locked path (the upper part, blocks 10 and 12, and the leaf's 12) leaves the
    // unlocked lower nodes, whose block 11 no locked node needs.
    assert_eq!((evictable_refs(&t), t.num_evictable_blocks()), (2, 1));
    t.check_integrity().unwrap();
    t.unlock(r3.node_id).unwrap();
    assert_eq!(t.num_evictable_blocks(), 3);
    let mut released = t.evict(u64::MAX).unwrap();
    released.sort_unstable();
    assert_eq!(released, vec![10, 11, 11, 12, 12]);
    assert_eq!(t.num_evictable_blocks(), 0);
    t.check_integrity().unwrap();
}

#[test]
fn a_leaf_starting_inside_a_block_lends_it_to_its_ancestors() {
    let mut t = tree(8);
    // Node 1: [0, 3) in block 10; node 2: [3, 5) in block 10 too (a second chunk of the same
    // sequence); then a sequence through both that goes on at 5 with its own copy 11 of
    // block 0 (copy-on-write of the partial match): both ancestors take 11, 10 goes.
    let r1 = t.insert(&[1, 2, 3], &[10]).unwrap();
    let r2 = t.insert(&[1, 2, 3, 4, 5], &[10]).unwrap();
    assert_eq!((r1.node_id, r2.node_id), (1, 2));
    assert_eq!(r2.released_block_refs, Vec::<u32>::new());
    let r = t.insert(&[1, 2, 3, 4, 5, 6], &[11]).unwrap();
    assert_eq!(r.new_block_refs, vec![11, 11, 11]);
    assert_eq!(r.released_block_refs, vec![10, 10]);
    let ns = t.nodes().unwrap();
    assert_eq!(
        (&ns[1].block_ids, &ns[2].block_ids, &ns[3].block_ids),
        (&vec![11], &vec![11], &vec![11])
    );
    assert_eq!(t.match_prefix(&[1, 2]).unwrap(), m(2, &[11], 1));
    assert_eq!(t.num_evictable_blocks(), 1);
    t.check_integrity().unwrap();
    // A lock on the parent itself keeps its copy: its request holds that block.
    let mut t = tree(8);
    let r1 = t.insert(&[1, 2, 3], &[10]).unwrap();
    t.lock(r1.node_id).unwrap();
    let r = t.insert(&[1, 2, 3, 4], &[11]).unwrap();
    assert_eq!(
        (r.new_block_refs, r.released_block_refs),
        (vec![11], vec![])
    );
    assert_eq!(t.nodes().unwrap()[1].block_ids, vec![10]);
    t.check_integrity().unwrap();
    // So does a lock below a child that starts with that copy; one below a child with
    // another copy does not.
    let mut t = tree(8);
    t.insert(&[1, 2, 3], &[10]).unwrap(); // node 1
    let r = t.insert(&[1, 2, 3, 4], &[10]).unwrap(); // node 2, starts with 10
    t.lock(r.node_id).unwrap();
    let r = t.insert(&[1, 2, 3, 5], &[11]).unwrap(); // node 3
    assert_eq!(r.released_block_refs, Vec::<u32>::new());
    assert_eq!(t.nodes().unwrap()[1].block_ids, vec![10]);
    t.unlock(2).unwrap();
    t.lock(r.node_id).unwrap();
    let r = t.insert(&[1, 2, 3, 6], &[12]).unwrap(); // node 4: node 3's lock needs 11, not 10
    assert_eq!(
        (r.new_block_refs, r.released_block_refs),
        (vec![12, 12], vec![10])
    );
    assert_eq!(t.nodes().unwrap()[1].block_ids, vec![12]);
    // Nothing is lent across a block boundary, nor where the leaf holds the same block.
    let mut t = tree(4);
    t.insert(&[1, 2, 3, 4], &[10]).unwrap();
    let r = t.insert(&[1, 2, 3, 4, 5], &[10, 20]).unwrap();
    assert_eq!(
        (r.new_block_refs, r.released_block_refs),
        (vec![20], vec![])
    );
    t.check_integrity().unwrap();
}

#[test]
fn evict_takes_partly_filled_last_blocks_first() {
    let mut t = tree(4);
    t.insert(&[1, 1, 1, 1, 1, 1, 1, 1], &[10, 11]).unwrap(); // node 1, stamp 1, ends on a boundary
    t.insert(&[2, 2, 2, 2, 2, 2], &[20, 21]).unwrap(); // node 2, stamp 2, ends inside block 21
    t.insert(&[3, 3, 3], &[30]).unwrap(); // node 3, stamp 3, ends inside block 30
                                          // The partly filled blocks go first, least recent first, though node 1 is older; then
                                          // the least recent leaf, node 1, whose blocks are all full, before node 2's full block.
    assert_eq!(t.evict(1).unwrap(), vec![21]);
    assert_eq!(t.evict(1).unwrap(), vec![30]);
    assert_eq!(t.evict(2).unwrap(), vec![11, 10]);
    assert_eq!(t.evict(1).unwrap(), vec![20]);
    assert_eq!(t.nodes().unwrap().len(), 1);
    t.check_integrity().unwrap();
    // A corrupted order is caught.
    let mut t = tree(4);
    t.insert(&[2, 2, 2, 2, 2, 2], &[20, 21]).unwrap();
    t.node_mut(1).tokens.truncate(4);
    t.node_mut(1).blocks.truncate(1);
    t.block_counts.remove(&[21], false);
    assert!(cache_msg(t.check_integrity()).contains("eviction set"));
}

fn is_memory<T: std::fmt::Debug>(r: KvResult<T>) -> bool {
    matches!(r, Err(KvError::Memory(_)))
}

#[test]
fn an_insert_the_host_cannot_hold_changes_nothing() {
    use crate::error::test_alloc::with_alloc_limit;
    let mut t = tree(4);
    t.insert(&[1, 2, 3, 4, 5, 6], &[10, 11]).unwrap();
    t.lock(1).unwrap();
    let before = (t.nodes().unwrap(), t.num_evictable_blocks());
    // A long new leaf after a split inside a block (straddle, lending): its edge is 4 MiB.
    let mut long: Vec<u32> = vec![1, 2, 3, 9];
    long.extend(0..1 << 20);
    let blocks: Vec<u32> = (100..100 + (long.len() as u32).div_ceil(4)).collect();
    assert!(with_alloc_limit(1 << 20, || is_memory(
        t.insert(&long, &blocks)
    )));
    assert_eq!((t.nodes().unwrap(), t.num_evictable_blocks()), before);
    t.check_integrity().unwrap();
    // With the memory, the same insert succeeds.
    let r = t.insert(&long, &blocks).unwrap();
    assert_eq!(r.num_new_tokens, (1 << 20) + 1);
    t.check_integrity().unwrap();
}

#[test]
fn an_eviction_the_host_cannot_hold_changes_nothing() {
    use crate::error::test_alloc::with_alloc_limit;
    let mut t = tree(1);
    let tokens: Vec<u32> = (0..1 << 19).collect();
    let blocks: Vec<u32> = (0..1 << 19).collect();
    t.insert(&tokens, &blocks).unwrap();
    let before = (t.nodes().unwrap(), t.num_evictable_blocks());
    // The released references (2 MiB) are reserved before anything is trimmed.
    assert!(with_alloc_limit(1 << 20, || is_memory(t.evict(u64::MAX))));
    assert_eq!((t.nodes().unwrap(), t.num_evictable_blocks()), before);
    // A few blocks fit.
    let released = with_alloc_limit(1 << 20, || t.evict(3)).unwrap();
    assert_eq!(released, [(1 << 19) - 1, (1 << 19) - 2, (1 << 19) - 3]);
    t.check_integrity().unwrap();
}

#[test]
fn a_match_the_host_cannot_hold_is_a_memory_error() {
    use crate::error::test_alloc::with_alloc_limit;
    let mut t = tree(1);
    let tokens: Vec<u32> = (0..1 << 19).collect();
    t.insert(&tokens, &tokens).unwrap();
    assert!(with_alloc_limit(1 << 20, || is_memory(
        t.match_prefix(&tokens)
    )));
    assert!(with_alloc_limit(1 << 20, || is_memory(
        t.num_evictable_among(&tokens)
    )));
    assert_eq!(t.match_prefix(&tokens).unwrap().num_tokens, 1 << 19);
}

#[test]
fn a_chosen_tail_is_trimmed_as_one_round_of_evict() {
    let mut t = tree(2);
    let a = t.insert(&[1, 2, 3, 4], &[10, 11]).unwrap().node_id;
    let b = t.insert(&[5, 6], &[20]).unwrap().node_id;
    // Both unlocked leaves, a older: a's last block first, then b's.
    assert_eq!(t.evictable_tails().unwrap(), vec![(a, 11), (b, 20)]);
    assert_eq!(t.evict_tail(b).unwrap(), 20);
    assert_eq!(t.evictable_tails().unwrap(), vec![(a, 11)]);
    assert_eq!(t.evict_tail(a).unwrap(), 11);
    assert_eq!(t.evictable_tails().unwrap(), vec![(a, 10)]);
    t.lock(a).unwrap();
    assert!(cache_msg(t.evict_tail(a)).contains("not an unlocked leaf"));
    assert!(cache_msg(t.evict_tail(ROOT)).contains("not an unlocked leaf"));
    assert!(t.evictable_tails().unwrap().is_empty());
    t.check_integrity().unwrap();
}
