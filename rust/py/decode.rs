//! The decode batch's per-step passes over its members (spec: the twins in
//! `enginekit/scheduler/decode_ops.py`): one call each for what every decoding request
//! does at every step, instead of Python work per request.
//!
//! These act on Python objects themselves (the members' token lists, a table of ints), so
//! there is no core below them; they read and write no request's attributes. Each
//! function checks its arguments first (lengths, types, buffers, counts), so a bad
//! argument raises having changed nothing; the result lists are made before anything is
//! written.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

use super::convert::{buffer_copy, guard, push, reserve, type_err, value_err};
use super::out::{tuple, vec_list};

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

/// The list argument `what`; TypeError for anything else.
fn list_arg<'a, 'py>(obj: &'a Bound<'py, PyAny>, what: &str) -> PyResult<&'a Bound<'py, PyList>> {
    obj.downcast::<PyList>()
        .map_err(|_| type_err(what, "a list", obj))
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
/// a multiple of `block_size`, ascending). `block_size`: an int >= 1 (ValueError below,
/// TypeError for another type); `num_tokens`: an int64 array; `ints`: a list (TypeError
/// otherwise) whose item n is the int n for every count in `num_tokens` (the caller's table
/// of int objects, so that no int is made per decode), ValueError for a count outside it.
/// Checked in that order. Pure.
#[pyfunction]
fn decode_context_lens<'py>(
    py: Python<'py>,
    num_tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    ints: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    guard(|| {
        // Past i64 no count (an int64) but 0 is a multiple of the block size.
        let block_size = match block_size.extract::<i64>() {
            Ok(v) => v,
            Err(e) if e.is_instance_of::<PyOverflowError>(py) && block_size.gt(0)? => i64::MAX,
            Err(e) if e.is_instance_of::<PyOverflowError>(py) => 0,
            Err(e) => return Err(e),
        };
        if block_size < 1 {
            return Err(value_err("block_size must be >= 1".into()));
        }
        let counts = buffer_of::<i64>(num_tokens, "num_tokens", "int64")?;
        let counts = buffer_copy(py, &counts, usize::MAX)?;
        let ints = list_arg(ints, "ints")?;
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
            let context_lens: Bound<'py, PyList> =
                Bound::from_owned_ptr_or_err(py, made)?.downcast_into_unchecked();
            let table = ints.as_ptr();
            for (i, &n) in counts.iter().enumerate() {
                let count = ffi::PyList_GetItem(table, n as ffi::Py_ssize_t);
                if count.is_null() {
                    return Err(PyErr::fetch(py));
                }
                ffi::Py_IncRef(count); // the context list's reference
                ffi::PyList_SetItem(made, i as ffi::Py_ssize_t, count);
                if n % block_size == 0 {
                    push(&mut filled, i, "the filled positions")?;
                }
            }
            tuple(
                py,
                [context_lens.into_any(), vec_list(py, filled)?.into_any()],
            )
        }
    })
}

/// Appends `token_ids[i]` to the list `token_lists[i]` and adds one to `num_tokens[i]` (a
/// writable int64 array, in place) for every i; returns (the indices whose token is `eos`
/// where `stops_at_eos[i]`, the indices where `num_tokens[i]` reached
/// `max_num_tokens[i]`), both ascending. `eos` None stops none, another int stops the
/// members whose token is an int equal to it; `max_num_tokens` is an int64 array,
/// `stops_at_eos` a uint8 array (nonzero: EOS stops the member), each as long as the others.
/// Checked first: the two lists and `eos` (TypeError), then the arrays and lengths
/// (ValueError), then each token list (TypeError).
#[pyfunction]
fn append_decode_tokens<'py>(
    py: Python<'py>,
    token_lists: &Bound<'py, PyAny>,
    token_ids: &Bound<'py, PyAny>,
    num_tokens: &Bound<'py, PyAny>,
    max_num_tokens: &Bound<'py, PyAny>,
    stops_at_eos: &Bound<'py, PyAny>,
    eos: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    guard(|| {
        let token_lists = list_arg(token_lists, "token_lists")?;
        let token_ids = list_arg(token_ids, "token_ids")?;
        let eos = match eos.filter(|e| !e.is_none()) {
            None => Eos::Never,
            Some(e) => match e.extract::<i64>() {
                Ok(v) => Eos::Int(v),
                // Kept as an exact int, which compares without running Python code.
                Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                    Eos::Large(py.get_type::<PyInt>().call1((e,))?)
                }
                Err(_) => return Err(type_err("eos", "an int or None", e)),
            },
        };
        let n = token_lists.len();
        same_length("token_ids", token_ids.len(), n)?;
        let counts = buffer_of::<i64>(num_tokens, "num_tokens", "int64")?;
        same_length("num_tokens", counts.item_count(), n)?;
        let cells = match counts.as_mut_slice(py) {
            Some(c) => c,
            None => return Err(value_err("num_tokens must be writable".into())),
        };
        let limits = buffer_of::<i64>(max_num_tokens, "max_num_tokens", "int64")?;
        same_length("max_num_tokens", limits.item_count(), n)?;
        let limits = buffer_copy(py, &limits, usize::MAX)?;
        let stops = buffer_of::<u8>(stops_at_eos, "stops_at_eos", "uint8")?;
        same_length("stops_at_eos", stops.item_count(), n)?;
        let stops = buffer_copy(py, &stops, usize::MAX)?;
        let (mut stopped, mut at_length, mut targets) = (Vec::new(), Vec::new(), Vec::new());
        reserve(&mut targets, n, "the token lists")?;
        // SAFETY: the GIL is held, and no Python code runs in either loop (list checks,
        // PyLong_AsLongLong on ints, a comparison of two exact ints, list appends; nothing
        // is released), so the borrowed items stay valid; every index is below the lengths
        // checked above.
        unsafe {
            let (lists, tokens) = (token_lists.as_ptr(), token_ids.as_ptr());
            // Checked whole first, and the results found, before anything is written: every
            // token list is a list.
            for (i, (&stops_here, cell)) in stops.iter().zip(cells).enumerate() {
                let target = ffi::PyList_GetItem(lists, i as ffi::Py_ssize_t);
                if ffi::PyList_Check(target) == 0 {
                    return Err(PyTypeError::new_err(format!(
                        "token_lists[{i}] is not a list"
                    )));
                }
                targets.push(target);
                if stops_here != 0 && !matches!(eos, Eos::Never) {
                    // Only an int can be EOS.
                    let token = ffi::PyList_GetItem(tokens, i as ffi::Py_ssize_t);
                    if is_eos(token, &eos) {
                        push(&mut stopped, i, "the stopped positions")?;
                    }
                }
                if cell.get() + 1 >= limits[i] {
                    push(&mut at_length, i, "the positions at length")?;
                }
            }
            let result = tuple(
                py,
                [
                    vec_list(py, stopped)?.into_any(),
                    vec_list(py, at_length)?.into_any(),
                ],
            )?;
            for (i, (cell, &target)) in cells.iter().zip(&targets).enumerate() {
                let token = ffi::PyList_GetItem(tokens, i as ffi::Py_ssize_t);
                if ffi::PyList_Append(target, token) < 0 {
                    return Err(PyErr::fetch(py));
                }
                cell.set(cell.get() + 1);
            }
            Ok(result)
        }
    })
}

/// Whether the borrowed `token` is the int `eos` (an int subclass past i64 never is).
///
/// # Safety
/// The GIL is held and `token` is a valid object.
unsafe fn is_eos(token: *mut ffi::PyObject, eos: &Eos<'_>) -> bool {
    if ffi::PyLong_Check(token) == 0 {
        return false;
    }
    match eos {
        Eos::Never => false,
        Eos::Int(eos) => {
            let t = ffi::PyLong_AsLongLong(token);
            if t == -1 && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear(); // out of range: not this EOS
                false
            } else {
                t == *eos
            }
        }
        // Two exact ints compare without running Python code.
        Eos::Large(eos) => {
            ffi::PyLong_CheckExact(token) != 0
                && ffi::PyObject_RichCompareBool(token, eos.as_ptr(), ffi::Py_EQ) == 1
        }
    }
}

/// What `append_decode_tokens` stops at: no token, an int64, or a larger int.
enum Eos<'py> {
    Never,
    Int(i64),
    Large(Bound<'py, PyAny>),
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(decode_context_lens, m)?)?;
    m.add_function(wrap_pyfunction!(append_decode_tokens, m)?)
}
