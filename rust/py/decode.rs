//! The decode batch's per-step passes over its members (spec: the twins in
//! `enginekit/scheduler/decode_ops.py`): one call each for what every decoding request
//! does at every step, instead of Python work per request.
//!
//! These act on Python objects themselves (the members' token lists, a table of ints), so
//! there is no core below them; they read and write no request's attributes. Each
//! function checks its arguments first (lengths, types, buffers, counts), so a bad
//! argument raises having changed nothing.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::convert::{guard, value_err};

/// The 1-D C-contiguous buffer of `T` (numpy's `dtype`) that argument `what` must be.
fn buffer_of<T: pyo3::buffer::Element>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    dtype: &str,
) -> PyResult<PyBuffer<T>> {
    let buf = PyBuffer::<T>::get(obj).map_err(|e| {
        value_err(format!(
            "{what} must be a 1-D C-contiguous buffer of {dtype}: {e}"
        ))
    })?;
    if buf.dimensions() != 1 || !buf.is_c_contiguous() {
        return Err(value_err(format!("{what} must be 1-D and C-contiguous")));
    }
    Ok(buf)
}

fn same_length(what: &str, n: usize, expected: usize) -> PyResult<()> {
    if n != expected {
        return Err(value_err(format!(
            "{what} has {n} entries for a batch of {expected}"
        )));
    }
    Ok(())
}

/// (`ints[num_tokens[i]]` for every i as a new list, the indices i whose `num_tokens[i]` is
/// a multiple of `block_size`, ascending). `num_tokens`: an int64 array; `ints`: a list
/// whose item n is the int n for every count in `num_tokens` (the caller's table of int
/// objects, so that no int is made per decode), ValueError for a count outside it. Pure.
#[pyfunction]
fn decode_context_lens<'py>(
    py: Python<'py>,
    num_tokens: &Bound<'py, PyAny>,
    block_size: i64,
    ints: &Bound<'py, PyList>,
) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
    guard(|| {
        if block_size < 1 {
            return Err(value_err("block_size must be >= 1".into()));
        }
        let counts = buffer_of::<i64>(num_tokens, "num_tokens", "int64")?.to_vec(py)?;
        let num_ints = ints.len() as i64;
        if let Some(n) = counts.iter().find(|&&n| !(0..num_ints).contains(&n)) {
            return Err(value_err(format!(
                "num_tokens holds {n}, outside the {num_ints} ints of the table"
            )));
        }
        let mut filled = Vec::new();
        // SAFETY: the GIL is held. The new list is owned (a Bound) as soon as it is made;
        // each of its items is set once, to a reference it takes over. Nothing here runs
        // Python code, so the table cannot change while it is read.
        unsafe {
            let made = ffi::PyList_New(counts.len() as ffi::Py_ssize_t);
            let context_lens = Bound::from_owned_ptr_or_err(py, made)?.downcast_into_unchecked();
            let table = ints.as_ptr();
            for (i, &n) in counts.iter().enumerate() {
                let count = ffi::PyList_GetItem(table, n as ffi::Py_ssize_t);
                if count.is_null() {
                    return Err(PyErr::fetch(py));
                }
                ffi::Py_IncRef(count); // the context list's reference
                ffi::PyList_SetItem(made, i as ffi::Py_ssize_t, count);
                if n % block_size == 0 {
                    filled.push(i);
                }
            }
            Ok((context_lens, filled))
        }
    })
}

/// Appends `token_ids[i]` to the list `token_lists[i]` and adds one to `num_tokens[i]` (a
/// writable int64 array, in place) for every i; returns (the indices whose token is `eos`
/// where `stops_at_eos[i]`, the indices where `num_tokens[i]` reached
/// `max_num_tokens[i]`), both ascending. `eos` None stops none; `max_num_tokens` is an
/// int64 array, `stops_at_eos` a uint8 array (nonzero: EOS stops the member), each as long
/// as the others.
#[pyfunction]
fn append_decode_tokens(
    py: Python<'_>,
    token_lists: &Bound<'_, PyList>,
    token_ids: &Bound<'_, PyList>,
    num_tokens: &Bound<'_, PyAny>,
    max_num_tokens: &Bound<'_, PyAny>,
    stops_at_eos: &Bound<'_, PyAny>,
    eos: Option<i64>,
) -> PyResult<(Vec<usize>, Vec<usize>)> {
    guard(|| {
        let n = token_lists.len();
        same_length("token_ids", token_ids.len(), n)?;
        let counts = buffer_of::<i64>(num_tokens, "num_tokens", "int64")?;
        same_length("num_tokens", counts.item_count(), n)?;
        let cells = match counts.as_mut_slice(py) {
            Some(c) => c,
            None => return Err(value_err("num_tokens must be writable".into())),
        };
        let limits = buffer_of::<i64>(max_num_tokens, "max_num_tokens", "int64")?.to_vec(py)?;
        same_length("max_num_tokens", limits.len(), n)?;
        let stops = buffer_of::<u8>(stops_at_eos, "stops_at_eos", "uint8")?.to_vec(py)?;
        same_length("stops_at_eos", stops.len(), n)?;
        let mut stopped = Vec::new();
        let mut at_length = Vec::new();
        // SAFETY: the GIL is held, and no Python code runs in either loop (list checks,
        // PyLong_AsLongLong on ints, list appends; nothing is released), so the borrowed
        // items stay valid; every index is below the lengths checked above.
        unsafe {
            let (lists, tokens) = (token_lists.as_ptr(), token_ids.as_ptr());
            // Checked whole first: every token list is a list.
            let mut targets = Vec::with_capacity(n);
            for (i, &stops_here) in stops.iter().enumerate() {
                let i = i as ffi::Py_ssize_t;
                let target = ffi::PyList_GetItem(lists, i);
                if ffi::PyList_Check(target) == 0 {
                    return Err(PyTypeError::new_err(format!(
                        "token_lists[{i}] is not a list"
                    )));
                }
                targets.push(target);
                if let Some(eos) = eos {
                    // Only an int can be EOS.
                    let token = ffi::PyList_GetItem(tokens, i);
                    if stops_here != 0 && ffi::PyLong_Check(token) != 0 {
                        let t = ffi::PyLong_AsLongLong(token);
                        if t == -1 && !ffi::PyErr_Occurred().is_null() {
                            ffi::PyErr_Clear(); // out of range: not EOS
                        } else if t == eos {
                            stopped.push(i as usize);
                        }
                    }
                }
            }
            for (i, (cell, &target)) in cells.iter().zip(&targets).enumerate() {
                let token = ffi::PyList_GetItem(tokens, i as ffi::Py_ssize_t);
                if ffi::PyList_Append(target, token) < 0 {
                    return Err(PyErr::fetch(py));
                }
                let count = cell.get() + 1;
                cell.set(count);
                if count >= limits[i] {
                    at_length.push(i);
                }
            }
        }
        Ok((stopped, at_length))
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(decode_context_lens, m)?)?;
    m.add_function(wrap_pyfunction!(append_decode_tokens, m)?)
}
