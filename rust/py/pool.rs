//! Python wrapper of [`BlockPool`]: argument conversion and error mapping only.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{
    as_u64, block_hashes_arg, cache_err, collect_ints, count, guard, to_py, typed_buffer,
    OutOfBlocksError,
};
use super::out::{int_dict, int_list, vec_list};
use crate::block_pool::BlockPool;
use crate::error::{KvResult, MAX_BLOCKS};

/// A number of blocks to allocate or evict: an int past u64 can never be met, so it is
/// an [`OutOfBlocksError`] against the `available` blocks of that `kind`.
fn request(num_blocks: &Bound<'_, PyAny>, verb: &str, available: u32, kind: &str) -> PyResult<u64> {
    let n = count(num_blocks, "num_blocks")?;
    if n == u64::MAX {
        return Err(OutOfBlocksError::new_err(format!(
            "cannot {verb} {num_blocks} blocks: only {available} {kind}"
        )));
    }
    Ok(n)
}

/// Most ids the reused scratch keeps room for between calls: a larger call's room is given
/// back to the host when it returns.
const SCRATCH_KEPT: usize = 1 << 16;

#[pyclass(name = "BlockPool", module = "enginekit._native")]
pub(super) struct PyBlockPool {
    pub(crate) inner: BlockPool,
    /// Scratch for `free`, reused across calls.
    ids: Vec<u32>,
}

impl PyBlockPool {
    /// `f` on the pool and the ids of the list or tuple `block_ids`, read into the reused
    /// scratch (an id outside the pool is an unknown block).
    fn with_block_ids<T>(
        &mut self,
        block_ids: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut BlockPool, &[u32]) -> KvResult<T>,
    ) -> PyResult<T> {
        let mut ids = std::mem::take(&mut self.ids);
        let max = u64::from(self.inner.num_blocks()) - 1;
        let r = collect_ints(block_ids, "block_ids", &mut ids, max, |x| {
            self.unknown_block(x)
        })
        .and_then(|()| f(&mut self.inner, &ids).map_err(to_py));
        if ids.capacity() <= SCRATCH_KEPT {
            self.ids = ids;
        }
        r
    }

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
                _ => return Err(to_py(BlockPool::bad_size(num_blocks))),
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

    fn allocate<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let n = request(num_blocks, "allocate", self.inner.num_free_blocks(), "free")?;
            self.inner.allocate_then(n, |ids| int_list(py, ids))
        })
    }

    fn allocate_run<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let n = request(num_blocks, "allocate", self.inner.num_free_blocks(), "free")?;
            self.inner.allocate_run_then(n, |ids| int_list(py, ids))
        })
    }

    fn longest_free_run(&self) -> PyResult<u32> {
        guard(|| Ok(self.inner.longest_free_run()))
    }

    fn incref(&mut self, block_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let b = self.block_arg(block_id)?;
            self.inner.incref(b).map_err(to_py)
        })
    }

    fn incref_all(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| self.with_block_ids(block_ids, |pool, ids| pool.incref_all(ids)))
    }

    fn free(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| self.with_block_ids(block_ids, |pool, ids| pool.free(ids)))
    }

    fn lookup_prefix<'py>(
        &self,
        py: Python<'py>,
        block_hashes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let hashes = match typed_buffer::<u64>(block_hashes, &["Q", "L"], usize::MAX)? {
                Some(hashes) => hashes,
                None => block_hashes_arg(block_hashes)?,
            };
            vec_list(py, self.inner.lookup_prefix(&hashes)?)
        })
    }

    fn num_unreferenced(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<u64> {
        guard(|| self.with_block_ids(block_ids, |pool, ids| pool.num_unreferenced(ids)))
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

    fn evict_lru<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let n = request(
                num_blocks,
                "evict",
                self.inner.num_evictable_blocks(),
                "evictable",
            )?;
            self.inner.evict_lru_then(n, |ids| int_list(py, ids))
        })
    }

    fn make_room_lru(
        &mut self,
        num_blocks: &Bound<'_, PyAny>,
        num_kept_free: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        guard(|| {
            let n = count(num_blocks, "num_blocks")?;
            let kept = count(num_kept_free, "num_kept_free")?;
            Ok(self.inner.make_room_lru(n, kept))
        })
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| int_list(py, self.inner.free_ids()))
    }

    fn evictable_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| int_list(py, self.inner.evictable_ids()))
    }

    fn ref_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| int_list(py, self.inner.ref_counts().iter().copied()))
    }

    fn cached_blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(|| int_dict(py, self.inner.cached_blocks()))
    }

    fn record_accesses(&mut self, on: bool) -> PyResult<()> {
        guard(|| {
            self.inner.record_accesses(on);
            Ok(())
        })
    }

    #[getter]
    fn is_recording_accesses(&self) -> PyResult<bool> {
        guard(|| Ok(self.inner.is_recording_accesses()))
    }

    fn take_accesses<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let accesses = self.inner.take_accesses();
            let items = accesses
                .iter()
                .map(|a| (a.kind as u8, a.block, a.content, a.parent));
            Ok(PyList::new(py, items)?)
        })
    }

    fn check_integrity(&self) -> PyResult<()> {
        guard(|| self.inner.check_integrity().map_err(to_py))
    }
}
