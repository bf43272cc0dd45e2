//! Errors of the bookkeeping core and the limits every structure enforces.
//!
//! The Python wrapper maps each [`KvError`] kind to one exception class; the pure-Python twins
//! (`enginekit/kv/pyref/`) enforce the same limits with the same classes.

use std::collections::{HashMap, TryReserveError};
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// Largest pool, in blocks: 2**26 (67,108,864). The pool's own bookkeeping costs 32 bytes a
/// block (2 GiB at the limit); a 141 GB GPU split into this many blocks would give each about
/// 2.1 KB, less than one token's KV in any production model. Larger sizes are refused up front
/// (`Value`), not attempted.
pub const MAX_BLOCKS: u32 = 1 << 26;

/// Largest block id a table or a radix node accepts: ids must fit an int32 export.
pub const MAX_BLOCK_ID: u32 = i32::MAX as u32;

/// Most entries `append_holes` lets a table reach: 2**26, a context of 2**26 tokens at block
/// size 1 (256 MiB of entries). Larger sizes are refused up front (`Value`).
pub const MAX_TABLE_LEN: u64 = 1 << 26;

/// An error of the bookkeeping core; the Python wrapper maps each kind to an exception class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// A bad argument value (Python `ValueError`).
    Value(String),
    /// A refused bookkeeping call (`enginekit.errors.KVCacheError`).
    Cache(String),
    /// Not enough blocks (`enginekit.errors.OutOfBlocksError`).
    OutOfBlocks(String),
    /// A host allocation failed (Python `MemoryError`); nothing changed.
    Memory(String),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::Value(m)
            | KvError::Cache(m)
            | KvError::OutOfBlocks(m)
            | KvError::Memory(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for KvError {}

pub type KvResult<T> = Result<T, KvError>;

pub(crate) fn cache_err<T>(msg: String) -> KvResult<T> {
    Err(KvError::Cache(msg))
}

/// The `Memory` error of a failed reservation of `what`.
#[cold]
pub(crate) fn memory_err(what: &str, e: TryReserveError) -> KvError {
    KvError::Memory(format!("cannot allocate {what}: {e}"))
}

// Every allocation whose size a caller's argument or a structure's size sets goes through
// the helpers below, before the call changes anything: a host that cannot hold it gets a
// `Memory` error (Python `MemoryError`) instead of an abort of the process.

/// An empty vector with room for `n` items, or a `Memory` error.
pub(crate) fn try_with_capacity<T>(n: usize, what: &str) -> KvResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| memory_err(what, e))?;
    Ok(v)
}

/// Room in `v` for `additional` more items (growing as `Vec::reserve` does), or a `Memory`
/// error, `v` unchanged.
#[inline]
pub(crate) fn try_reserve<T>(v: &mut Vec<T>, additional: usize, what: &str) -> KvResult<()> {
    v.try_reserve(additional).map_err(|e| memory_err(what, e))
}

/// A vector of `n` copies of `value`, or a `Memory` error instead of an abort.
pub(crate) fn try_filled<T: Clone>(n: usize, value: T, what: &str) -> KvResult<Vec<T>> {
    let mut v = try_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// A copy of `items`, or a `Memory` error.
pub(crate) fn try_to_vec<T: Clone>(items: &[T], what: &str) -> KvResult<Vec<T>> {
    let mut v = try_with_capacity(items.len(), what)?;
    v.extend_from_slice(items);
    Ok(v)
}

/// The items of an iterator that knows its length, in one reservation, or a `Memory` error.
pub(crate) fn try_collect<T>(
    items: impl ExactSizeIterator<Item = T>,
    what: &str,
) -> KvResult<Vec<T>> {
    let mut v = try_with_capacity(items.len(), what)?;
    v.extend(items);
    Ok(v)
}

/// Room in the map `m` for `additional` more entries, or a `Memory` error, `m` unchanged.
pub(crate) fn try_reserve_map<K, V, S>(
    m: &mut HashMap<K, V, S>,
    additional: usize,
    what: &str,
) -> KvResult<()>
where
    K: Eq + Hash,
    S: BuildHasher,
{
    m.try_reserve(additional).map_err(|e| memory_err(what, e))
}

#[cfg(test)]
pub(crate) mod test_alloc {
    //! A global allocator for the unit tests that refuses, on the calling thread only,
    //! any allocation larger than a limit set for the duration of a closure: the fallible
    //! paths are tested with allocations that really fail.

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    struct Limited;

    /// Whether an allocation of `size` bytes may go ahead: always while the thread panics,
    /// so that a failing test reports its panic.
    fn allowed(size: usize) -> bool {
        std::thread::panicking() || LIMIT.try_with(|l| size <= l.get()).unwrap_or(true)
    }

    // SAFETY: every call is passed on to `System` unchanged, or refused with null, which
    // the `GlobalAlloc` contract allows for any allocation.
    unsafe impl GlobalAlloc for Limited {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if allowed(layout.size()) {
                System.alloc(layout)
            } else {
                std::ptr::null_mut()
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            System.dealloc(ptr, layout)
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            if allowed(layout.size()) {
                System.alloc_zeroed(layout)
            } else {
                std::ptr::null_mut()
            }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            if allowed(new_size) {
                System.realloc(ptr, layout, new_size)
            } else {
                std::ptr::null_mut()
            }
        }
    }

    #[global_allocator]
    static GLOBAL: Limited = Limited;

    /// Lifts the limit when `with_alloc_limit` returns or unwinds.
    struct Restore(usize);

    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.with(|l| l.set(self.0));
        }
    }

    /// `f()` with every allocation of more than `max_bytes` on this thread failing.
    pub(crate) fn with_alloc_limit<R>(max_bytes: usize, f: impl FnOnce() -> R) -> R {
        let _restore = Restore(LIMIT.with(|l| l.replace(max_bytes)));
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::test_alloc::with_alloc_limit;
    use super::*;

    #[test]
    fn failed_reservations_are_memory_errors() {
        let big = usize::MAX / 8;
        assert!(matches!(
            try_with_capacity::<u64>(big, "x"),
            Err(KvError::Memory(_))
        ));
        assert!(matches!(
            try_filled(big, 0u32, "x"),
            Err(KvError::Memory(_))
        ));
        let mut v = vec![1u32];
        assert!(matches!(
            try_reserve(&mut v, big, "x"),
            Err(KvError::Memory(_))
        ));
        assert_eq!(v, [1]);
        let mut m: HashMap<u64, u64> = HashMap::new();
        assert!(matches!(
            try_reserve_map(&mut m, big, "x"),
            Err(KvError::Memory(_))
        ));
        let e = with_alloc_limit(1 << 10, || try_to_vec(&[0u8; 4096], "4096 bytes"));
        let msg = e.unwrap_err().to_string();
        assert!(msg.starts_with("cannot allocate 4096 bytes: memory allocation failed"));
        let ok = with_alloc_limit(1 << 10, || try_collect((0..10u32).rev(), "x")).unwrap();
        assert_eq!(ok, (0..10).rev().collect::<Vec<_>>());
    }
}
