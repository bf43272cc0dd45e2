//! Unit tests of module `block_table`.

use std::cell::Cell;

use super::*;
use crate::block_pool::BlockPool;

fn msg<T: std::fmt::Debug>(r: KvResult<T>) -> String {
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

fn setup() -> (BlockTables, BlockPool) {
    let mut bt = BlockTables::new(4).unwrap();
    let mut pool = BlockPool::new(10).unwrap();
    let a = pool.allocate(3).unwrap();
    bt.add_sequence(1, &a[..2]).unwrap();
    bt.add_sequence(2, &a[2..]).unwrap();
    bt.add_sequence(3, &[]).unwrap();
    (bt, pool)
}

#[test]
fn new_and_basic_queries() {
    assert!(matches!(BlockTables::new(0), Err(KvError::Value(_))));
    let (bt, pool) = setup();
    assert_eq!(bt.block_size(), 4);
    assert_eq!(bt.num_sequences(), 3);
    assert!(bt.seq_ids().unwrap().contains(&1));
    assert!(!bt.seq_ids().unwrap().contains(&9));
    assert_eq!(bt.block_ids(1).unwrap(), &[0, 1]);
    assert_eq!(bt.block_id_at(1, 1).unwrap(), 1);
    assert_eq!(bt.num_blocks(2).unwrap(), 1);
    assert_eq!(bt.seq_ids().unwrap(), vec![1, 2, 3]);
    assert_eq!(msg(bt.block_ids(9)), "unknown sequence 9");
    assert_eq!(msg(bt.num_blocks(9)), "unknown sequence 9");
    assert_eq!(
        msg(bt.block_id_at(1, 2)),
        "index 2 out of range for sequence 1 with 2 blocks"
    );
    assert_eq!(msg(bt.block_id_at(9, 0)), "unknown sequence 9");
    assert!(msg(bt.block_id_at(1, u64::MAX)).starts_with("index"));
    bt.check_integrity(Some(&pool)).unwrap();
    bt.check_integrity(None).unwrap();
    assert_eq!(bt.blocks_for_tokens(0), 0);
    assert_eq!(bt.blocks_for_tokens(4), 1);
    assert_eq!(bt.blocks_for_tokens(5), 2);
    assert_eq!(bt.blocks_for_tokens(u64::MAX), u64::MAX / 4 + 1);
}

#[test]
fn add_remove_append() {
    let (mut bt, _) = setup();
    assert_eq!(msg(bt.add_sequence(1, &[])), "sequence 1 already exists");
    assert_eq!(
        value_msg(bt.add_sequence(7, &[1, MAX_BLOCK_ID + 1])),
        "block id 2147483648 is not in [0, 2**31)"
    );
    assert!(!bt.seq_ids().unwrap().contains(&7));
    bt.append_blocks(3, &[7, 8]).unwrap();
    assert_eq!(bt.block_ids(3).unwrap(), &[7, 8]);
    assert!(value_msg(bt.append_blocks(3, &[9, u32::MAX])).starts_with("block id"));
    assert!(value_msg(bt.append_blocks(3, &[MAX_BLOCK_ID + 1])).starts_with("block id"));
    assert_eq!(bt.block_ids(3).unwrap(), &[7, 8]);
    assert_eq!(msg(bt.append_blocks(9, &[1])), "unknown sequence 9");
    assert!(!bt.seq_ids().unwrap().contains(&9));
    bt.append_blocks(3, &[]).unwrap();
    assert_eq!(bt.remove_sequence(3).unwrap(), vec![7, 8]);
    assert_eq!(msg(bt.remove_sequence(3)), "unknown sequence 3");
    assert_eq!(bt.num_sequences(), 2);
}

#[test]
fn free_sequence_frees_the_last_block_first_and_skips_holes() {
    let (mut bt, mut pool) = setup();
    bt.grow(&mut pool, &[3], &[12]).unwrap(); // blocks 3, 4, 5
    let released = bt.release_range(3, 1, 2).unwrap(); // block 4: a hole
    pool.free(&released).unwrap();
    bt.cache_blocks(&mut pool, 3, 0, &[30]).unwrap();
    bt.cache_blocks(&mut pool, 3, 2, &[32]).unwrap();
    let free_before = pool.num_free_blocks();
    assert_eq!(bt.free_sequence(&mut pool, 3).unwrap(), 2);
    assert!(!bt.seq_ids().unwrap().contains(&3));
    assert_eq!(pool.num_free_blocks(), free_before);
    assert_eq!(pool.evictable_block_ids().unwrap(), vec![5, 3]); // the oldest first
    assert_eq!(msg(bt.free_sequence(&mut pool, 3)), "unknown sequence 3");
    // A block the pool already took back: the table and the pool stay as they were.
    let held = bt.block_ids(1).unwrap().to_vec();
    pool.free(&held[1..]).unwrap();
    let free_before = pool.num_free_blocks();
    assert!(msg(bt.free_sequence(&mut pool, 1)).starts_with("double free"));
    assert_eq!(bt.block_ids(1).unwrap(), &held[..]);
    assert_eq!(pool.num_free_blocks(), free_before);
}

#[test]
fn fork_set_block() {
    let (mut bt, _) = setup();
    bt.remove_sequence(1).unwrap();
    bt.add_sequence(1, &[0, 1, 5]).unwrap();
    assert_eq!(bt.fork(1, 4).unwrap(), vec![0, 1, 5]);
    assert_eq!(bt.block_ids(4).unwrap(), &[0, 1, 5]);
    assert_eq!(
        msg(bt.fork(1, 2)),
        "cannot fork sequence 1: child 2 already exists"
    );
    assert_eq!(msg(bt.fork(9, 10)), "unknown sequence 9");
    assert!(!bt.seq_ids().unwrap().contains(&10));
    assert_eq!(bt.set_block(4, 2, 9).unwrap(), 5);
    assert_eq!(bt.block_ids(4).unwrap(), &[0, 1, 9]);
    assert_eq!(bt.block_ids(1).unwrap(), &[0, 1, 5]);
    assert_eq!(
        msg(bt.set_block(4, 3, 9)),
        "index 3 out of range for sequence 4 with 3 blocks"
    );
    assert_eq!(msg(bt.set_block(9, 0, 9)), "unknown sequence 9");
    assert!(value_msg(bt.set_block(4, 0, u32::MAX)).starts_with("block id"));
    assert_eq!(bt.block_ids(4).unwrap(), &[0, 1, 9]);
}

#[test]
fn num_blocks_to_grow_counts_batch_literally() {
    let (bt, _) = setup();
    assert_eq!(bt.num_blocks_to_grow(&[1, 2, 3], &[8, 9, 1]).unwrap(), 3);
    assert_eq!(bt.num_blocks_to_grow(&[1, 1], &[12, 12]).unwrap(), 2);
    assert_eq!(bt.num_blocks_to_grow(&[], &[]).unwrap(), 0);
    assert_eq!(bt.num_blocks_to_grow(&[1], &[0]).unwrap(), 0);
    let m = u64::MAX;
    assert_eq!(
        bt.num_blocks_to_grow(&[1, 2], &[m, m]).unwrap(),
        (1 << 63) - 3
    );
    // Exact past u64: no saturation.
    assert_eq!(
        bt.num_blocks_to_grow(&[1, 2, 3, 3, 3], &[m; 5]).unwrap(),
        5 * (1u128 << 62) - 3
    );
    assert!(value_msg(bt.num_blocks_to_grow(&[1], &[])).contains("differ in length"));
    assert_eq!(
        msg(bt.num_blocks_to_grow(&[1, 9], &[1, 1])),
        "unknown sequence 9"
    );
}

#[test]
fn grow_allocates_in_batch_order() {
    let (mut bt, mut pool) = setup();
    assert_eq!(bt.grow(&mut pool, &[3, 1, 2], &[5, 8, 13]).unwrap(), 5);
    assert_eq!(bt.block_ids(3).unwrap(), &[3, 4]);
    assert_eq!(bt.block_ids(1).unwrap(), &[0, 1]);
    assert_eq!(bt.block_ids(2).unwrap(), &[2, 5, 6, 7]);
    assert_eq!(pool.num_free_blocks(), 2);
    bt.check_integrity(Some(&pool)).unwrap();
    pool.check_integrity().unwrap();
    assert_eq!(bt.grow(&mut pool, &[], &[]).unwrap(), 0);
}

#[test]
fn grow_is_all_or_nothing() {
    let (mut bt, mut pool) = setup();
    let before = (
        bt.block_ids(1).unwrap().to_vec(),
        pool.free_block_ids().unwrap(),
    );
    let e = bt.grow(&mut pool, &[1, 3], &[12, 100]).unwrap_err();
    assert_eq!(
        e,
        KvError::OutOfBlocks("cannot allocate 26 blocks: only 7 free".into())
    );
    assert_eq!(
        msg(bt.grow(&mut pool, &[1, 9], &[12, 1])),
        "unknown sequence 9"
    );
    assert!(value_msg(bt.grow(&mut pool, &[1, 3], &[12])).contains("differ"));
    assert!(matches!(
        bt.grow(&mut pool, &[1], &[u64::MAX]),
        Err(KvError::OutOfBlocks(_))
    ));
    assert_eq!(
        (
            bt.block_ids(1).unwrap().to_vec(),
            pool.free_block_ids().unwrap()
        ),
        before
    );
    assert_eq!(bt.block_ids(3).unwrap(), &[] as &[u32]);
}

#[test]
fn grow_with_duplicate_sequence_is_exact() {
    let (mut bt, mut pool) = setup();
    // Sequence 3 listed three times: it needs 7 blocks once, not 5 + 7 + 1.
    assert_eq!(bt.num_blocks_to_grow(&[3, 3, 3], &[20, 28, 4]).unwrap(), 13);
    assert_eq!(bt.grow(&mut pool, &[3, 3, 3], &[20, 28, 4]).unwrap(), 7);
    assert_eq!(bt.num_blocks(3).unwrap(), 7);
    assert_eq!(pool.num_free_blocks(), 0);
    bt.check_integrity(Some(&pool)).unwrap();
    let e = bt.grow(&mut pool, &[3, 3], &[32, 32]).unwrap_err();
    assert_eq!(
        e,
        KvError::OutOfBlocks("cannot allocate 1 blocks: only 0 free".into())
    );
}

#[test]
fn cache_blocks_records_and_rolls_back() {
    let (mut bt, mut pool) = setup();
    bt.grow(&mut pool, &[3], &[16]).unwrap(); // seq 3 -> blocks 3, 4, 5, 6
    assert_eq!(bt.cache_blocks(&mut pool, 3, 1, &[41, 51]).unwrap(), 2);
    assert_eq!(pool.lookup_prefix(&[41]).unwrap(), vec![4]);
    // Again: already carried -> false; duplicate content in block 0 -> false.
    assert_eq!(bt.cache_blocks(&mut pool, 3, 1, &[41, 51]).unwrap(), 0);
    assert_eq!(bt.cache_blocks(&mut pool, 1, 0, &[41]).unwrap(), 0);
    assert_eq!(bt.cache_blocks(&mut pool, 3, 4, &[]).unwrap(), 0);
    // Range checked first.
    assert_eq!(
        msg(bt.cache_blocks(&mut pool, 3, 3, &[1, 2])),
        "cannot cache 2 blocks from index 3 of sequence 3: it has 4 blocks"
    );
    assert!(msg(bt.cache_blocks(&mut pool, 3, u64::MAX, &[1])).starts_with("cannot cache"));
    assert_eq!(
        msg(bt.cache_blocks(&mut pool, 9, 0, &[1])),
        "unknown sequence 9"
    );
    // Block 6 released while the table still holds it -> cache_block on it errors; block 3's
    // record is undone.
    pool.free(&[6]).unwrap();
    let before: Vec<_> = {
        let mut c: Vec<_> = pool.cached_blocks().collect();
        c.sort_unstable();
        c
    };
    assert!(msg(bt.cache_blocks(&mut pool, 3, 0, &[30, 41, 51, 60])).contains("block 6 is free"));
    let mut after: Vec<_> = pool.cached_blocks().collect();
    after.sort_unstable();
    assert_eq!(after, before);
    assert!(pool.cached_blocks().all(|(_, b)| b != 3));
    pool.check_integrity().unwrap();
    // Same block twice with different hashes errors on the second and undoes the first.
    bt.add_sequence(8, &[0, 0]).unwrap();
    assert!(msg(bt.cache_blocks(&mut pool, 8, 0, &[70, 71])).contains("already carries"));
    assert_eq!(pool.lookup_prefix(&[70]).unwrap(), Vec::<u32>::new());
    pool.check_integrity().unwrap();
}

#[test]
fn max_num_blocks() {
    let (bt, _) = setup();
    assert_eq!(bt.max_num_blocks(&[]).unwrap(), 0);
    assert_eq!(bt.max_num_blocks(&[2, 1, 3]).unwrap(), 2);
    assert_eq!(msg(bt.max_num_blocks(&[2, 9])), "unknown sequence 9");
}

#[test]
fn export_into_pads_rows() {
    let (bt, _) = setup();
    let mut buf = vec![99i32; 10];
    let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
    bt.export_into(&[2, 1, 3], cells, 3, -1).unwrap();
    assert_eq!(buf, vec![2, -1, -1, 0, 1, -1, -1, -1, -1, 99]);
    let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
    assert!(value_msg(bt.export_into(&[1], cells, 1, 0))
        .contains("sequence 1 has 2 blocks, more than width 1"));
    assert!(value_msg(bt.export_into(&[1, 2, 3, 1], cells, 3, 0)).contains("fewer than"));
    assert!(value_msg(bt.export_into(&[1; 2], cells, usize::MAX, 0)).contains("fewer than"));
    assert_eq!(
        msg(bt.export_into(&[1, 9], cells, 3, 0)),
        "unknown sequence 9"
    );
    bt.export_into(&[3, 3], cells, 0, 0).unwrap();
    bt.export_into(&[], cells, 5, 0).unwrap();
    assert_eq!(buf, vec![2, -1, -1, 0, 1, -1, -1, -1, -1, 99]);
}

#[test]
fn release_range_from_the_front_makes_holes() {
    let (mut bt, mut pool) = setup();
    bt.grow(&mut pool, &[1], &[16]).unwrap(); // seq 1 -> 0, 1, 3, 4
    assert_eq!(bt.num_holes(1).unwrap(), 0);
    assert_eq!(bt.release_range(1, 0, 2).unwrap(), vec![0, 1]);
    pool.free(&[0, 1]).unwrap();
    assert_eq!(bt.block_ids(1).unwrap(), &[HOLE, HOLE, 3, 4]);
    assert_eq!(bt.block_id_at(1, 0).unwrap(), HOLE);
    assert_eq!(
        (bt.num_holes(1).unwrap(), bt.num_blocks(1).unwrap()),
        (2, 4)
    );
    // Already-holes are skipped; 0 and a shorter front change nothing.
    assert_eq!(bt.release_range(1, 0, 1).unwrap(), Vec::<u32>::new());
    assert_eq!(bt.release_range(1, 0, 0).unwrap(), Vec::<u32>::new());
    assert_eq!(bt.release_range(1, 0, 3).unwrap(), vec![3]);
    pool.free(&[3]).unwrap();
    bt.check_integrity(Some(&pool)).unwrap();
    bt.check_integrity(None).unwrap();
    assert_eq!(
        msg(bt.release_range(1, 0, 5)),
        "cannot release blocks [0, 5) of sequence 1: it has 4"
    );
    assert_eq!(msg(bt.release_range(9, 0, 0)), "unknown sequence 9");
    assert_eq!(msg(bt.num_holes(9)), "unknown sequence 9");
    // Holes keep their slots: growth counts them.
    assert_eq!(bt.num_blocks_to_grow(&[1], &[20]).unwrap(), 1);
    assert_eq!(bt.grow(&mut pool, &[1], &[20]).unwrap(), 1);
    assert_eq!(bt.block_ids(1).unwrap(), &[HOLE, HOLE, HOLE, 4, 3]);
    // Holes refuse set_block and cache_blocks, before anything changes.
    assert_eq!(
        msg(bt.set_block(1, 2, 7)),
        "block 2 of sequence 1 is a hole"
    );
    assert_eq!(
        msg(bt.cache_blocks(&mut pool, 1, 2, &[5, 6])),
        "block 2 of sequence 1 is a hole"
    );
    assert_eq!(bt.cache_blocks(&mut pool, 1, 3, &[5, 6]).unwrap(), 2);
    assert_eq!(bt.set_block(1, 4, 1).unwrap(), 3);
    // Export writes holes as pad.
    let mut buf = vec![9i32; 6];
    let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
    bt.export_into(&[1], cells, 6, -7).unwrap();
    assert_eq!(buf, vec![-7, -7, -7, 4, 1, -7]);
    // Fork copies holes and returns only blocks; remove skips holes.
    assert_eq!(bt.fork(1, 5).unwrap(), vec![4, 1]);
    assert_eq!(bt.block_ids(5).unwrap(), &[HOLE, HOLE, HOLE, 4, 1]);
    assert_eq!(bt.remove_sequence(5).unwrap(), vec![4, 1]);
    assert_eq!(bt.remove_sequence(1).unwrap(), vec![4, 1]);
    // A hole the table does not count breaks integrity.
    bt.add_sequence(6, &[2]).unwrap();
    bt.tables.get_mut(&6).unwrap().entries.push(HOLE);
    assert_eq!(
        msg(bt.check_integrity(None)),
        "block tables integrity: sequence 6 counts 0 holes but has 1"
    );
}

#[test]
fn release_range_makes_holes_anywhere() {
    let (mut bt, mut pool) = setup();
    bt.grow(&mut pool, &[1], &[24]).unwrap(); // seq 1 -> 0, 1, 3, 4, 5, 6
    assert_eq!(bt.release_range(1, 1, 3).unwrap(), vec![1, 3]);
    pool.free(&[1, 3]).unwrap();
    assert_eq!(bt.block_ids(1).unwrap(), &[0, HOLE, HOLE, 4, 5, 6]);
    assert_eq!(bt.num_holes(1).unwrap(), 2);
    bt.check_integrity(Some(&pool)).unwrap();
    // Holes already there are skipped; an empty range releases nothing.
    assert_eq!(bt.release_range(1, 2, 4).unwrap(), vec![4]);
    pool.free(&[4]).unwrap();
    assert_eq!(bt.release_range(1, 1, 4).unwrap(), Vec::<u32>::new());
    assert_eq!(bt.release_range(1, 6, 6).unwrap(), Vec::<u32>::new());
    assert_eq!(bt.release_range(1, 5, 5).unwrap(), Vec::<u32>::new());
    assert_eq!(bt.num_holes(1).unwrap(), 3);
    bt.check_integrity(Some(&pool)).unwrap();
    // Errors change nothing.
    assert_eq!(
        msg(bt.release_range(1, 2, 7)),
        "cannot release blocks [2, 7) of sequence 1: it has 6"
    );
    assert_eq!(
        msg(bt.release_range(1, 3, 2)),
        "cannot release blocks [3, 2) of sequence 1: it has 6"
    );
    assert!(msg(bt.release_range(1, u64::MAX, u64::MAX)).contains("it has 6"));
    assert_eq!(msg(bt.release_range(9, 0, 0)), "unknown sequence 9");
    assert_eq!(bt.block_ids(1).unwrap(), &[0, HOLE, HOLE, HOLE, 5, 6]);
    // A wider range counts only what is still held, skipping the holes in it.
    assert_eq!(bt.release_range(1, 0, 5).unwrap(), vec![0, 5]);
    pool.free(&[0, 5]).unwrap();
    assert_eq!(bt.num_holes(1).unwrap(), 5);
    // Export writes middle holes as pad; fork copies them and their count.
    bt.add_sequence(4, &[]).unwrap();
    bt.grow(&mut pool, &[4], &[12]).unwrap();
    let ids = bt.block_ids(4).unwrap().to_vec();
    assert_eq!(bt.release_range(4, 1, 2).unwrap(), vec![ids[1]]);
    pool.free(&[ids[1]]).unwrap();
    let mut buf = vec![9i32; 8];
    let cells = Cell::from_mut(&mut buf[..]).as_slice_of_cells();
    bt.export_into(&[4], cells, 4, -1).unwrap();
    assert_eq!(buf, vec![ids[0] as i32, -1, ids[2] as i32, -1, 9, 9, 9, 9]);
    assert_eq!(bt.fork(4, 7).unwrap(), vec![ids[0], ids[2]]);
    assert_eq!(bt.num_holes(7).unwrap(), 1);
    pool.incref(ids[0]).unwrap(); // seq 7's references
    pool.incref(ids[2]).unwrap();
    bt.check_integrity(Some(&pool)).unwrap();
    pool.check_integrity().unwrap();
}

#[test]
fn append_holes_adds_counted_slots() {
    let (mut bt, mut pool) = setup();
    bt.append_holes(3, 2).unwrap();
    assert_eq!(bt.grow(&mut pool, &[3], &[12]).unwrap(), 1); // the holes' slots count
    bt.append_holes(3, 0).unwrap();
    assert_eq!(bt.block_ids(3).unwrap(), &[HOLE, HOLE, 3]);
    assert_eq!(
        (bt.num_holes(3).unwrap(), bt.num_blocks(3).unwrap()),
        (2, 3)
    );
    bt.check_integrity(Some(&pool)).unwrap();
    // Growth counts the holes' slots; the limit is checked first and changes nothing.
    assert_eq!(bt.grow(&mut pool, &[3], &[16]).unwrap(), 1);
    assert!(value_msg(bt.append_holes(3, MAX_TABLE_LEN)).contains("at most 2**26 entries"));
    assert!(value_msg(bt.append_holes(3, u64::MAX)).contains("at most"));
    assert_eq!(msg(bt.append_holes(9, 1)), "unknown sequence 9");
    assert_eq!(bt.num_blocks(3).unwrap(), 4);
    // Appended blocks go after the holes, which keep their slots and their count.
    bt.append_blocks(3, &pool.allocate(1).unwrap()).unwrap();
    assert_eq!(bt.block_ids(3).unwrap(), &[HOLE, HOLE, 3, 4, 5]);
    assert_eq!(bt.num_holes(3).unwrap(), 2);
    bt.check_integrity(Some(&pool)).unwrap();
    assert_eq!(bt.remove_sequence(3).unwrap(), vec![3, 4, 5]);
}

#[test]
fn integrity_against_pool() {
    let (mut bt, pool) = setup();
    bt.check_integrity(Some(&pool)).unwrap();
    bt.append_blocks(3, &[9]).unwrap();
    assert_eq!(
        msg(bt.check_integrity(Some(&pool))),
        "block tables integrity: sequence 3 block 0 holds block 9 with ref_count 0"
    );
    bt.set_block(3, 0, 10).unwrap();
    assert!(msg(bt.check_integrity(Some(&pool))).contains("outside the pool of 10 blocks"));
    bt.check_integrity(None).unwrap();
    bt.tables.get_mut(&3).unwrap().entries[0] = MAX_BLOCK_ID + 1;
    assert!(msg(bt.check_integrity(None)).contains("invalid id"));
    pool.check_integrity().unwrap();
}

#[test]
fn cache_blocks_at_records_one_block_per_entry_and_rolls_back() {
    let mut pool = BlockPool::new(8).unwrap();
    let mut bt = BlockTables::new(4).unwrap();
    let a = pool.allocate(2).unwrap();
    let b = pool.allocate(2).unwrap();
    bt.add_sequence(1, &a).unwrap();
    bt.add_sequence(2, &b).unwrap();
    assert_eq!(
        bt.cache_blocks_at(&mut pool, &[1, 2], &[1, 0], &[11, 20])
            .unwrap(),
        2
    );
    assert_eq!(pool.lookup_prefix(&[20]).unwrap(), vec![b[0]]);
    // already carrying its hash: not recorded again
    assert_eq!(bt.cache_blocks_at(&mut pool, &[1], &[1], &[11]).unwrap(), 0);
    assert!(value_msg(bt.cache_blocks_at(&mut pool, &[1], &[0, 1], &[1])).contains("differ"));
    assert_eq!(
        msg(bt.cache_blocks_at(&mut pool, &[2, 2], &[1, 2], &[21, 22])),
        "index 2 out of range for sequence 2 with 2 blocks"
    );
    // a block carrying another hash fails the second entry: the first is undone
    assert!(bt
        .cache_blocks_at(&mut pool, &[2, 1], &[1, 1], &[21, 99])
        .is_err());
    assert!(pool.lookup_prefix(&[21]).unwrap().is_empty());
}

fn is_memory<T: std::fmt::Debug>(r: KvResult<T>) -> bool {
    matches!(r, Err(KvError::Memory(_)))
}

#[test]
fn calls_the_host_cannot_hold_are_memory_errors_that_change_nothing() {
    use crate::error::test_alloc::with_alloc_limit;
    let big = vec![7u32; 1 << 20]; // 4 MiB of entries
    let (mut bt, pool) = setup();
    bt.add_sequence(4, &big).unwrap();
    let mut large_pool = BlockPool::new(1 << 20).unwrap();
    with_alloc_limit(1 << 20, || {
        assert!(is_memory(bt.add_sequence(5, &big)));
        assert!(is_memory(bt.append_blocks(1, &big)));
        assert!(is_memory(bt.fork(4, 6)));
        assert!(is_memory(bt.remove_sequence(4)));
        assert!(is_memory(bt.release_range(4, 0, 1 << 20)));
        assert!(is_memory(bt.grow(&mut large_pool, &[3], &[4 << 20])));
        assert!(is_memory(bt.append_holes(1, 1 << 20)));
    });
    assert_eq!(bt.seq_ids().unwrap(), [1, 2, 3, 4]);
    assert_eq!(bt.block_ids(1).unwrap(), &[0, 1]);
    assert_eq!(bt.block_ids(3).unwrap(), &[] as &[u32]);
    assert_eq!(
        (bt.num_blocks(4).unwrap(), bt.num_holes(4).unwrap()),
        (1 << 20, 0)
    );
    assert_eq!(large_pool.num_free_blocks(), 1 << 20);
    bt.remove_sequence(4).unwrap();
    bt.check_integrity(Some(&pool)).unwrap();
    pool.check_integrity().unwrap();
}

#[test]
fn an_emit_that_fails_changes_nothing() {
    let (mut bt, pool) = setup();
    let refuse = |_| Err::<(), _>(KvError::Memory("refused".into()));
    assert!(is_memory(bt.remove_sequence_then(1, refuse)));
    assert!(is_memory(bt.release_range_then(1, 0, 2, refuse)));
    assert!(is_memory(bt.fork_then(1, 7, refuse)));
    assert_eq!(bt.seq_ids().unwrap(), [1, 2, 3]);
    assert_eq!(bt.block_ids(1).unwrap(), &[0, 1]);
    assert_eq!(bt.num_holes(1).unwrap(), 0);
    bt.check_integrity(Some(&pool)).unwrap();
}
