//! Python wrappers (`enginekit._native`): argument conversion, error mapping, panic fencing.
//!
//! No logic lives here. Every method body runs inside [`guard`], so a Rust panic reaches
//! Python as `KVCacheError("internal error: ...")`, never as a `PanicException`. Python ints
//! outside the Rust integer ranges become the error the stub documents (an unknown id is a
//! `KVCacheError`, a bad value a `ValueError`), never an `OverflowError`.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::block_pool::{BlockPool, KvError, MAX_BLOCKS};
use crate::block_table::{BlockTables, MAX_BLOCK_ID};
use crate::hash::{self, ROOT_HASH};

pyo3::import_exception!(enginekit.errors, KVCacheError);
pyo3::import_exception!(enginekit.errors, OutOfBlocksError);

fn to_py(e: KvError) -> PyErr {
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
fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(KVCacheError::new_err(format!(
            "internal error: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

fn value_err(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

fn cache_err(msg: String) -> PyErr {
    KVCacheError::new_err(msg)
}

/// `Some(v)` for an int in [0, 2**64), `None` for an int outside it; a non-int is a TypeError.
fn as_u64(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    match obj.extract::<u64>() {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `Some(v)` for an int in the int32 range, `None` for an int outside it.
fn as_i32(obj: &Bound<'_, PyAny>) -> PyResult<Option<i32>> {
    match obj.extract::<i32>() {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A non-negative count: `Err(ValueError)` if negative, saturated at u64::MAX if huge.
fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    match as_u64(obj)? {
        Some(v) => Ok(v),
        None if obj.lt(0)? => Err(value_err(format!("{what} must be non-negative, got {obj}"))),
        None => Ok(u64::MAX),
    }
}

/// Calls `f` on every item of a list, tuple or other iterable.
fn for_each_item(
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
fn collect_ints<T>(
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

fn seq_ids_into(obj: &Bound<'_, PyAny>, out: &mut Vec<u64>) -> PyResult<()> {
    collect_ints(obj, out, u64::MAX, |x| {
        cache_err(format!("unknown sequence {x}"))
    })
}

fn table_block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut v = Vec::new();
    collect_ints(obj, &mut v, u64::from(MAX_BLOCK_ID), bad_table_block)?;
    Ok(v)
}

fn bad_table_block(x: &Bound<'_, PyAny>) -> PyErr {
    value_err(format!("block id {x} is not in [0, 2**31)"))
}

/// An existing sequence's id: an int outside u64 is an unknown sequence.
fn seq_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| cache_err(format!("unknown sequence {obj}")))
}

/// A new sequence's id, which must fit in u64.
fn new_seq_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| value_err(format!("sequence id {obj} is not in [0, 2**64)")))
}

fn hash_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
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

fn token_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
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

#[pyclass(name = "BlockPool", module = "enginekit._native")]
pub struct PyBlockPool {
    inner: BlockPool,
    /// Scratch for `free`, reused across calls.
    ids: Vec<u32>,
}

impl PyBlockPool {
    /// A pool block id: an int outside the pool is an unknown block.
    fn block_arg(&self, obj: &Bound<'_, PyAny>) -> PyResult<u32> {
        match as_u64(obj)? {
            Some(v) if v < u64::from(self.inner.num_blocks()) => Ok(v as u32),
            _ => Err(self.unknown_block(obj)),
        }
    }

    fn unknown_block(&self, obj: &Bound<'_, PyAny>) -> PyErr {
        cache_err(format!(
            "unknown block {obj} (pool has {} blocks)",
            self.inner.num_blocks()
        ))
    }
}

#[pymethods]
impl PyBlockPool {
    #[new]
    fn new(num_blocks: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(|| {
            let n = match as_u64(num_blocks)? {
                Some(v) if v <= u64::from(MAX_BLOCKS) => v as u32,
                _ => {
                    return Err(value_err(format!(
                        "num_blocks must be in [1, {MAX_BLOCKS}], got {num_blocks}"
                    )))
                }
            };
            Ok(PyBlockPool {
                inner: BlockPool::new(n).map_err(to_py)?,
                ids: Vec::new(),
            })
        })
    }

    #[getter]
    fn num_blocks(&self) -> PyResult<u32> {
        guard(|| Ok(self.inner.num_blocks()))
    }

    #[getter]
    fn num_free_blocks(&self) -> PyResult<u32> {
        guard(|| Ok(self.inner.num_free_blocks()))
    }

    #[getter]
    fn num_evictable_blocks(&self) -> PyResult<u32> {
        guard(|| Ok(self.inner.num_evictable_blocks()))
    }

    #[getter]
    fn num_used_blocks(&self) -> PyResult<u32> {
        guard(|| Ok(self.inner.num_used_blocks()))
    }

    fn allocate(&mut self, num_blocks: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        guard(|| {
            let n = count(num_blocks, "num_blocks")?;
            if n == u64::MAX {
                return Err(OutOfBlocksError::new_err(format!(
                    "cannot allocate {num_blocks} blocks: only {} free",
                    self.inner.num_free_blocks()
                )));
            }
            self.inner.allocate(n).map_err(to_py)
        })
    }

    fn incref(&mut self, block_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.incref(b).map_err(to_py)
        })
    }

    fn decref(&mut self, block_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.decref(b).map_err(to_py)
        })
    }

    fn free(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let mut ids = std::mem::take(&mut self.ids);
            let max = u64::from(self.inner.num_blocks()) - 1;
            let r = collect_ints(block_ids, &mut ids, max, |x| self.unknown_block(x))
                .and_then(|()| self.inner.free(&ids).map_err(to_py));
            self.ids = ids;
            r
        })
    }

    fn touch(&mut self, block_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.touch(b).map_err(to_py)
        })
    }

    fn cache_block(
        &mut self,
        block_id: &Bound<'_, PyAny>,
        block_hash: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            let h = hash_arg(block_hash, "block_hash")?;
            self.inner.cache_block(b, h).map_err(to_py)
        })
    }

    fn lookup(&self, block_hash: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        guard(|| Ok(as_u64(block_hash)?.and_then(|h| self.inner.lookup(h))))
    }

    fn lookup_prefix(&self, block_hashes: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        guard(|| {
            let mut out = Vec::new();
            let mut hit = true;
            for_each_item(block_hashes, |x| {
                if hit {
                    match as_u64(x)?.and_then(|h| self.inner.lookup(h)) {
                        Some(b) => out.push(b),
                        None => hit = false,
                    }
                }
                Ok(())
            })?;
            Ok(out)
        })
    }

    fn block_hash(&self, block_id: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.block_hash(b).map_err(to_py)
        })
    }

    fn ref_count(&self, block_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.ref_count(b).map_err(to_py)
        })
    }

    fn evict(&mut self, block_id: &Bound<'_, PyAny>) -> PyResult<u64> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.evict(b).map_err(to_py)
        })
    }

    fn evict_lru(&mut self, num_blocks: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        guard(|| {
            let n = count(num_blocks, "num_blocks")?;
            if n == u64::MAX {
                return Err(OutOfBlocksError::new_err(format!(
                    "cannot evict {num_blocks} blocks: only {} evictable",
                    self.inner.num_evictable_blocks()
                )));
            }
            self.inner.evict_lru(n).map_err(to_py)
        })
    }

    fn free_block_ids(&self) -> PyResult<Vec<u32>> {
        guard(|| Ok(self.inner.free_block_ids()))
    }

    fn evictable_block_ids(&self) -> PyResult<Vec<u32>> {
        guard(|| Ok(self.inner.evictable_block_ids()))
    }

    fn ref_counts(&self) -> PyResult<Vec<u32>> {
        guard(|| Ok(self.inner.ref_counts().to_vec()))
    }

    fn cached_blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(|| {
            let d = PyDict::new(py);
            for (h, b) in self.inner.cached_blocks() {
                d.set_item(h, b)?;
            }
            Ok(d)
        })
    }

    fn check_integrity(&self) -> PyResult<()> {
        guard(|| self.inner.check_integrity().map_err(to_py))
    }
}

#[pyclass(name = "BlockTables", module = "enginekit._native")]
pub struct PyBlockTables {
    inner: BlockTables,
    /// Scratch for batch calls, reused across calls.
    seqs: Vec<u64>,
    toks: Vec<u64>,
}

impl PyBlockTables {
    /// A logical index into an existing sequence's table; an int outside u64 is out of range.
    fn index_arg(&self, seq_id: u64, index: &Bound<'_, PyAny>) -> PyResult<u64> {
        let len = self.inner.num_blocks(seq_id).map_err(to_py)?;
        as_u64(index)?.ok_or_else(|| {
            cache_err(format!(
                "index {index} out of range for sequence {seq_id} with {len} blocks"
            ))
        })
    }

    /// Converts a batch of (seq_ids, num_tokens) into the scratch vectors.
    fn batch_args(
        &mut self,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        seq_ids_into(seq_ids, &mut self.seqs)?;
        self.toks.clear();
        let toks = &mut self.toks;
        for_each_item(num_tokens, |x| {
            toks.push(count(x, "num_tokens")?);
            Ok(())
        })
    }
}

#[pymethods]
impl PyBlockTables {
    #[new]
    fn new(block_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(|| {
            let bs = as_u64(block_size)?.ok_or_else(|| {
                value_err(format!(
                    "block_size must be in [1, 2**64), got {block_size}"
                ))
            })?;
            Ok(PyBlockTables {
                inner: BlockTables::new(bs).map_err(to_py)?,
                seqs: Vec::new(),
                toks: Vec::new(),
            })
        })
    }

    #[getter]
    fn block_size(&self) -> PyResult<u64> {
        guard(|| Ok(self.inner.block_size()))
    }

    #[getter]
    fn num_sequences(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.num_sequences()))
    }

    fn has_sequence(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| Ok(as_u64(seq_id)?.is_some_and(|s| self.inner.has_sequence(s))))
    }

    #[pyo3(signature = (seq_id, block_ids = None))]
    fn add_sequence(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        block_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        guard(|| {
            let s = new_seq_arg(seq_id)?;
            let ids = match block_ids {
                Some(b) => table_block_ids(b)?,
                None => Vec::new(),
            };
            self.inner.add_sequence(s, &ids).map_err(to_py)
        })
    }

    fn remove_sequence(&mut self, seq_id: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.remove_sequence(s).map_err(to_py)
        })
    }

    fn append_blocks(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.num_blocks(s).map_err(to_py)?;
            let ids = table_block_ids(block_ids)?;
            self.inner.append_blocks(s, &ids).map_err(to_py)
        })
    }

    fn truncate(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.num_blocks(s).map_err(to_py)?;
            let n = count(num_blocks, "num_blocks")?;
            self.inner.truncate(s, n).map_err(to_py)
        })
    }

    fn fork(
        &mut self,
        parent_id: &Bound<'_, PyAny>,
        child_id: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        guard(|| {
            let p = seq_arg(parent_id)?;
            self.inner.num_blocks(p).map_err(to_py)?;
            let c = new_seq_arg(child_id)?;
            self.inner.fork(p, c).map_err(to_py)
        })
    }

    fn set_block(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        index: &Bound<'_, PyAny>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<u32> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            let i = self.index_arg(s, index)?;
            let b = match as_u64(block_id)? {
                Some(v) if v <= u64::from(MAX_BLOCK_ID) => v as u32,
                _ => {
                    // Report a bad index before a bad block id, as the core does.
                    self.inner.block_id_at(s, i).map_err(to_py)?;
                    return Err(bad_table_block(block_id));
                }
            };
            self.inner.set_block(s, i, b).map_err(to_py)
        })
    }

    fn block_ids(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            Ok(self.inner.block_ids(s).map_err(to_py)?.to_vec())
        })
    }

    fn block_id_at(&self, seq_id: &Bound<'_, PyAny>, index: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            let i = self.index_arg(s, index)?;
            self.inner.block_id_at(s, i).map_err(to_py)
        })
    }

    fn num_blocks(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.num_blocks(s).map_err(to_py)
        })
    }

    fn num_blocks_to_grow(
        &mut self,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        guard(|| {
            self.batch_args(seq_ids, num_tokens)?;
            self.inner
                .num_blocks_to_grow(&self.seqs, &self.toks)
                .map_err(to_py)
        })
    }

    fn grow(
        &mut self,
        mut pool: PyRefMut<'_, PyBlockPool>,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        guard(|| {
            self.batch_args(seq_ids, num_tokens)?;
            self.inner
                .grow(&mut pool.inner, &self.seqs, &self.toks)
                .map_err(to_py)
        })
    }

    fn cache_blocks(
        &self,
        mut pool: PyRefMut<'_, PyBlockPool>,
        seq_id: &Bound<'_, PyAny>,
        first_index: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            let first = self.index_arg(s, first_index)?;
            let mut hashes = Vec::new();
            collect_ints(block_hashes, &mut hashes, u64::MAX, |x| {
                value_err(format!("block_hash {x} is not in [0, 2**64)"))
            })?;
            self.inner
                .cache_blocks(&mut pool.inner, s, first, &hashes)
                .map_err(to_py)
        })
    }

    fn max_num_blocks(&mut self, seq_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            seq_ids_into(seq_ids, &mut self.seqs)?;
            self.inner.max_num_blocks(&self.seqs).map_err(to_py)
        })
    }

    #[pyo3(
        signature = (seq_ids, out, width, pad = None),
        text_signature = "($self, seq_ids, out, width, pad=-1)"
    )]
    fn export_into(
        &mut self,
        py: Python<'_>,
        seq_ids: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        width: &Bound<'_, PyAny>,
        pad: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        guard(|| {
            seq_ids_into(seq_ids, &mut self.seqs)?;
            let width = match as_u64(width)?.and_then(|w| usize::try_from(w).ok()) {
                Some(w) => w,
                None => {
                    return Err(value_err(format!(
                        "width must be non-negative, got {width}"
                    )))
                }
            };
            let pad = match pad {
                None => -1,
                Some(p) => match as_i32(p)? {
                    Some(v) => v,
                    None => return Err(value_err(format!("pad {p} is not in [-2**31, 2**31)"))),
                },
            };
            let buf = PyBuffer::<i32>::get(out).map_err(|e| {
                value_err(format!(
                    "out must be a writable C-contiguous int32 buffer: {e}"
                ))
            })?;
            let cells = match buf.as_mut_slice(py) {
                Some(c) => c,
                None if buf.readonly() => return Err(value_err("out is read-only".into())),
                None => return Err(value_err("out is not C-contiguous".into())),
            };
            self.inner
                .export_into(&self.seqs, cells, width, pad)
                .map_err(to_py)
        })
    }

    fn seq_ids(&self) -> PyResult<Vec<u64>> {
        guard(|| Ok(self.inner.seq_ids()))
    }

    #[pyo3(signature = (pool = None))]
    fn check_integrity(&self, pool: Option<PyRef<'_, PyBlockPool>>) -> PyResult<()> {
        guard(|| {
            self.inner
                .check_integrity(pool.as_ref().map(|p| &p.inner))
                .map_err(to_py)
        })
    }
}

/// Fills the `enginekit._native` module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ROOT_HASH", ROOT_HASH)?;
    m.add_function(wrap_pyfunction!(hash_block, m)?)?;
    m.add_function(wrap_pyfunction!(hash_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_class::<PyBlockPool>()?;
    m.add_class::<PyBlockTables>()?;
    Ok(())
}
