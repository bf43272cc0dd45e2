//! Python wrapper of [`BlockTables`]: argument conversion and error mapping only.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::convert::{
    as_i32, as_u64, bad_table_block, block_hashes_arg, cache_err, count, empty_tuple,
    exact_counts_in, for_each_item, guard, int_default, new_seq_arg, reserve, seq_arg,
    seq_ids_into, table_block_ids, to_py, value_err, with_typed_buffer,
};
use super::out::{int_list, u128_int, vec_list};
use super::pool::PyBlockPool;
use super::room::PyLruRoom;
use crate::block_table::{BlockTables, HOLE};
use crate::error::{try_collect, MAX_BLOCK_ID};

/// Most items the reused scratch vectors keep room for between calls: a larger batch's
/// room is given back to the host when it returns.
const SCRATCH_KEPT: usize = 1 << 16;

/// A table entry as Python sees it: a block id, or -1 for a hole.
fn entry(b: u32) -> i32 {
    if b == HOLE {
        -1
    } else {
        // Entries other than holes are <= MAX_BLOCK_ID = i32::MAX.
        b as i32
    }
}

/// Fills `out` (cleared first) from `obj` and returns true if `obj` is a 1-D C-contiguous
/// int64 buffer (a numpy array: see [`with_typed_buffer`]); false, reading nothing, for anything
/// else. `negative` builds the error for a value below 0.
fn int64_array_into(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<u64>,
    negative: impl Fn(i64) -> PyErr,
) -> PyResult<bool> {
    let read = with_typed_buffer::<i64, ()>(obj, &[], |values| {
        out.clear();
        reserve(out, values.len(), "the batch")?;
        for &v in values {
            if v < 0 {
                return Err(negative(v));
            }
            out.push(v as u64);
        }
        Ok(())
    })?;
    Ok(read.is_some())
}

/// Fills `out` (cleared first) with the non-negative counts of the list or tuple `obj`
/// (argument `what`; see [`count`]): one past u64 reads as u64::MAX where `saturate`, and
/// is a ValueError otherwise.
fn counts_into(
    obj: &Bound<'_, PyAny>,
    what: &str,
    out: &mut Vec<u64>,
    saturate: bool,
) -> PyResult<()> {
    if exact_counts_in(obj, out)? {
        return Ok(());
    }
    out.clear();
    for_each_item(obj, what, |x| {
        if out.len() == out.capacity() {
            reserve(out, 1, what)?;
        }
        let n = count(x, what)?;
        if n == u64::MAX && !saturate && as_u64(x)?.is_none() {
            return Err(value_err(format!("{what} {x} is not in [0, 2**64)")));
        }
        out.push(n);
        Ok(())
    })
}

#[pyclass(name = "BlockTables", module = "enginekit._native")]
pub(super) struct PyBlockTables {
    pub(crate) inner: BlockTables,
    /// Scratch for batch calls, reused across calls.
    seqs: Vec<u64>,
    toks: Vec<u64>,
}

impl PyBlockTables {
    /// The id of an existing sequence, checked before the call's other arguments so that
    /// an unknown sequence is reported first.
    fn existing_seq_arg(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<u64> {
        let s = seq_arg(seq_id)?;
        self.inner.num_blocks(s).map_err(to_py)?;
        Ok(s)
    }

    /// A logical index into an existing sequence's table; an int outside u64 is out of range.
    fn index_arg(&self, seq_id: u64, index: &Bound<'_, PyAny>) -> PyResult<u64> {
        let len = self.inner.num_blocks(seq_id).map_err(to_py)?;
        as_u64(index)?.ok_or_else(|| {
            cache_err(format!(
                "index {index} out of range for sequence {seq_id} with {len} blocks"
            ))
        })
    }

    /// Converts a batch of (seq_ids, num_tokens), each a list or tuple of ints or a 1-D
    /// int64 array, into the scratch vectors.
    fn batch_args(
        &mut self,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let unknown = |v: i64| cache_err(format!("unknown sequence {v}"));
        if !int64_array_into(seq_ids, &mut self.seqs, unknown)? {
            seq_ids_into(seq_ids, &mut self.seqs)?;
        }
        let negative = |v: i64| value_err(format!("num_tokens must be non-negative, got {v}"));
        if int64_array_into(num_tokens, &mut self.toks, negative)? {
            return Ok(());
        }
        counts_into(num_tokens, "num_tokens", &mut self.toks, false)
    }

    /// Gives back the scratch vectors' room after a batch larger than [`SCRATCH_KEPT`].
    fn trim_scratch(&mut self) {
        for v in [&mut self.seqs, &mut self.toks] {
            if v.capacity() > SCRATCH_KEPT {
                *v = Vec::new();
            }
        }
    }

    /// Writes the tables of the scratch `seqs` into `out` (see `export_into`), in place.
    fn export_rows(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        width: usize,
        pad: i32,
    ) -> PyResult<()> {
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

    #[pyo3(
        signature = (seq_id, block_ids = empty_tuple()),
        text_signature = "($self, seq_id, block_ids=())"
    )]
    fn add_sequence(
        &mut self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        block_ids: Py<PyAny>,
    ) -> PyResult<()> {
        guard(|| {
            let s = new_seq_arg(seq_id)?;
            let ids = table_block_ids(block_ids.bind(py))?;
            self.inner.add_sequence(s, &ids).map_err(to_py)
        })
    }

    fn remove_sequence<'py>(
        &mut self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.remove_sequence_then(s, |ids| vec_list(py, ids))
        })
    }

    fn free_sequence(
        &mut self,
        mut pool: PyRefMut<'_, PyBlockPool>,
        seq_id: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.free_sequence(&mut pool.inner, s).map_err(to_py)
        })
    }

    fn append_blocks(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        guard(|| {
            let s = self.existing_seq_arg(seq_id)?;
            let ids = table_block_ids(block_ids)?;
            self.inner.append_blocks(s, &ids).map_err(to_py)
        })
    }

    fn release_range<'py>(
        &mut self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
        first: &Bound<'py, PyAny>,
        end: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let s = self.existing_seq_arg(seq_id)?;
            let first = count(first, "first")?;
            let end = count(end, "end")?;
            self.inner
                .release_range_then(s, first, end, |ids| vec_list(py, ids))
        })
    }

    fn append_holes(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        num_holes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        guard(|| {
            let s = self.existing_seq_arg(seq_id)?;
            let n = count(num_holes, "num_holes")?;
            if as_u64(num_holes)?.is_none() {
                // Past u64: report the int as given, not the saturated count.
                let len = self.inner.num_blocks(s).map_err(to_py)?;
                return Err(to_py(BlockTables::too_many_holes(s, num_holes, len)));
            }
            self.inner.append_holes(s, n).map_err(to_py)
        })
    }

    fn num_holes(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.num_holes(s).map_err(to_py)
        })
    }

    fn fork<'py>(
        &mut self,
        py: Python<'py>,
        parent_id: &Bound<'py, PyAny>,
        child_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let p = self.existing_seq_arg(parent_id)?;
            let c = new_seq_arg(child_id)?;
            self.inner.fork_then(p, c, |ids| vec_list(py, ids))
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
                    // Report a bad index or a hole before a bad block id, as the core does.
                    if self.inner.block_id_at(s, i).map_err(to_py)? == HOLE {
                        return Err(to_py(BlockTables::hole_error(s, i)));
                    }
                    return Err(bad_table_block(block_id));
                }
            };
            self.inner.set_block(s, i, b).map_err(to_py)
        })
    }

    fn block_ids<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            let t = self.inner.block_ids(s).map_err(to_py)?;
            int_list(py, t.iter().map(|&b| entry(b)))
        })
    }

    fn block_id_at(&self, seq_id: &Bound<'_, PyAny>, index: &Bound<'_, PyAny>) -> PyResult<i32> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            let i = self.index_arg(s, index)?;
            Ok(entry(self.inner.block_id_at(s, i).map_err(to_py)?))
        })
    }

    fn num_blocks(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            self.inner.num_blocks(s).map_err(to_py)
        })
    }

    fn num_blocks_to_grow<'py>(
        &mut self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        guard(|| {
            let r = self.batch_args(seq_ids, num_tokens).and_then(|()| {
                let n = self.inner.num_blocks_to_grow(&self.seqs, &self.toks)?;
                u128_int(py, n)
            });
            self.trim_scratch();
            r
        })
    }

    fn grow(
        &mut self,
        mut pool: PyRefMut<'_, PyBlockPool>,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        guard(|| {
            let r = self
                .batch_args(seq_ids, num_tokens)
                .and_then(|()| Ok(self.inner.grow(&mut pool.inner, &self.seqs, &self.toks)?));
            self.trim_scratch();
            r
        })
    }

    /// `grow`, first asking `make_room(n)` for the `n` blocks the batch needs (as
    /// `num_blocks_to_grow` counts them) when `n > 0`: returns the blocks allocated, or None,
    /// changing nothing, if `make_room` returns false. The batch is read once, before the
    /// call back, and only the part of it that needs blocks is grown after it; no borrow of
    /// the tables or the pool is held during it. An `LruRoom` is run as its call would run
    /// it (on its own pool), without a call into Python; it cannot make room for more than
    /// 2**64 - 1 blocks.
    fn grow_with(
        slf: &Bound<'_, Self>,
        pool: &Bound<'_, PyBlockPool>,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        make_room: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u64>> {
        guard(|| {
            // The growing part is copied out of the scratch batch, which a call back into
            // another batch method may overwrite.
            let (seqs, toks, needed) = {
                let mut this = slf.try_borrow_mut()?;
                let growing = this.batch_args(seq_ids, num_tokens).and_then(|()| {
                    let mut growing = Vec::new();
                    let needed =
                        this.inner
                            .positions_to_grow(&this.seqs, &this.toks, &mut growing)?;
                    let seqs = try_collect(growing.iter().map(|&i| this.seqs[i]), "the batch")?;
                    let toks = try_collect(growing.iter().map(|&i| this.toks[i]), "the batch")?;
                    Ok((seqs, toks, needed))
                });
                this.trim_scratch();
                growing?
            };
            if needed == 0 {
                return Ok(Some(0));
            }
            let made = match make_room.downcast::<PyLruRoom>() {
                Ok(room) => match u64::try_from(needed) {
                    Ok(n) => room.get().make_room(slf.py(), n)?,
                    Err(_) => false,
                },
                _ => make_room
                    .call1((u128_int(slf.py(), needed)?,))?
                    .is_truthy()?,
            };
            if !made {
                return Ok(None);
            }
            let mut this = slf.try_borrow_mut()?;
            let mut pool = pool.try_borrow_mut()?;
            this.inner
                .grow(&mut pool.inner, &seqs, &toks)
                .map(Some)
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
            let hashes = block_hashes_arg(block_hashes)?;
            self.inner
                .cache_blocks(&mut pool.inner, s, first, &hashes)
                .map_err(to_py)
        })
    }

    fn cache_blocks_at(
        &mut self,
        mut pool: PyRefMut<'_, PyBlockPool>,
        seq_ids: &Bound<'_, PyAny>,
        block_indices: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        guard(|| {
            let r = seq_ids_into(seq_ids, &mut self.seqs)
                .and_then(|()| counts_into(block_indices, "block_indices", &mut self.toks, true))
                .and_then(|()| {
                    let hashes = block_hashes_arg(block_hashes)?;
                    Ok(self.inner.cache_blocks_at(
                        &mut pool.inner,
                        &self.seqs,
                        &self.toks,
                        &hashes,
                    )?)
                });
            self.trim_scratch();
            r
        })
    }

    fn max_num_blocks(&mut self, seq_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let r = seq_ids_into(seq_ids, &mut self.seqs)
                .and_then(|()| Ok(self.inner.max_num_blocks(&self.seqs)?));
            self.trim_scratch();
            r
        })
    }

    #[pyo3(
        signature = (seq_ids, out, width, pad = int_default(-1)),
        text_signature = "($self, seq_ids, out, width, pad=-1)"
    )]
    fn export_into(
        &mut self,
        py: Python<'_>,
        seq_ids: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        width: &Bound<'_, PyAny>,
        pad: Py<PyAny>,
    ) -> PyResult<()> {
        guard(|| {
            let r = self.export_args(py, seq_ids, out, width, pad);
            self.trim_scratch();
            r
        })
    }

    fn seq_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| vec_list(py, self.inner.seq_ids()?))
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

impl PyBlockTables {
    /// `export_into` with its arguments read: see there.
    fn export_args(
        &mut self,
        py: Python<'_>,
        seq_ids: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        width: &Bound<'_, PyAny>,
        pad: Py<PyAny>,
    ) -> PyResult<()> {
        seq_ids_into(seq_ids, &mut self.seqs)?;
        let width = match as_u64(width)?.and_then(|w| usize::try_from(w).ok()) {
            Some(w) => w,
            None => {
                return Err(value_err(format!(
                    "width must be non-negative, got {width}"
                )))
            }
        };
        let pad = match as_i32(pad.bind(py))? {
            Some(v) => v,
            None => return Err(value_err(format!("pad {pad} is not in [-2**31, 2**31)"))),
        };
        self.export_rows(py, out, width, pad)
    }
}
