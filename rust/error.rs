//! Errors of the bookkeeping core and the limits every structure enforces.
//!
//! The Python wrapper maps each [`KvError`] kind to one exception class; the pure-Python twins
//! (`enginekit/kv/pyref/`) enforce the same limits with the same classes.

use std::collections::TryReserveError;
use std::fmt;

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
pub(crate) fn memory_err(what: &str, e: TryReserveError) -> KvError {
    KvError::Memory(format!("cannot allocate {what}: {e}"))
}

/// A vector of `n` copies of `value`, or a `Memory` error instead of an abort.
pub(crate) fn try_filled<T: Clone>(n: usize, value: T, what: &str) -> KvResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| memory_err(what, e))?;
    v.resize(n, value);
    Ok(v)
}
