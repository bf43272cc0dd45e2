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

/// One way of accessing an attribute: the type slot that must be object's own for the
/// slot descriptor to be all there is to it (tp_getattro or tp_setattro), object's own
/// function there, and the descriptor type's slot that then does the access (tp_descr_get
/// or tp_descr_set).
struct Access {
    type_slot: c_int,
    generic: *mut c_void,
    descr_slot: c_int,
}

const READ: Access = Access {
    type_slot: ffi::Py_tp_getattro,
    generic: ffi::PyObject_GenericGetAttr as *mut c_void,
    descr_slot: ffi::Py_tp_descr_get,
};

const WRITE: Access = Access {
    type_slot: ffi::Py_tp_setattro,
    generic: ffi::PyObject_GenericSetAttr as *mut c_void,
    descr_slot: ffi::Py_tp_descr_set,
};

/// A slot attribute of the objects of one exact type (`owner`): its descriptor, which holds
/// a reference to `owner` (so the pointer stays valid while this lives), and the
/// descriptor type's function for one access.
struct Slot<'py> {
    owner: *mut ffi::PyTypeObject,
    descr: Bound<'py, PyAny>,
    function: *mut c_void,
}

impl<'py> Slot<'py> {
    /// The slot `name` of `first`'s type for `access`, if `name` is a slot of that type and
    /// the access is all the type's getattr (setattr) would do; None otherwise (and for no
    /// `first`).
    fn of(
        first: Option<&Bound<'py, PyAny>>,
        name: &Bound<'py, PyString>,
        access: &Access,
    ) -> PyResult<Option<Self>> {
        static MEMBER_TYPE: GILOnceCell<Py<PyType>> = GILOnceCell::new();
        let Some(first) = first else {
            return Ok(None);
        };
        let owner = first.get_type();
        let member_type = MEMBER_TYPE.import(first.py(), "types", "MemberDescriptorType")?;
        // A slot read from its class is its descriptor.
        let Ok(descr) = owner.getattr(name) else {
            return Ok(None);
        };
        if !descr.get_type().is(member_type) {
            return Ok(None);
        }
        // SAFETY: the GIL is held and both are live type objects; PyType_GetSlot reads
        // static and heap types alike from 3.10 on.
        unsafe {
            if ffi::PyType_GetSlot(owner.as_type_ptr(), access.type_slot) != access.generic {
                return Ok(None);
            }
            let function = ffi::PyType_GetSlot(descr.get_type().as_type_ptr(), access.descr_slot);
            Ok((!function.is_null()).then(|| Self {
                owner: owner.as_type_ptr(),
                descr,
                function,
            }))
        }
    }

    /// Whether `obj` is of the slot's type (then the slot's function applies to it).
    ///
    /// # Safety
    /// `obj` is a live object.
    unsafe fn serves(&self, obj: *mut ffi::PyObject) -> bool {
        ffi::Py_TYPE(obj) == self.owner
    }
}

/// Writes one attribute of many objects as `setattr` does (see the module doc).
pub(super) struct AttrWriter<'py> {
    name: Bound<'py, PyString>,
    slot: Option<Slot<'py>>,
}

impl<'py> AttrWriter<'py> {
    /// A writer of `name`, fast for objects of `first`'s type.
    pub(super) fn new(
        name: Bound<'py, PyString>,
        first: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let slot = Slot::of(first, &name, &WRITE)?;
        Ok(Self { name, slot })
    }

    /// Writes `value` to the attribute of `obj`; -1 with the error set if it fails.
    ///
    /// # Safety
    /// The GIL is held and `obj` and `value` are live objects the caller holds references to.
    pub(super) unsafe fn write(&self, obj: *mut ffi::PyObject, value: *mut ffi::PyObject) -> c_int {
        match &self.slot {
            Some(slot) if slot.serves(obj) => {
                // The slot's function for WRITE is its descriptor type's tp_descr_set.
                let set = std::mem::transmute::<*mut c_void, ffi::descrsetfunc>(slot.function);
                set(slot.descr.as_ptr(), obj, value)
            }
            _ => ffi::PyObject_SetAttr(obj, self.name.as_ptr(), value),
        }
    }
}

/// Reads one attribute of many objects as `getattr` does (see the module doc).
struct AttrReader<'py> {
    name: Bound<'py, PyString>,
    slot: Option<Slot<'py>>,
}

impl<'py> AttrReader<'py> {
    /// A reader of `name`, fast for objects of `first`'s type.
    fn new(name: Bound<'py, PyString>, first: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
        let slot = Slot::of(first, &name, &READ)?;
        Ok(Self { name, slot })
    }

    /// The attribute of `obj`.
    fn read(&self, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the GIL is held and `obj` is held by the caller. The slot's function for
        // READ is its descriptor type's tp_descr_get, called on an object of the type the
        // descriptor is a slot of; it returns a new reference or null with the error set.
        unsafe {
            let value = match &self.slot {
                Some(slot) if slot.serves(obj.as_ptr()) => {
                    let get = std::mem::transmute::<*mut c_void, ffi::descrgetfunc>(slot.function);
                    get(slot.descr.as_ptr(), obj.as_ptr(), slot.owner.cast())
                }
                _ => ffi::PyObject_GetAttr(obj.as_ptr(), self.name.as_ptr()),
            };
            Bound::from_owned_ptr_or_err(obj.py(), value)
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
