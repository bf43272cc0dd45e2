//! Results out: Python lists, tuples and dicts of ints built with checked calls only.
//!
//! pyo3's own conversions of a `Vec` or an int panic when Python cannot allocate (a list of
//! 2**26 ints on a host near its memory limit), and a panic there, outside the wrappers' panic
//! fence, may abort or hang the process. Here every object made is checked: a failure
//! releases what was built so far and then raises MemoryError, so the memory a half-built
//! list held is free again before the error is made.

use pyo3::exceptions::PyMemoryError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::convert::KVCacheError;

/// A Rust integer that becomes a Python int.
pub(super) trait IntValue: Copy {
    /// A new reference to the int, or null with an exception set (MemoryError).
    ///
    /// # Safety
    /// The GIL is held.
    unsafe fn new_int(self) -> *mut ffi::PyObject;
}

macro_rules! unsigned_int_value {
    ($($t:ty),*) => {$(
        impl IntValue for $t {
            unsafe fn new_int(self) -> *mut ffi::PyObject {
                ffi::PyLong_FromUnsignedLongLong(self as u64)
            }
        }
    )*};
}

macro_rules! signed_int_value {
    ($($t:ty),*) => {$(
        impl IntValue for $t {
            unsafe fn new_int(self) -> *mut ffi::PyObject {
                ffi::PyLong_FromLongLong(self as i64)
            }
        }
    )*};
}

unsigned_int_value!(u32, u64, usize);
signed_int_value!(i32, i64);

/// The exception Python set when it could not make an object; MemoryError if it set none.
fn taken(py: Python<'_>) -> PyErr {
    PyErr::take(py).unwrap_or_else(|| PyMemoryError::new_err("cannot allocate a Python object"))
}

/// A new list of the ints `items`. MemoryError, the list made so far released first, if
/// Python cannot make it.
pub(super) fn int_list<'py, T, I>(py: Python<'py>, items: I) -> PyResult<Bound<'py, PyList>>
where
    T: IntValue,
    I: IntoIterator<Item = T>,
    I::IntoIter: ExactSizeIterator,
{
    let items = items.into_iter();
    let n = items.len();
    let Ok(len) = ffi::Py_ssize_t::try_from(n) else {
        return Err(PyMemoryError::new_err(format!(
            "cannot make a list of {n} ints"
        )));
    };
    // SAFETY: the GIL is held. The list is owned here until it is returned; each slot is set
    // once, below its length, to a new reference the list takes over; on an error the list
    // (and every int in it) is released before the error is fetched.
    unsafe {
        let list = ffi::PyList_New(len);
        if list.is_null() {
            return Err(taken(py));
        }
        let mut filled: ffi::Py_ssize_t = 0;
        for x in items.take(n) {
            let item = x.new_int();
            if item.is_null() {
                ffi::Py_DecRef(list);
                return Err(taken(py));
            }
            set_list_item(list, filled, item);
            filled += 1;
        }
        if filled != len {
            ffi::Py_DecRef(list);
            return Err(KVCacheError::new_err(
                "internal error: fewer items than announced",
            ));
        }
        Ok(Bound::from_owned_ptr(py, list).downcast_into_unchecked())
    }
}

/// The ints of `items` (a Rust vector, consumed) as a new list: [`int_list`].
pub(super) fn vec_list<T: IntValue>(py: Python<'_>, items: Vec<T>) -> PyResult<Bound<'_, PyList>> {
    int_list(py, items)
}

// SAFETY (both): the GIL is held, `list` is a list this module made, `i` an index below
// its length whose slot is empty, `item` a reference the list takes over.
#[cfg(not(feature = "abi3"))]
unsafe fn set_list_item(list: *mut ffi::PyObject, i: ffi::Py_ssize_t, item: *mut ffi::PyObject) {
    ffi::PyList_SET_ITEM(list, i, item);
}
#[cfg(feature = "abi3")]
unsafe fn set_list_item(list: *mut ffi::PyObject, i: ffi::Py_ssize_t, item: *mut ffi::PyObject) {
    ffi::PyList_SetItem(list, i, item);
}

/// A new tuple of `items`, or MemoryError.
pub(super) fn tuple<'py, const N: usize>(
    py: Python<'py>,
    items: [Bound<'py, PyAny>; N],
) -> PyResult<Bound<'py, PyTuple>> {
    // SAFETY: the GIL is held; each slot of the new tuple is set once, to a reference it
    // takes over (`into_ptr`); on an error the tuple is not made and `items` are dropped.
    unsafe {
        let t = ffi::PyTuple_New(N as ffi::Py_ssize_t);
        if t.is_null() {
            return Err(taken(py));
        }
        for (i, item) in items.into_iter().enumerate() {
            ffi::PyTuple_SetItem(t, i as ffi::Py_ssize_t, item.into_ptr());
        }
        Ok(Bound::from_owned_ptr(py, t).downcast_into_unchecked())
    }
}

/// A new int, or MemoryError.
pub(super) fn int<T: IntValue>(py: Python<'_>, v: T) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: the GIL is held; the new reference is owned by the Bound.
    unsafe { Bound::from_owned_ptr_or_err(py, v.new_int()).map_err(|_| taken(py)) }
}

/// The int `v`, which may be past u64, or MemoryError.
pub(super) fn u128_int(py: Python<'_>, v: u128) -> PyResult<Bound<'_, PyAny>> {
    match u64::try_from(v) {
        Ok(small) => int(py, small),
        Err(_) => {
            let high = int(py, (v >> 64) as u64)?;
            high.lshift(64)?.bitor(int(py, v as u64)?)
        }
    }
}

/// A new dict of the int pairs `items`, or MemoryError (the dict made so far released
/// first).
pub(super) fn int_dict<'py, K: IntValue, V: IntValue>(
    py: Python<'py>,
    items: impl Iterator<Item = (K, V)>,
) -> PyResult<Bound<'py, PyDict>> {
    // SAFETY: the GIL is held. The dict is owned here until it is returned; each key and
    // value is a new reference released once the dict holds its own; on an error everything
    // made is released before the error is fetched.
    unsafe {
        let d = ffi::PyDict_New();
        if d.is_null() {
            return Err(taken(py));
        }
        for (k, v) in items {
            let key = k.new_int();
            let value = if key.is_null() { key } else { v.new_int() };
            let set = !value.is_null() && ffi::PyDict_SetItem(d, key, value) == 0;
            if !key.is_null() {
                ffi::Py_DecRef(key);
            }
            if !value.is_null() {
                ffi::Py_DecRef(value);
            }
            if !set {
                ffi::Py_DecRef(d);
                return Err(taken(py));
            }
        }
        Ok(Bound::from_owned_ptr(py, d).downcast_into_unchecked())
    }
}

/// A new list of the objects `items`, or MemoryError (`items` released first).
pub(super) fn object_list<'py>(
    py: Python<'py>,
    items: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let n = items.len();
    let Ok(len) = ffi::Py_ssize_t::try_from(n) else {
        return Err(PyMemoryError::new_err(format!(
            "cannot make a list of {n} items"
        )));
    };
    // SAFETY: the GIL is held; each slot of the new list is set once, below its length, to a
    // reference it takes over (`into_ptr`).
    unsafe {
        let list = ffi::PyList_New(len);
        if list.is_null() {
            drop(items);
            return Err(taken(py));
        }
        for (i, item) in items.into_iter().enumerate() {
            set_list_item(list, i as ffi::Py_ssize_t, item.into_ptr());
        }
        Ok(Bound::from_owned_ptr(py, list).downcast_into_unchecked())
    }
}
