//! One attribute of many Python objects, read or written in one call: what `getattr` and
//! `setattr` do for each, without their per-object lookup where the attribute is a slot.
//!
//! Objects of the type of the first one, if that type keeps object's own `__getattribute__`
//! (`__setattr__`) and the attribute is one of its `__slots__`, are read (written) through
//! the slot's descriptor, looked up once per call: a slot is a data descriptor, so that is
//! all `getattr` (`setattr`) does for them. Any other object goes through `getattr`
//! (`setattr`).

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyList, PyString, PyType};

use super::convert::guard;

/// (`first`'s type, its slot descriptor `name`, the descriptor type's `descr_slot`:
/// tp_descr_get or tp_descr_set) if that type's `slot` (tp_getattro or tp_setattro) is the
/// generic one. The descriptor holds a reference to its type, so the type pointer stays
/// valid while the descriptor is held.
fn slot_of<'py>(
    first: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    slot: c_int,
    generic: *mut c_void,
    descr_slot: c_int,
) -> PyResult<Option<(*mut ffi::PyTypeObject, Bound<'py, PyAny>, *mut c_void)>> {
    static MEMBER_TYPE: GILOnceCell<Py<PyType>> = GILOnceCell::new();
    let py = first.py();
    let owner = first.get_type();
    let member_type = MEMBER_TYPE.import(py, "types", "MemberDescriptorType")?;
    // A slot read from its class is its descriptor.
    let Ok(descr) = owner.getattr(name) else {
        return Ok(None);
    };
    if !descr.get_type().is(member_type) {
        return Ok(None);
    }
    // SAFETY: the GIL is held and both are live type objects; PyType_GetSlot reads static
    // and heap types alike from 3.10 on.
    unsafe {
        if ffi::PyType_GetSlot(owner.as_type_ptr(), slot) != generic {
            return Ok(None);
        }
        let function = ffi::PyType_GetSlot(descr.get_type().as_type_ptr(), descr_slot);
        Ok((!function.is_null()).then(|| (owner.as_type_ptr(), descr, function)))
    }
}

/// Writes one attribute of many objects as `setattr` does (see the module doc).
pub(super) struct AttrWriter<'py> {
    name: Bound<'py, PyString>,
    slot: Option<(*mut ffi::PyTypeObject, Bound<'py, PyAny>, ffi::descrsetfunc)>,
}

impl<'py> AttrWriter<'py> {
    /// A writer of `name`, fast for objects of `first`'s type.
    pub(super) fn new(
        name: Bound<'py, PyString>,
        first: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let generic = ffi::PyObject_GenericSetAttr as *mut c_void;
        let slot = match first {
            Some(obj) => slot_of(
                obj,
                &name,
                ffi::Py_tp_setattro,
                generic,
                ffi::Py_tp_descr_set,
            )?,
            None => None,
        };
        // SAFETY: a non-null tp_descr_set is a descrsetfunc.
        let slot = slot.map(|(owner, descr, set)| {
            (owner, descr, unsafe {
                std::mem::transmute::<*mut c_void, ffi::descrsetfunc>(set)
            })
        });
        Ok(Self { name, slot })
    }

    /// Writes `value` to the attribute of `obj`; -1 with the error set if it fails.
    ///
    /// # Safety
    /// The GIL is held and `obj` and `value` are live objects the caller holds references to.
    pub(super) unsafe fn write(&self, obj: *mut ffi::PyObject, value: *mut ffi::PyObject) -> c_int {
        match &self.slot {
            // `set` is the tp_descr_set of `descr`'s type, on an object of the type `descr`
            // is a slot of.
            Some((owner, descr, set)) if ffi::Py_TYPE(obj) == *owner => {
                set(descr.as_ptr(), obj, value)
            }
            _ => ffi::PyObject_SetAttr(obj, self.name.as_ptr(), value),
        }
    }
}

/// Reads one attribute of many objects as `getattr` does (see the module doc).
struct AttrReader<'py> {
    name: Bound<'py, PyString>,
    slot: Option<(*mut ffi::PyTypeObject, Bound<'py, PyAny>, ffi::descrgetfunc)>,
}

impl<'py> AttrReader<'py> {
    /// A reader of `name`, fast for objects of `first`'s type.
    fn new(name: Bound<'py, PyString>, first: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
        let generic = ffi::PyObject_GenericGetAttr as *mut c_void;
        let slot = match first {
            Some(obj) => slot_of(
                obj,
                &name,
                ffi::Py_tp_getattro,
                generic,
                ffi::Py_tp_descr_get,
            )?,
            None => None,
        };
        // SAFETY: a non-null tp_descr_get is a descrgetfunc.
        let slot = slot.map(|(owner, descr, get)| {
            (owner, descr, unsafe {
                std::mem::transmute::<*mut c_void, ffi::descrgetfunc>(get)
            })
        });
        Ok(Self { name, slot })
    }

    /// The attribute of `obj`.
    fn read(&self, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = obj.py();
        // SAFETY: the GIL is held and `obj` is held by the caller. `get` is the
        // tp_descr_get of `descr`'s type, called on an object of the type `descr` is a
        // slot of (`owner`); it returns a new reference or null with the error set.
        unsafe {
            let value = match &self.slot {
                Some((owner, descr, get)) if ffi::Py_TYPE(obj.as_ptr()) == *owner => {
                    get(descr.as_ptr(), obj.as_ptr(), owner.cast())
                }
                _ => ffi::PyObject_GetAttr(obj.as_ptr(), self.name.as_ptr()),
            };
            Bound::from_owned_ptr_or_err(py, value)
        }
    }
}

/// `value` as an i64 if it is an exact int or a bool that fits one: what `0 + value` and
/// `+` between such ints give exactly.
fn exact_i64(value: &Bound<'_, PyAny>) -> Option<i64> {
    // SAFETY: the GIL is held and `value` is live; an overflow's error is cleared.
    unsafe {
        let ptr = value.as_ptr();
        if ffi::PyLong_CheckExact(ptr) == 0 && ffi::PyBool_Check(ptr) == 0 {
            return None;
        }
        let v = ffi::PyLong_AsLongLong(ptr);
        if v == -1 && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(v)
    }
}

/// `0 + o.name + ...` over `objects` in order, by Python's `+` (spec: the twin in
/// `enginekit/kv/pyref/attributes.py`): the same value or the same error, each attribute
/// read once. Added as i64s while every value is an exact int (or a bool) and every partial
/// sum fits; from there on by Python's `+`.
#[pyfunction]
fn sum_attribute<'py>(
    objects: &Bound<'py, PyList>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    guard(|| {
        let py = objects.py();
        let reader = AttrReader::new(name.clone(), objects.get_item(0).ok().as_ref())?;
        let mut fast: i64 = 0;
        let mut slow: Option<Bound<'py, PyAny>> = None; // the sum, once past the fast path
        let mut i = 0;
        while i < objects.len() {
            // Read again at each step: a getattr can run Python code that changes the list.
            let value = reader.read(&objects.get_item(i)?)?;
            slow = match slow {
                None => match exact_i64(&value).and_then(|v| fast.checked_add(v)) {
                    Some(sum) => {
                        fast = sum;
                        None
                    }
                    None => Some(fast.into_pyobject(py)?.add(&value)?),
                },
                Some(sum) => Some(sum.add(&value)?),
            };
            i += 1;
        }
        match slow {
            Some(sum) => Ok(sum),
            None => Ok(fast.into_pyobject(py)?.into_any()),
        }
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sum_attribute, m)?)
}
