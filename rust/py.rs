//! Python wrappers (`enginekit._native`): argument conversion, error mapping, panic fencing.
//!
//! No logic lives here. Every method body runs inside [`guard`], so a Rust panic reaches
//! Python as `KVCacheError("internal error: ...")`, never as a `PanicException`. Python ints
//! outside the Rust integer ranges become the error the stub documents (an unknown id is a
//! `KVCacheError`, a bad value a `ValueError`), never an `OverflowError`.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::block_pool::KvError;
use crate::block_table::MAX_BLOCK_ID;
use crate::hash::{self, ROOT_HASH};
use crate::py_pool::PyBlockPool;
use crate::py_radix;
use crate::py_tables::PyBlockTables;

pyo3::import_exception!(enginekit.errors, KVCacheError);
pyo3::import_exception!(enginekit.errors, OutOfBlocksError);

pub(crate) fn to_py(e: KvError) -> PyErr {
    match e {
        KvError::Value(m) => PyValueError::new_err(m),
        KvError::Cache(m) => KVCacheError::new_err(m),
        KvError::OutOfBlocks(m) => OutOfBlocksError::new_err(m),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "panic with a non-string payload"
    }
}

/// Runs a method body; a panic becomes `KVCacheError("internal error: ...")`.
pub(crate) fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(KVCacheError::new_err(format!(
            "internal error: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

pub(crate) fn value_err(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

pub(crate) fn cache_err(msg: String) -> PyErr {
    KVCacheError::new_err(msg)
}

/// `Some(v)` for an int in [0, 2**64), `None` for an int outside it; a non-int is a TypeError.
pub(crate) fn as_u64(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    match obj.extract::<u64>() {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `Some(v)` for an int in the int32 range, `None` for an int outside it.
pub(crate) fn as_i32(obj: &Bound<'_, PyAny>) -> PyResult<Option<i32>> {
    match obj.extract::<i32>() {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A non-negative count: `Err(ValueError)` if negative, saturated at u64::MAX if huge.
pub(crate) fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    match as_u64(obj)? {
        Some(v) => Ok(v),
        None if obj.lt(0)? => Err(value_err(format!("{what} must be non-negative, got {obj}"))),
        None => Ok(u64::MAX),
    }
}

/// Calls `f` on every item of a list, tuple or other iterable.
pub(crate) fn for_each_item(
    obj: &Bound<'_, PyAny>,
    mut f: impl FnMut(&Bound<'_, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if let Ok(list) = obj.downcast::<PyList>() {
        for x in list.iter() {
            f(&x)?;
        }
    } else if let Ok(tuple) = obj.downcast::<PyTuple>() {
        for x in tuple.iter() {
            f(&x)?;
        }
    } else {
        for x in obj.try_iter()? {
            f(&x?)?;
        }
    }
    Ok(())
}

/// Fills `out` (cleared first) with the ints of `obj`, each at most `max`; `bad` builds the
/// error for an int outside [0, max].
pub(crate) fn collect_ints<T>(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<T>,
    max: u64,
    bad: impl Fn(&Bound<'_, PyAny>) -> PyErr,
) -> PyResult<()>
where
    T: TryFrom<u64>,
    <T as TryFrom<u64>>::Error: std::fmt::Debug,
{
    out.clear();
    for_each_item(obj, |x| match as_u64(x)? {
        Some(v) if v <= max => {
            out.push(T::try_from(v).expect("max fits the target type"));
            Ok(())
        }
        _ => Err(bad(x)),
    })
}

pub(crate) fn seq_ids_into(obj: &Bound<'_, PyAny>, out: &mut Vec<u64>) -> PyResult<()> {
    collect_ints(obj, out, u64::MAX, |x| {
        cache_err(format!("unknown sequence {x}"))
    })
}

pub(crate) fn table_block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut v = Vec::new();
    collect_ints(obj, &mut v, u64::from(MAX_BLOCK_ID), bad_table_block)?;
    Ok(v)
}

pub(crate) fn bad_table_block(x: &Bound<'_, PyAny>) -> PyErr {
    value_err(format!("block id {x} is not in [0, 2**31)"))
}

/// An existing sequence's id: an int outside u64 is an unknown sequence.
pub(crate) fn seq_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| cache_err(format!("unknown sequence {obj}")))
}

/// A new sequence's id, which must fit in u64.
pub(crate) fn new_seq_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| value_err(format!("sequence id {obj} is not in [0, 2**64)")))
}

pub(crate) fn hash_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| value_err(format!("{what} {obj} is not in [0, 2**64)")))
}

fn extra_key_arg(extra_key: Option<&[u8]>) -> PyResult<Option<&[u8]>> {
    match extra_key {
        Some(k) if u32::try_from(k.len()).is_err() => Err(value_err(format!(
            "extra_key is {} bytes, more than 2**32 - 1",
            k.len()
        ))),
        k => Ok(k),
    }
}

pub(crate) fn token_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut v = Vec::new();
    collect_ints(obj, &mut v, u64::from(u32::MAX), |x| {
        value_err(format!("token id {x} is not in [0, 2**32)"))
    })?;
    Ok(v)
}

/// Chained 64-bit hash of one block (spec in rust/hash.rs).
#[pyfunction]
#[pyo3(signature = (parent_hash, token_ids, extra_key = None))]
fn hash_block(
    parent_hash: &Bound<'_, PyAny>,
    token_ids: &Bound<'_, PyAny>,
    extra_key: Option<&[u8]>,
) -> PyResult<u64> {
    guard(|| {
        let parent = hash_arg(parent_hash, "parent_hash")?;
        let tokens = token_ids_arg(token_ids)?;
        let extra = extra_key_arg(extra_key)?;
        Ok(hash::hash_block(parent, &tokens, extra))
    })
}

/// Chained hashes of every full block of token_ids; a trailing partial block is ignored.
#[pyfunction]
#[pyo3(signature = (token_ids, block_size, extra_key = None, parent_hash = None))]
fn hash_blocks(
    token_ids: &Bound<'_, PyAny>,
    block_size: &Bound<'_, PyAny>,
    extra_key: Option<&[u8]>,
    parent_hash: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<u64>> {
    guard(|| {
        let tokens = token_ids_arg(token_ids)?;
        let bs = match as_u64(block_size)? {
            Some(0) => None,
            Some(v) => Some(v),
            None if block_size.lt(1)? => None,
            None => Some(u64::MAX),
        }
        .ok_or_else(|| value_err(format!("block_size must be >= 1, got {block_size}")))?;
        let extra = extra_key_arg(extra_key)?;
        let parent = match parent_hash {
            Some(p) => hash_arg(p, "parent_hash")?,
            None => ROOT_HASH,
        };
        let bs = usize::try_from(bs).unwrap_or(usize::MAX);
        Ok(hash::hash_blocks(&tokens, bs, extra, parent))
    })
}

/// Test hook: panics inside the guard, proving a panic reaches Python as KVCacheError.
#[pyfunction]
fn _panic_for_test() -> PyResult<()> {
    guard(|| panic!("forced panic for test"))
}

/// Fills the `enginekit._native` module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ROOT_HASH", ROOT_HASH)?;
    m.add_function(wrap_pyfunction!(hash_block, m)?)?;
    m.add_function(wrap_pyfunction!(hash_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_class::<PyBlockPool>()?;
    m.add_class::<PyBlockTables>()?;
    py_radix::register(m)
}
