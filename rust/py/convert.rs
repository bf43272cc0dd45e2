//! Conversions between Python objects and the core's types: arguments in, errors out, and
//! the panic fence every wrapper method runs inside.
//!
//! Every method body runs inside [`guard`], so a Rust panic reaches Python as
//! `KVCacheError("internal error: ...")`, never as a `PanicException`. Python ints outside the
//! Rust integer ranges become the error the stub documents (an unknown id is a `KVCacheError`,
//! a bad value a `ValueError`), never an `OverflowError`.
//!
//! Argument types, as the twins check them: a list of ids, counts, hashes or tokens is a
//! `list` or `tuple` of ints; anything else (bytes, str, dict, set, a generator, None) is a
//! `TypeError`, as is an `extra_key` that is not `bytes` or None and a `None` where an int is
//! due. A failed host allocation is a `MemoryError`: every buffer an argument is read into
//! is reserved in one fallible step before it is filled.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::buffer::{Element, PyBuffer};
use pyo3::exceptions::{PyMemoryError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyMemoryView, PyTuple};

use crate::error::{try_reserve, KvError, MAX_BLOCK_ID};

pyo3::import_exception!(enginekit.errors, KVCacheError);
pyo3::import_exception!(enginekit.errors, OutOfBlocksError);

pub(super) fn to_py(e: KvError) -> PyErr {
    match e {
        KvError::Value(m) => PyValueError::new_err(m),
        KvError::Cache(m) => KVCacheError::new_err(m),
        KvError::OutOfBlocks(m) => OutOfBlocksError::new_err(m),
        KvError::Memory(m) => PyMemoryError::new_err(m),
    }
}

impl From<KvError> for PyErr {
    fn from(e: KvError) -> Self {
        to_py(e)
    }
}

/// Room in `out` for `additional` more items, or MemoryError.
#[inline]
pub(super) fn reserve<T>(out: &mut Vec<T>, additional: usize, what: &str) -> PyResult<()> {
    try_reserve(out, additional, what).map_err(to_py)
}

/// Pushes `x` onto `out`, growing it (as `Vec::push` does) fallibly: MemoryError if the
/// host cannot hold it.
#[inline]
pub(super) fn push<T>(out: &mut Vec<T>, x: T, what: &str) -> PyResult<()> {
    if out.len() == out.capacity() {
        reserve(out, 1, what)?;
    }
    out.push(x);
    Ok(())
}

/// The items of a list or tuple (None for another type).
fn num_items(obj: &Bound<'_, PyAny>) -> Option<usize> {
    if let Ok(list) = obj.downcast::<PyList>() {
        Some(list.len())
    } else if let Ok(tuple) = obj.downcast::<PyTuple>() {
        Some(tuple.len())
    } else {
        None
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
pub(super) fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(KVCacheError::new_err(format!(
            "internal error: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

pub(super) fn value_err(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

pub(super) fn cache_err(msg: String) -> PyErr {
    KVCacheError::new_err(msg)
}

/// `Some(v)` for an int in [0, 2**64), `None` for an int outside it; a non-int is a TypeError.
pub(super) fn as_u64(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    match obj.extract::<u64>() {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `Some(v)` for an int in the int32 range, `None` for an int outside it.
pub(super) fn as_i32(obj: &Bound<'_, PyAny>) -> PyResult<Option<i32>> {
    match obj.extract::<i32>() {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A non-negative count: `Err(ValueError)` if negative, saturated at u64::MAX if huge.
pub(super) fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    match as_u64(obj)? {
        Some(v) => Ok(v),
        None if obj.lt(0)? => Err(value_err(format!("{what} must be non-negative, got {obj}"))),
        None => Ok(u64::MAX),
    }
}

/// The TypeError of an argument `what` of the wrong type (the twins' message).
pub(super) fn type_err(what: &str, expected: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    let got = obj
        .get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string());
    PyTypeError::new_err(format!("{what} must be {expected}, got {got}"))
}

/// Calls `f` on every item of the list or tuple `obj` (argument `what`); any other type is a
/// TypeError, so bytes, str, dicts, sets and generators are refused rather than iterated.
pub(super) fn for_each_item(
    obj: &Bound<'_, PyAny>,
    what: &str,
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
        return Err(type_err(what, "a list or tuple of ints", obj));
    }
    Ok(())
}

/// Fills `out` (cleared first) with the ints of the list or tuple `obj` (argument `what`),
/// each at most `max`; `bad` builds the error for an int outside [0, max].
pub(super) fn collect_ints<T>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    out: &mut Vec<T>,
    max: u64,
    bad: impl Fn(&Bound<'_, PyAny>) -> PyErr,
) -> PyResult<()>
where
    T: TryFrom<u64>,
    <T as TryFrom<u64>>::Error: std::fmt::Debug,
{
    collect_leading_ints(obj, what, out, max, usize::MAX, bad)
}

/// [`collect_ints`] of the first `limit` items only: those after them are neither read nor
/// checked (the type of `obj` is).
///
/// An exact list or tuple of exact ints in [0, max], the common case, is read directly
/// (borrowed items, no per-item conversion objects); at the first item that is anything
/// else the checked path starts over, so every error is the one it raises.
pub(super) fn collect_leading_ints<T>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    out: &mut Vec<T>,
    max: u64,
    limit: usize,
    bad: impl Fn(&Bound<'_, PyAny>) -> PyErr,
) -> PyResult<()>
where
    T: TryFrom<u64>,
    <T as TryFrom<u64>>::Error: std::fmt::Debug,
{
    out.clear();
    if exact_ints_in(obj, out, max, 0, limit)? {
        return Ok(());
    }
    out.clear();
    if let Some(n) = num_items(obj) {
        reserve(out, n.min(limit), what)?;
    }
    let mut num_left = limit;
    for_each_item(obj, what, |x| {
        if num_left == 0 {
            return Ok(());
        }
        num_left -= 1;
        match as_u64(x)? {
            Some(v) if v <= max => {
                out.push(T::try_from(v).expect("max fits the target type"));
                Ok(())
            }
            _ => Err(bad(x)),
        }
    })
}

/// The direct read of a list or tuple of exact ints in [0, 2**64) into `out` (cleared
/// first): false, `out` partly filled, for anything else (a negative or larger int, another
/// type), which the caller's checked path then reads or reports. MemoryError if the host
/// cannot hold them.
pub(super) fn exact_counts_in(obj: &Bound<'_, PyAny>, out: &mut Vec<u64>) -> PyResult<bool> {
    out.clear();
    exact_ints_in(obj, out, u64::MAX, 0, usize::MAX)
}

/// The direct read of [`collect_leading_ints`]: true, with the `limit` items from index
/// `start` on (fewer where the container ends) in `out`, if `obj` is an exact list or tuple
/// whose items there are exact ints in [0, max]; false (nothing raised, `out` partly filled)
/// otherwise. MemoryError if the host cannot hold them (reserved before any is read).
fn exact_ints_in<T>(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<T>,
    max: u64,
    start: usize,
    limit: usize,
) -> PyResult<bool>
where
    T: TryFrom<u64>,
    <T as TryFrom<u64>>::Error: std::fmt::Debug,
{
    use pyo3::ffi;
    let ptr = obj.as_ptr();
    // SAFETY: the GIL is held (`obj` is a Bound). The exact type checks come before the
    // unchecked size and item macros, every index is below the size, and the items are
    // borrowed from the container, which nothing changes meanwhile: the only call made on an
    // item, PyLong_AsUnsignedLongLong on an exact int, runs no Python code. An error it sets
    // is cleared before returning false.
    unsafe {
        let is_list = ffi::PyList_CheckExact(ptr) != 0;
        if !is_list && ffi::PyTuple_CheckExact(ptr) == 0 {
            return Ok(false);
        }
        let len = if is_list {
            list_len(ptr)
        } else {
            tuple_len(ptr)
        };
        let len = usize::try_from(len).unwrap_or(0);
        let start = start.min(len);
        let end = start + (len - start).min(limit);
        reserve(out, end - start, "the argument's ints")?;
        for i in start as ffi::Py_ssize_t..end as ffi::Py_ssize_t {
            let item = if is_list {
                list_item(ptr, i)
            } else {
                tuple_item(ptr, i)
            };
            if ffi::PyLong_CheckExact(item) == 0 {
                return Ok(false);
            }
            let v = ffi::PyLong_AsUnsignedLongLong(item);
            if v == u64::MAX && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return Ok(false);
            }
            if v > max {
                return Ok(false);
            }
            out.push(T::try_from(v).expect("max fits the target type"));
        }
    }
    Ok(true)
}

// The size and borrowed-item reads of an exact list or tuple: the unchecked macros in the
// default build, the limited API's checked functions under the stable ABI (`abi3`).
// SAFETY (all four): the GIL is held and `ptr` is an exact list (tuple) of which `i` is an
// index below its size.
#[cfg(not(feature = "abi3"))]
use pyo3::ffi::{
    PyList_GET_ITEM as list_item, PyList_GET_SIZE as list_len, PyTuple_GET_ITEM as tuple_item,
    PyTuple_GET_SIZE as tuple_len,
};
#[cfg(feature = "abi3")]
use pyo3::ffi::{
    PyList_GetItem as list_item, PyList_Size as list_len, PyTuple_GetItem as tuple_item,
    PyTuple_Size as tuple_len,
};

pub(super) fn seq_ids_into(obj: &Bound<'_, PyAny>, out: &mut Vec<u64>) -> PyResult<()> {
    collect_ints(obj, "seq_ids", out, u64::MAX, |x| {
        cache_err(format!("unknown sequence {x}"))
    })
}

pub(super) fn table_block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut v = Vec::new();
    collect_ints(
        obj,
        "block_ids",
        &mut v,
        u64::from(MAX_BLOCK_ID),
        bad_table_block,
    )?;
    Ok(v)
}

pub(super) fn bad_table_block(x: &Bound<'_, PyAny>) -> PyErr {
    value_err(format!("block id {x} is not in [0, 2**31)"))
}

/// An existing sequence's id: an int outside u64 is an unknown sequence.
pub(super) fn seq_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| cache_err(format!("unknown sequence {obj}")))
}

/// A new sequence's id, which must fit in u64.
pub(super) fn new_seq_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| value_err(format!("sequence id {obj} is not in [0, 2**64)")))
}

/// A list or tuple of block hashes, each in [0, 2**64) (else ValueError).
pub(super) fn block_hashes_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let mut v = Vec::new();
    collect_ints(obj, "block_hashes", &mut v, u64::MAX, |x| {
        value_err(format!("block_hash {x} is not in [0, 2**64)"))
    })?;
    Ok(v)
}

pub(super) fn hash_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| value_err(format!("{what} {obj} is not in [0, 2**64)")))
}

/// An extra key: `bytes` (a subclass included) or None; any other type is a TypeError.
pub(super) fn extra_key_arg<'a>(
    extra_key: &'a Option<Bound<'_, PyAny>>,
) -> PyResult<Option<&'a [u8]>> {
    let Some(obj) = extra_key else {
        return Ok(None);
    };
    let Ok(bytes) = obj.downcast::<PyBytes>() else {
        return Err(type_err("extra_key", "bytes or None", obj));
    };
    let k = bytes.as_bytes();
    if u32::try_from(k.len()).is_err() {
        return Err(value_err(format!(
            "extra_key is {} bytes, more than 2**32 - 1",
            k.len()
        )));
    }
    Ok(Some(k))
}

/// A Python int, for a default argument value (so that an explicit None is refused).
pub(super) fn int_default(v: i64) -> Py<PyAny> {
    Python::with_gil(|py| {
        v.into_pyobject(py)
            .map_or_else(|e| match e {}, |o| o.into_any().unbind())
    })
}

pub(super) fn token_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    leading_token_ids_arg(obj, usize::MAX)
}

/// Appends the token ids `obj[start:end]` of an exact list or tuple of exact ints in
/// [0, 2**32) to `out`, read in place: true; false, `out` as it was, for anything else (the
/// caller slices it and converts the slice, to raise what that raises). MemoryError if the
/// host cannot hold them.
pub(super) fn token_ids_onto(
    obj: &Bound<'_, PyAny>,
    start: usize,
    end: usize,
    out: &mut Vec<u32>,
) -> PyResult<bool> {
    let before = out.len();
    let limit = end.saturating_sub(start);
    let read = exact_ints_in(obj, out, u64::from(u32::MAX), start, limit);
    if !matches!(read, Ok(true)) {
        out.truncate(before);
    }
    read
}

/// The first `limit` token ids of a list or tuple (those after them are not checked), or
/// of a 1-D C-contiguous buffer of u32 (an `array.array("I")`: every u32 is a token id),
/// which is read without a Python call per item.
pub(super) fn leading_token_ids_arg(obj: &Bound<'_, PyAny>, limit: usize) -> PyResult<Vec<u32>> {
    if let Some(tokens) = typed_buffer::<u32>(obj, &["I"], limit)? {
        return Ok(tokens);
    }
    let mut v = Vec::new();
    collect_leading_ints(obj, "token_ids", &mut v, u64::from(u32::MAX), limit, |x| {
        value_err(format!("token id {x} is not in [0, 2**32)"))
    })?;
    Ok(v)
}

/// The first `limit` items of `obj` if it exposes a 1-D C-contiguous buffer of `T` (a typed
/// array), read in one pass with no per-item Python call; None for anything else (lists and
/// tuples take the item-by-item path, which also reports a wrong type). An empty buffer in
/// one of `empty_formats` counts too (see [`is_empty_buffer`]). MemoryError if the host
/// cannot hold the copy.
pub(super) fn typed_buffer<T: Element + Copy + Default>(
    obj: &Bound<'_, PyAny>,
    empty_formats: &[&str],
    limit: usize,
) -> PyResult<Option<Vec<T>>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return Ok(None);
    }
    let Ok(buf) = PyBuffer::<T>::get(obj) else {
        let size = std::mem::size_of::<T>();
        return Ok(is_empty_buffer(obj, size, empty_formats).then(Vec::new));
    };
    if buf.dimensions() != 1 || !buf.is_c_contiguous() {
        return Ok(None);
    }
    buffer_copy(obj.py(), &buf, limit).map(Some)
}

/// `read(items)` on the items of `obj` if it exposes a 1-D C-contiguous buffer of `T`,
/// borrowed in place (no copy); None, `read` not called, for anything else (as
/// [`typed_buffer`], an empty buffer in one of `empty_formats` included).
pub(super) fn with_typed_buffer<T: Element + Copy, R>(
    obj: &Bound<'_, PyAny>,
    empty_formats: &[&str],
    read: impl FnOnce(&[T]) -> PyResult<R>,
) -> PyResult<Option<R>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return Ok(None);
    }
    let Ok(buf) = PyBuffer::<T>::get(obj) else {
        let size = std::mem::size_of::<T>();
        if is_empty_buffer(obj, size, empty_formats) {
            return read(&[]).map(Some);
        }
        return Ok(None);
    };
    if buf.dimensions() != 1 || !buf.is_c_contiguous() {
        return Ok(None);
    }
    let n = buf.item_count();
    let items = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the buffer is 1-D, C-contiguous and aligned for `T` (PyBuffer checks
        // the alignment and the item format), held open until `buf` drops after `read`;
        // the GIL is held and `read` runs no Python code that could change it.
        unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, n) }
    };
    read(items).map(Some)
}

/// The first `limit` items of a 1-D C-contiguous buffer, copied into a vector reserved in
/// one fallible step (MemoryError if the host cannot hold it).
pub(super) fn buffer_copy<T: Element + Copy + Default>(
    py: Python<'_>,
    buf: &PyBuffer<T>,
    limit: usize,
) -> PyResult<Vec<T>> {
    let n = buf.item_count();
    let mut out = Vec::new();
    reserve(&mut out, n.min(limit), "a copy of the buffer")?;
    if limit < n {
        // SAFETY: the buffer is 1-D and C-contiguous (checked by the callers), so its first
        // `limit` items lie at its start; the GIL is held and the buffer is held open.
        let items = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, limit) };
        out.extend_from_slice(items);
        return Ok(out);
    }
    out.resize(n, T::default());
    buf.copy_to_slice(py, &mut out)?;
    Ok(out)
}

/// Whether `obj` exposes an empty 1-D buffer of `itemsize`-byte items in one of `formats`
/// (native byte order): PyBuffer refuses an empty array, which may have no data pointer
/// to align, so an empty typed array is recognised here.
pub(super) fn is_empty_buffer(obj: &Bound<'_, PyAny>, itemsize: usize, formats: &[&str]) -> bool {
    let Ok(view) = PyMemoryView::from(obj) else {
        return false;
    };
    let attr = |name: &str| view.getattr(name).ok();
    let format = attr("format").and_then(|f| f.extract::<String>().ok());
    let format = format.as_deref().map(|f| f.trim_start_matches(['@', '=']));
    let is_format = format.is_some_and(|f| formats.contains(&f));
    let is = |name: &str, v: usize| attr(name).and_then(|x| x.extract::<usize>().ok()) == Some(v);
    is_format && is("nbytes", 0) && is("itemsize", itemsize) && is("ndim", 1)
}

/// An empty tuple, for a default argument value.
pub(super) fn empty_tuple() -> Py<PyAny> {
    Python::with_gil(|py| PyTuple::empty(py).into_any().unbind())
}
