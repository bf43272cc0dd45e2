//! Python wrapper of [`HashChains`]: argument conversion and error mapping only.
//!
//! Token ranges are read by slicing the caller's sequence (a list, a tuple or an
//! `array("I")`), so only the tokens of the blocks to name are converted; the sequence's
//! type is checked whole (TypeError for anything else) even where no token is read.

use pyo3::buffer::PyBuffer;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice, PyTuple};

use super::convert::{
    as_u64, collect_ints, count, extra_key_arg, guard, hash_arg, is_empty_buffer, new_seq_arg,
    reserve, seq_arg, seq_ids_into, to_py, token_ids_arg, token_ids_onto, type_err, value_err,
};
use super::out::{int_list, vec_list};
use super::pool::PyBlockPool;
use super::tables::PyBlockTables;
use crate::hash::ROOT_HASH;
use crate::hash_chains::HashChains;

#[pyclass(name = "HashChains", module = "enginekit._native")]
pub(super) struct PyHashChains {
    inner: HashChains,
}

/// `token_ids[start:end]` (by Python's slicing, `end` capped at isize::MAX) as token ids:
/// a list or tuple of valid ids is read in place.
fn token_range(token_ids: &Bound<'_, PyAny>, start: u64, end: u64) -> PyResult<Vec<u32>> {
    let mut tokens = Vec::new();
    token_range_onto(token_ids, start, end, &mut tokens)?;
    Ok(tokens)
}

/// `token_range` appended to `out` (`out` as it was if it raises).
fn token_range_onto(
    token_ids: &Bound<'_, PyAny>,
    start: u64,
    end: u64,
    out: &mut Vec<u32>,
) -> PyResult<()> {
    if token_ids_onto(token_ids, usize_of(start), usize_of(end), out)? {
        return Ok(());
    }
    let cap = |v: u64| isize::try_from(v).unwrap_or(isize::MAX);
    let slice = PySlice::new(token_ids.py(), cap(start), cap(end), 1);
    let tokens = token_ids_arg(&token_ids.get_item(slice)?)?;
    reserve(out, tokens.len(), "the tokens")?;
    out.extend_from_slice(&tokens);
    Ok(())
}

/// Whether `obj` is a token batch: a list, a tuple, or a 1-D C-contiguous buffer of u32
/// (an `array("I")`). Its items are not read.
fn is_token_batch(obj: &Bound<'_, PyAny>) -> bool {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return true;
    }
    match PyBuffer::<u32>::get(obj) {
        Ok(buf) => buf.dimensions() == 1 && buf.is_c_contiguous(),
        Err(_) => is_empty_buffer(obj, 4, &["I"]),
    }
}

/// The TypeError of an argument `what` that is no token batch.
fn not_token_batch(what: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    type_err(what, "a list, tuple or array(\"I\") of token ids", obj)
}

/// A list or tuple argument, read item by item.
enum Items<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> Items<'py> {
    /// `obj` (argument `what`) if it is a list or a tuple; TypeError otherwise.
    fn of(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(list) = obj.downcast::<PyList>() {
            return Ok(Self::List(list.clone()));
        }
        if let Ok(tuple) = obj.downcast::<PyTuple>() {
            return Ok(Self::Tuple(tuple.clone()));
        }
        Err(type_err(what, "a list or tuple", obj))
    }

    fn len(&self) -> usize {
        match self {
            Self::List(list) => list.len(),
            Self::Tuple(tuple) => tuple.len(),
        }
    }

    fn get(&self, i: usize) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Self::List(list) => list.get_item(i),
            Self::Tuple(tuple) => tuple.get_item(i),
        }
    }

    /// TypeError (naming `what[i]`) unless every item is a token batch. An exact list or
    /// tuple item is recognised by its type alone, without a reference taken.
    fn check_token_batches(&self, what: &str) -> PyResult<()> {
        let (obj, get_item): (_, unsafe extern "C" fn(_, _) -> _) = match self {
            Self::List(list) => (list.as_ptr(), ffi::PyList_GetItem),
            Self::Tuple(tuple) => (tuple.as_ptr(), ffi::PyTuple_GetItem),
        };
        let n = self.len();
        for i in 0..n {
            // SAFETY: the GIL is held; the GetItem calls check the index (null past the
            // end, should a call below have shortened the list), and the borrowed item is
            // only read for its type before any Python code could run.
            let is_exact = unsafe {
                let item = get_item(obj, i as ffi::Py_ssize_t);
                if item.is_null() {
                    return Err(PyErr::fetch(self.py()));
                }
                ffi::PyList_CheckExact(item) != 0 || ffi::PyTuple_CheckExact(item) != 0
            };
            if !is_exact {
                let item = self.get(i)?;
                if !is_token_batch(&item) {
                    return Err(not_token_batch(&format!("{what}[{i}]"), &item));
                }
            }
        }
        Ok(())
    }

    fn py(&self) -> Python<'py> {
        match self {
            Self::List(list) => list.py(),
            Self::Tuple(tuple) => tuple.py(),
        }
    }
}

/// A sequence id to look up: ValueError for an int outside [0, 2**64), which no sequence
/// has.
fn lookup_seq(seq_id: &Bound<'_, PyAny>) -> PyResult<u64> {
    new_seq_arg(seq_id)
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

#[pymethods]
impl PyHashChains {
    #[new]
    #[pyo3(signature = (block_size, root_hash = None))]
    fn new(block_size: &Bound<'_, PyAny>, root_hash: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        guard(|| {
            let bs = match as_u64(block_size)? {
                Some(v) if v >= 1 => v,
                _ => {
                    return Err(value_err(format!(
                        "block_size must be in [1, 2**64), got {block_size}"
                    )))
                }
            };
            let root = match root_hash {
                None => ROOT_HASH,
                Some(h) => hash_arg(h, "root_hash")?,
            };
            Ok(PyHashChains {
                inner: HashChains::new(bs, root).map_err(to_py)?,
            })
        })
    }

    #[getter]
    fn block_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.block_size()))
    }

    fn num_names(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| Ok(self.inner.num_names(lookup_seq(seq_id)?)))
    }

    fn num_published(&self, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| Ok(self.inner.num_published(lookup_seq(seq_id)?)))
    }

    fn names<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| int_list(py, self.inner.names(lookup_seq(seq_id)?).iter().copied()))
    }

    #[pyo3(signature = (seq_id, token_ids, num_blocks, extra_key = None))]
    fn extend(
        &mut self,
        seq_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        num_blocks: &Bound<'_, PyAny>,
        extra_key: Option<Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        guard(|| {
            let s = new_seq_arg(seq_id)?;
            let n = usize_of(count(num_blocks, "num_blocks")?);
            let extra = extra_key_arg(&extra_key)?;
            if !is_token_batch(token_ids) {
                return Err(not_token_batch("token_ids", token_ids));
            }
            let have = self.inner.num_names(s);
            let tokens = if n > have {
                let bs = self.inner.block_size() as u64;
                let start = have as u64 * bs;
                token_range(token_ids, start, (n as u64).saturating_mul(bs))?
            } else {
                Vec::new()
            };
            self.inner.extend(s, &tokens, n, extra).map_err(to_py)
        })
    }

    fn lookup<'py>(
        &self,
        py: Python<'py>,
        pool: PyRef<'py, PyBlockPool>,
        seq_id: &Bound<'py, PyAny>,
        num_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let n = usize_of(count(num_blocks, "num_blocks")?);
            let s = lookup_seq(seq_id)?;
            vec_list(py, self.inner.lookup(&pool.inner, s, n)?)
        })
    }

    fn is_cached(
        &self,
        pool: PyRef<'_, PyBlockPool>,
        seq_id: &Bound<'_, PyAny>,
        index: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        guard(|| {
            let i = usize_of(count(index, "index")?);
            Ok(self.inner.is_cached(&pool.inner, lookup_seq(seq_id)?, i))
        })
    }

    fn publish(
        &mut self,
        tables: PyRef<'_, PyBlockTables>,
        mut pool: PyRefMut<'_, PyBlockPool>,
        seq_id: &Bound<'_, PyAny>,
        end: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        guard(|| {
            let s = seq_arg(seq_id)?;
            let end = usize_of(count(end, "end")?);
            self.inner
                .publish(&tables.inner, &mut pool.inner, s, end)
                .map_err(to_py)
        })
    }

    /// Returns the positions of the sequences whose decode does not fill the block after
    /// their published names (the caller publishes those its own way).
    #[allow(clippy::too_many_arguments)]
    fn publish_filled<'py>(
        &mut self,
        py: Python<'py>,
        tables: PyRef<'py, PyBlockTables>,
        mut pool: PyRefMut<'py, PyBlockPool>,
        seq_ids: &Bound<'py, PyAny>,
        token_lists: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
        extra_keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let mut seqs = Vec::new();
            seq_ids_into(seq_ids, &mut seqs)?;
            let lists = Items::of(token_lists, "token_lists")?;
            lists.check_token_batches("token_lists")?;
            let mut counts: Vec<u64> = Vec::new();
            collect_ints(num_tokens, "num_tokens", &mut counts, u64::MAX, |x| {
                value_err(format!("num_tokens {x} is not in [0, 2**64)"))
            })?;
            let keys = Items::of(extra_keys, "extra_keys")?;
            if lists.len() != seqs.len() || counts.len() != seqs.len() || keys.len() != seqs.len() {
                return Err(value_err(format!(
                    "seq_ids, token_lists, num_tokens and extra_keys differ in length ({}, {}, {}, {})",
                    seqs.len(),
                    lists.len(),
                    counts.len(),
                    keys.len()
                )));
            }
            let bs = self.inner.block_size();
            let n = seqs.len();
            let (mut skipped, mut filling) = (Vec::new(), Vec::new());
            let mut block_tokens: Vec<u32> = Vec::new();
            let mut key_objs: Vec<Option<Bound<'_, PyAny>>> = Vec::new();
            reserve(&mut skipped, n, "the skipped positions")?;
            reserve(&mut filling, n, "the filling sequences")?;
            reserve(&mut key_objs, n, "the extra keys")?;
            for (i, (&s, &n)) in seqs.iter().zip(&counts).enumerate() {
                if !self.inner.fills_next(s, n) {
                    skipped.push(i);
                    continue;
                }
                let before = block_tokens.len();
                token_range_onto(&lists.get(i)?, n - bs as u64, n, &mut block_tokens)?;
                if block_tokens.len() - before != bs {
                    return Err(value_err(format!(
                        "sequence {s} has {n} tokens scheduled but fewer in its token list"
                    )));
                }
                filling.push(s);
                key_objs.push(Some(keys.get(i)?).filter(|k| !k.is_none()));
            }
            // Checked once every filling decode's tokens are, as the twin does.
            let mut extras = Vec::new();
            reserve(&mut extras, key_objs.len(), "the extra keys")?;
            for k in &key_objs {
                extras.push(extra_key_arg(k)?);
            }
            // The result first: once the blocks are published, nothing may fail.
            let skipped = vec_list(py, skipped)?;
            self.inner
                .publish_filled(
                    &tables.inner,
                    &mut pool.inner,
                    &filling,
                    &block_tokens,
                    &extras,
                )
                .map_err(to_py)?;
            Ok(skipped)
        })
    }

    fn remove(&mut self, seq_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            self.inner.remove(lookup_seq(seq_id)?);
            Ok(())
        })
    }

    fn seq_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| vec_list(py, self.inner.seq_ids()?))
    }
}
