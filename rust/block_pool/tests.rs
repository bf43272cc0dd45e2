//! Unit tests of module `block_pool`.

use std::fmt;

use super::*;
use crate::error::try_filled;

fn pool(n: u32) -> BlockPool {
    BlockPool::new(n).unwrap()
}

fn cache_msg<T: fmt::Debug>(r: KvResult<T>) -> String {
    match r {
        Err(KvError::Cache(m)) => m,
        other => panic!("expected KvError::Cache, got {other:?}"),
    }
}

/// A pool with blocks 0..4 used, 0 and 1 cached (hashes 100, 101) and then released
/// (so 0, 1 evictable in that order), 2, 3 used.
fn mixed() -> BlockPool {
    let mut p = pool(6);
    assert_eq!(p.allocate(4).unwrap(), vec![0, 1, 2, 3]);
    assert!(p.cache_block(0, 100, None).unwrap());
    assert!(p.cache_block(1, 101, None).unwrap());
    p.free(&[0]).unwrap();
    p.free(&[1]).unwrap();
    p.check_integrity().unwrap();
    p
}

type Snapshot = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<(u64, u32)>);

fn snapshot(p: &BlockPool) -> Snapshot {
    let mut c: Vec<_> = p.cached_blocks().collect();
    c.sort_unstable();
    (
        p.free_block_ids().unwrap(),
        p.evictable_block_ids().unwrap(),
        p.ref_counts().to_vec(),
        c,
    )
}

#[test]
fn new_and_counters() {
    let p = pool(4);
    assert_eq!(p.num_blocks(), 4);
    assert_eq!(p.num_free_blocks(), 4);
    assert_eq!(p.num_evictable_blocks(), 0);
    assert_eq!(p.num_used_blocks(), 0);
    assert_eq!(p.free_block_ids().unwrap(), vec![0, 1, 2, 3]);
    p.check_integrity().unwrap();
    assert!(matches!(BlockPool::new(0), Err(KvError::Value(_))));
    assert_eq!(
        BlockPool::new(MAX_BLOCKS + 1).unwrap_err(),
        KvError::Value("num_blocks must be in [1, 2**26], got 67108865".into())
    );
}

#[test]
fn a_failed_reservation_is_a_memory_error() {
    // More bytes than an address space holds: the reservation fails without allocating.
    match try_filled(usize::MAX, 0u64, "a test vector") {
        Err(KvError::Memory(m)) => assert!(m.starts_with("cannot allocate a test vector: ")),
        other => panic!("expected KvError::Memory, got {other:?}"),
    }
    assert_eq!(try_filled(3, 7u8, "three bytes").unwrap(), vec![7, 7, 7]);
}

#[test]
fn allocate_in_order_and_out_of_blocks() {
    let mut p = pool(4);
    assert_eq!(p.allocate(0).unwrap(), Vec::<u32>::new());
    assert_eq!(p.allocate(2).unwrap(), vec![0, 1]);
    assert_eq!(p.num_used_blocks(), 2);
    assert_eq!(p.ref_counts(), &[1, 1, 0, 0]);
    let err = p.allocate(5).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks("cannot allocate 5 blocks: only 2 free".into())
    );
    let mut v = vec![9];
    p.allocate_into(2, &mut v).unwrap();
    assert_eq!(v, vec![9, 2, 3]);
    assert_eq!(p.num_free_blocks(), 0);
    p.check_integrity().unwrap();
}

#[test]
fn allocate_run_first_fit() {
    let mut p = mixed(); // 0, 1 evictable; 2, 3 used; 4, 5 free
    assert_eq!(p.longest_free_run(), 2);
    assert_eq!(
        p.allocate_run(3).unwrap_err(),
        KvError::OutOfBlocks("cannot allocate 3 blocks: only 2 free".into())
    );
    p.evict(1).unwrap(); // free stack top: 1, then 4, 5
    assert_eq!(p.free_block_ids().unwrap(), vec![1, 4, 5]);
    assert_eq!(
        p.allocate_run(3).unwrap_err(),
        KvError::OutOfBlocks("no run of 3 consecutive free blocks (longest: 2)".into())
    );
    assert_eq!(p.allocate_run(0).unwrap(), Vec::<u32>::new());
    assert_eq!(p.allocate_run(2).unwrap(), vec![4, 5]);
    assert_eq!(p.free_block_ids().unwrap(), vec![1]);
    assert_eq!(p.ref_counts(), &[0, 0, 1, 1, 1, 1]);
    assert_eq!(p.allocate_run(1).unwrap(), vec![1]);
    assert_eq!(p.longest_free_run(), 0);
    p.check_integrity().unwrap();

    let mut p = pool(8);
    p.allocate(8).unwrap();
    p.free(&[6, 1, 2, 4, 5, 7]).unwrap(); // stack top first: 7, 5, 4, 2, 1, 6
    assert_eq!(p.longest_free_run(), 4);
    assert_eq!(p.allocate_run(2).unwrap(), vec![1, 2]);
    assert_eq!(p.free_block_ids().unwrap(), vec![7, 5, 4, 6]);
    assert_eq!(p.allocate_run(2).unwrap(), vec![4, 5]);
    assert_eq!(p.free_block_ids().unwrap(), vec![7, 6]);
    assert_eq!(p.allocate_run(2).unwrap(), vec![6, 7]);
    p.check_integrity().unwrap();
}

#[test]
fn free_stack_is_lifo() {
    let mut p = pool(4);
    p.allocate(3).unwrap();
    p.free(&[1]).unwrap();
    p.free(&[0]).unwrap();
    assert_eq!(p.free_block_ids().unwrap(), vec![0, 1, 3]);
    assert_eq!(p.allocate(1).unwrap(), vec![0]);
    p.check_integrity().unwrap();
}

#[test]
fn incref_and_free() {
    let mut p = mixed();
    p.incref(2).unwrap();
    assert_eq!(p.ref_count(2).unwrap(), 2);
    // Prefix hit on an evictable block.
    p.incref(1).unwrap();
    assert_eq!(p.evictable_block_ids().unwrap(), vec![0]);
    assert_eq!(p.ref_count(1).unwrap(), 1);
    p.check_integrity().unwrap();
    assert_eq!(cache_msg(p.incref(5)), "block 5 is free: cannot incref");
    assert!(cache_msg(p.incref(6)).starts_with("unknown block 6"));
    p.free(&[1]).unwrap();
    assert_eq!(p.evictable_block_ids().unwrap(), vec![0, 1]);
    assert_eq!(cache_msg(p.free(&[1])), "double free of block 1");
    assert_eq!(cache_msg(p.free(&[4])), "double free of block 4");
    assert!(cache_msg(p.free(&[99])).starts_with("unknown block 99"));
    p.check_integrity().unwrap();
}

#[test]
fn incref_all_is_checked_as_a_whole() {
    let mut p = mixed();
    let before = snapshot(&p);
    // A free block or an unknown id anywhere in the batch: nothing changes.
    assert_eq!(
        cache_msg(p.incref_all(&[2, 1, 5])),
        "block 5 is free: cannot incref"
    );
    assert!(cache_msg(p.incref_all(&[1, 6])).starts_with("unknown block 6"));
    assert_eq!(snapshot(&p), before);
    // A block listed twice gains two references; an evictable one leaves the LRU list.
    p.incref_all(&[1, 2, 1]).unwrap();
    assert_eq!(p.ref_count(1).unwrap(), 2);
    assert_eq!(p.ref_count(2).unwrap(), 2);
    assert_eq!(p.evictable_block_ids().unwrap(), vec![0]);
    p.incref_all(&[]).unwrap();
    p.check_integrity().unwrap();
}

#[test]
fn incref_all_refuses_a_count_near_overflow() {
    let mut p = pool(2);
    p.allocate(2).unwrap();
    p.ref_count[0] = u32::MAX - 1;
    // One more fits a single incref, but a batch of two might overflow: refused whole.
    assert_eq!(
        cache_msg(p.incref_all(&[1, 0])),
        "block 0: reference count overflow: cannot incref"
    );
    assert_eq!(p.ref_counts(), vec![u32::MAX - 1, 1]);
    p.incref_all(&[0]).unwrap();
    assert_eq!(p.ref_count(0).unwrap(), u32::MAX);
}

#[test]
fn incref_overflow_is_refused() {
    let mut p = pool(1);
    p.allocate(1).unwrap();
    p.raw_ref_counts_mut()[0] = u32::MAX;
    assert!(cache_msg(p.incref(0)).contains("overflow"));
    assert_eq!(p.ref_count(0).unwrap(), u32::MAX);
}

#[test]
fn free_is_all_or_nothing() {
    let mut p = mixed();
    p.incref(2).unwrap();
    let before = snapshot(&p);
    assert_eq!(cache_msg(p.free(&[2, 3, 3])), "double free of block 3");
    assert_eq!(snapshot(&p), before);
    assert_eq!(cache_msg(p.free(&[2, 0])), "double free of block 0");
    assert_eq!(cache_msg(p.free(&[4])), "double free of block 4");
    assert!(cache_msg(p.free(&[2, 77])).starts_with("unknown block 77"));
    assert_eq!(snapshot(&p), before);
    p.check_integrity().unwrap();
    // Ordering: 2 reaches zero at its last occurrence, after 3.
    p.free(&[2, 3, 2]).unwrap();
    assert_eq!(p.free_block_ids().unwrap(), vec![2, 3, 4, 5]);
    p.free(&[]).unwrap();
    p.check_integrity().unwrap();
}

#[test]
fn free_after_it_was_freed_in_batch_is_double_free() {
    let mut p = pool(2);
    p.allocate(1).unwrap();
    assert_eq!(cache_msg(p.free(&[0, 0])), "double free of block 0");
    assert_eq!(p.ref_count(0).unwrap(), 1);
}

#[test]
fn cache_block_rules() {
    let mut p = mixed();
    assert!(p.cache_block(2, 200, None).unwrap());
    assert!(!p.cache_block(2, 200, None).unwrap());
    assert!(!p.cache_block(3, 200, None).unwrap()); // duplicate content
    assert_eq!(p.hash[3], None);
    assert!(cache_msg(p.cache_block(2, 201, None)).contains("already carries hash"));
    assert_eq!(
        cache_msg(p.cache_block(0, 5, None)),
        "block 0 is evictable (ref_count 0): cannot cache"
    );
    assert_eq!(
        cache_msg(p.cache_block(4, 5, None)),
        "block 4 is free (ref_count 0): cannot cache"
    );
    assert!(cache_msg(p.cache_block(9, 5, None)).starts_with("unknown block"));
    assert_eq!(p.lookup_prefix(&[200]).unwrap(), vec![2]);
    assert_eq!(p.lookup_prefix(&[999]).unwrap(), Vec::<u32>::new());
    assert_eq!(p.hash[2], Some(200));
    assert!(cache_msg(p.ref_count(6)).starts_with("unknown block"));
    p.uncache_used(2);
    assert_eq!(p.lookup_prefix(&[200]).unwrap(), Vec::<u32>::new());
    p.check_integrity().unwrap();
    // A cached used block released becomes evictable.
    p.cache_block(3, 300, None).unwrap();
    p.free(&[3]).unwrap();
    assert_eq!(p.evictable_block_ids().unwrap(), vec![0, 1, 3]);
    p.check_integrity().unwrap();
}

#[test]
fn lookup_prefix_stops_at_first_miss() {
    let p = mixed();
    assert_eq!(p.lookup_prefix(&[100, 101, 5, 100]).unwrap(), vec![0, 1]);
    assert_eq!(p.lookup_prefix(&[5, 100]).unwrap(), Vec::<u32>::new());
    assert_eq!(p.lookup_prefix(&[]).unwrap(), Vec::<u32>::new());
}

#[test]
fn evict_and_evict_lru() {
    let mut p = mixed();
    assert_eq!(p.evict(1).unwrap(), 101);
    assert_eq!(p.lookup_prefix(&[101]).unwrap(), Vec::<u32>::new());
    assert_eq!(p.hash[1], None);
    assert_eq!(p.free_block_ids().unwrap(), vec![1, 4, 5]);
    assert_eq!(
        cache_msg(p.evict(1)),
        "block 1 is free, not evictable: cannot evict"
    );
    assert_eq!(
        cache_msg(p.evict(2)),
        "block 2 is used, not evictable: cannot evict"
    );
    assert!(cache_msg(p.evict(100)).starts_with("unknown block"));
    p.check_integrity().unwrap();
    assert_eq!(
        p.evict_lru(2).unwrap_err(),
        KvError::OutOfBlocks("cannot evict 2 blocks: only 1 evictable".into())
    );
    assert_eq!(p.evict_lru(0).unwrap(), Vec::<u32>::new());
    assert_eq!(p.evict_lru(1).unwrap(), vec![0]);
    assert_eq!(p.num_evictable_blocks(), 0);
    assert_eq!(p.free_block_ids().unwrap(), vec![0, 1, 4, 5]);
    p.check_integrity().unwrap();
}

#[test]
fn evict_lru_oldest_first() {
    let mut p = pool(5);
    p.allocate(5).unwrap();
    for b in 0..5 {
        p.cache_block(b, 1000 + u64::from(b), None).unwrap();
    }
    for b in [3, 1, 4, 0, 2] {
        p.free(&[b]).unwrap();
    }
    // A hit and its release move block 1 to the most recent end.
    p.incref(1).unwrap();
    p.free(&[1]).unwrap();
    assert_eq!(p.evictable_block_ids().unwrap(), vec![3, 4, 0, 2, 1]);
    assert_eq!(p.evict_lru(3).unwrap(), vec![3, 4, 0]);
    assert_eq!(p.evictable_block_ids().unwrap(), vec![2, 1]);
    p.incref(1).unwrap(); // remove the tail
    p.incref(2).unwrap(); // remove the head
    assert_eq!(p.evictable_block_ids().unwrap(), Vec::<u32>::new());
    assert_eq!(p.num_used_blocks(), 2);
    p.check_integrity().unwrap();
}

#[test]
fn make_room_lru_evicts_only_the_shortfall_or_nothing() {
    // mixed(): free 4, 5; evictable 0 then 1; used 2, 3.
    let mut p = mixed();
    assert!(p.make_room_lru(2, 0)); // the free blocks cover it
    assert_eq!(p.num_evictable_blocks(), 2);
    let before = snapshot(&p);
    assert!(!p.make_room_lru(3, 2)); // 5 wanted, 2 free + 2 evictable
    assert!(!p.make_room_lru(u64::MAX, u64::MAX));
    assert_eq!(snapshot(&p), before);
    assert!(p.make_room_lru(1, 2)); // one short: the oldest evictable goes
    assert_eq!(p.evictable_block_ids().unwrap(), vec![1]);
    assert_eq!(p.lookup_prefix(&[100]).unwrap(), Vec::<u32>::new());
    assert_eq!(p.num_free_blocks(), 3);
    assert!(p.make_room_lru(0, 4));
    assert_eq!(p.num_evictable_blocks(), 0);
    assert_eq!(p.num_free_blocks(), 4);
    p.check_integrity().unwrap();
}

#[test]
fn integrity_detects_corruption() {
    let mut p = mixed();
    p.raw_ref_counts_mut()[4] = 1; // free block with a reference
    let m = cache_msg(p.check_integrity());
    assert!(m.starts_with("block pool integrity: block 4"), "{m}");

    let mut p = mixed();
    p.raw_ref_counts_mut()[0] = 2; // evictable block with a reference
    assert!(cache_msg(p.check_integrity()).contains("block 0"));

    let mut p = mixed();
    p.raw_ref_counts_mut()[2] = 0; // used block dropped to zero without a list
    assert!(cache_msg(p.check_integrity()).contains("block 2"));

    let mut p = mixed();
    p.num_evictable = 5;
    assert!(cache_msg(p.check_integrity()).contains("counter"));

    let mut p = mixed();
    p.cached.insert(555, 3);
    assert!(cache_msg(p.check_integrity()).contains("hash map"));

    let mut p = mixed();
    p.hash[2] = Some(77);
    assert!(cache_msg(p.check_integrity()).contains("hash map disagrees"));

    let mut p = mixed();
    p.prev[1] = NIL;
    assert!(cache_msg(p.check_integrity()).contains("prev link"));

    let mut p = mixed();
    p.lru_tail = 0;
    assert!(cache_msg(p.check_integrity()).contains("tail"));

    let mut p = mixed();
    p.free.push(4);
    assert!(cache_msg(p.check_integrity()).contains("twice"));

    let mut p = mixed();
    p.free.push(40);
    assert!(cache_msg(p.check_integrity()).contains("unknown block 40"));

    let mut p = mixed();
    p.next[2] = 0;
    assert!(cache_msg(p.check_integrity()).contains("LRU links"));
}

#[test]
fn error_display() {
    assert_eq!(KvError::Value("v".into()).to_string(), "v");
    assert_eq!(KvError::OutOfBlocks("o".into()).to_string(), "o");
}

#[test]
fn num_unreferenced_counts_free_and_evictable_listed_blocks() {
    let mut pool = BlockPool::new(4).unwrap();
    let ids = pool.allocate(3).unwrap();
    pool.cache_block(ids[0], 7, None).unwrap();
    pool.free(&[ids[0], ids[1]]).unwrap(); // ids[0] evictable, ids[1] free, ids[2] used
    assert_eq!(
        pool.num_unreferenced(&[ids[0], ids[1], ids[2], ids[0]])
            .unwrap(),
        3
    );
    assert_eq!(pool.num_unreferenced(&[]).unwrap(), 0);
    assert!(pool.num_unreferenced(&[ids[2], 4]).is_err());
}

fn is_memory<T: fmt::Debug>(r: KvResult<T>) -> bool {
    matches!(r, Err(KvError::Memory(_)))
}

#[test]
fn calls_the_host_cannot_hold_are_memory_errors_that_change_nothing() {
    use crate::error::test_alloc::with_alloc_limit;
    let n = 1u32 << 20; // every id list of the pool is 4 MiB
    let mut p = pool(n);
    let hashes = vec![0u64; n as usize];
    with_alloc_limit(1 << 19, || {
        assert!(is_memory(p.allocate(u64::from(n))));
        assert!(is_memory(p.allocate_run(u64::from(n))));
        assert!(is_memory(p.free_block_ids()));
        assert!(is_memory(p.lookup_prefix(&hashes)));
        assert!(is_memory(p.check_integrity()));
        // What fits is not refused.
        assert_eq!(p.allocate(2).unwrap(), [0, 1]);
    });
    assert_eq!(p.num_free_blocks(), n - 2);
    assert_eq!(p.free_ids().take(2).collect::<Vec<_>>(), [2, 3]);
    p.free(&[0, 1]).unwrap();
    p.check_integrity().unwrap();
}

#[test]
fn an_emit_that_fails_changes_nothing() {
    let mut p = mixed();
    let before = (
        p.free_block_ids().unwrap(),
        p.evictable_block_ids().unwrap(),
    );
    let refuse = || Err::<(), _>(KvError::Memory("refused".into()));
    assert!(is_memory(p.allocate_then(2, |_| refuse())));
    assert!(is_memory(p.allocate_run_then(2, |_| refuse())));
    assert!(is_memory(p.evict_lru_then(2, |_| refuse())));
    assert_eq!(
        (
            p.free_block_ids().unwrap(),
            p.evictable_block_ids().unwrap()
        ),
        before
    );
    p.check_integrity().unwrap();
}

#[test]
fn accesses_are_logged_in_order_only_while_recording() {
    let mut p = pool(4);
    let ids = p.allocate(2).unwrap();
    assert!(p.cache_block(ids[0], 10, None).unwrap());
    assert!(p.take_accesses().is_empty()); // not recording yet
    p.record_accesses(true);
    assert!(p.cache_block(ids[1], 11, Some(10)).unwrap());
    p.free(&[ids[1], ids[0]]).unwrap();
    p.incref(ids[0]).unwrap();
    p.incref(ids[0]).unwrap();
    p.free(&[ids[0], ids[0]]).unwrap();
    assert_eq!(p.evict_lru(1).unwrap(), vec![ids[1]]);
    let kinds: Vec<(AccessKind, u32, u64, Option<u64>)> = p
        .take_accesses()
        .iter()
        .map(|a| (a.kind, a.block, a.content, a.parent))
        .collect();
    use AccessKind::*;
    assert_eq!(
        kinds,
        vec![
            (Insert, ids[1], 11, Some(10)),
            (Release, ids[1], 11, None),
            (Release, ids[0], 10, None),
            (Hit, ids[0], 10, None),
            (Hit, ids[0], 10, None),
            (Release, ids[0], 10, None),
            (Evict, ids[1], 11, None),
        ]
    );
    assert!(p.take_accesses().is_empty());
    p.record_accesses(false);
    p.evict_lru(1).unwrap();
    assert!(p.take_accesses().is_empty());
    p.check_integrity().unwrap();
}

#[test]
fn a_rolled_back_batch_logs_its_insertions_evicted() {
    let mut p = pool(4);
    let ids = p.allocate(2).unwrap();
    p.record_accesses(true);
    assert!(p.cache_block(ids[0], 10, None).unwrap());
    p.uncache_used(ids[0]);
    let kinds: Vec<AccessKind> = p.take_accesses().iter().map(|a| a.kind).collect();
    assert_eq!(kinds, vec![AccessKind::Insert, AccessKind::Evict]);
}
