//! One attribute of many Python objects written in one call: what `setattr` does for each,
//! without its per-object lookup where the attribute is a slot.
//!
//! Objects of the type of the first one, if that type keeps object's own `__setattr__` and
//! the attribute is one of its `__slots__`, are written through the slot's descriptor,
//! looked up once per call: a slot is a data descriptor, so that is all `setattr` does for
//! them. Any other object goes through `setattr`.

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyString, PyType};

/// A slot attribute of the objects of one exact type (`owner`): its descriptor, which holds
/// a reference to `owner` (so the pointer stays valid while this lives), and the
/// descriptor type's tp_descr_set, which writes it.
struct Slot<'py> {
    owner: *mut ffi::PyTypeObject,
    descr: Bound<'py, PyAny>,
    function: *mut c_void,
}

impl<'py> Slot<'py> {
    /// The slot `name` of `first`'s type, if `name` is a slot of that type and writing it
    /// is all the type's setattr would do; None otherwise (and for no `first`).
    fn of(
        first: Option<&Bound<'py, PyAny>>,
        name: &Bound<'py, PyString>,
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
            let generic = ffi::PyObject_GenericSetAttr as *mut c_void;
            if ffi::PyType_GetSlot(owner.as_type_ptr(), ffi::Py_tp_setattro) != generic {
                return Ok(None);
            }
            let function =
                ffi::PyType_GetSlot(descr.get_type().as_type_ptr(), ffi::Py_tp_descr_set);
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
        let slot = Slot::of(first, &name)?;
        Ok(Self { name, slot })
    }

    /// Writes `value` to the attribute of `obj`; -1 with the error set if it fails.
    ///
    /// # Safety
    /// The GIL is held and `obj` and `value` are live objects the caller holds references to.
    pub(super) unsafe fn write(&self, obj: *mut ffi::PyObject, value: *mut ffi::PyObject) -> c_int {
        match &self.slot {
            Some(slot) if slot.serves(obj) => {
                // The slot's function is its descriptor type's tp_descr_set.
                let set = std::mem::transmute::<*mut c_void, ffi::descrsetfunc>(slot.function);
                set(slot.descr.as_ptr(), obj, value)
            }
            _ => ffi::PyObject_SetAttr(obj, self.name.as_ptr(), value),
        }
    }
}
