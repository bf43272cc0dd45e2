//! Buffer reads and writes for the stable ABI of CPython 3.10 (feature `abi3`), whose
//! limited API has no buffer protocol (`PyObject_GetBuffer` joined it in 3.11): the same
//! checks as `pyo3::buffer::PyBuffer` (one dimension or C-contiguous, item size, format),
//! made on a `memoryview` of the object, and the bytes moved by one `tobytes()` call (reads)
//! or one slice assignment (writes), never a Python call per item.
//!
//! Only compiled with `abi3`; the default build reads and writes the buffers in place.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySlice};

/// An integer type a buffer item can be read into: its size, its signedness, and how it
/// is built from native-endian bytes.
pub(super) trait BufferItem: Copy {
    const SIGNED: bool;
    const SIZE: usize;
    fn from_ne(bytes: &[u8]) -> Self;
    fn to_ne(self) -> Vec<u8>;
}

macro_rules! buffer_item {
    ($t:ty, $signed:expr) => {
        impl BufferItem for $t {
            const SIGNED: bool = $signed;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_ne(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("chunks of the item size"))
            }
            fn to_ne(self) -> Vec<u8> {
                self.to_ne_bytes().to_vec()
            }
        }
    };
}

buffer_item!(u32, false);
buffer_item!(u64, false);
buffer_item!(i32, true);
buffer_item!(i64, true);

/// (signed, bytes) of a struct-module format of one integer item, as `PyBuffer` reads it:
/// native sizes without a prefix or with `@`, standard sizes with `=` or `<`; None for
/// anything else.
fn integer_format(format: &str) -> Option<(bool, usize)> {
    use std::mem::size_of;
    let (native, code) = match format.as_bytes() {
        [c] | [b'@', c] => (true, *c),
        [b'=' | b'<', c] => (false, *c),
        _ => return None,
    };
    let item = match (code, native) {
        (b'b', _) => (true, 1),
        (b'B' | b'c', _) => (false, 1),
        (b'h', _) => (true, 2),
        (b'H', _) => (false, 2),
        (b'i', _) => (true, 4),
        (b'I', _) => (false, 4),
        (b'l', true) => (true, size_of::<std::ffi::c_long>()),
        (b'L', true) => (false, size_of::<std::ffi::c_ulong>()),
        (b'l', false) => (true, 4),
        (b'L', false) => (false, 4),
        (b'q', _) => (true, 8),
        (b'Q', _) => (false, 8),
        (b'n', true) => (true, size_of::<isize>()),
        (b'N', true) => (false, size_of::<usize>()),
        _ => return None,
    };
    Some(item)
}

/// A memoryview of `obj` whose items are `T`s and which is C-contiguous (and 1-D when
/// `one_dim`); None for anything else, or for an object without the buffer protocol.
fn view_of<'py, T: BufferItem>(
    obj: &Bound<'py, PyAny>,
    one_dim: bool,
) -> Option<Bound<'py, PyMemoryView>> {
    let view = PyMemoryView::from(obj).ok()?;
    let format = view.getattr("format").ok()?.extract::<String>().ok()?;
    let itemsize = view.getattr("itemsize").ok()?.extract::<usize>().ok()?;
    let ndim = view.getattr("ndim").ok()?.extract::<usize>().ok()?;
    let contiguous = view.getattr("c_contiguous").ok()?.extract::<bool>().ok()?;
    let fits = integer_format(&format) == Some((T::SIGNED, T::SIZE)) && itemsize == T::SIZE;
    (fits && contiguous && (!one_dim || ndim == 1)).then_some(view)
}

/// The items of `obj` if it exposes a 1-D C-contiguous buffer of `T`s, else None. An
/// empty one reads as no items, as the twins read it (`PyBuffer` accepts one only where
/// its data pointer happens to be aligned: a numpy array's, not an `array.array`'s).
pub(super) fn read_items<T: BufferItem>(obj: &Bound<'_, PyAny>) -> Option<Vec<T>> {
    let view = view_of::<T>(obj, true)?;
    let bytes = view.call_method0("tobytes").ok()?;
    let bytes = bytes.downcast::<PyBytes>().ok()?.as_bytes();
    Some(bytes.chunks_exact(T::SIZE).map(T::from_ne).collect())
}

/// Runs `fill` on a zeroed copy of `out`'s int32 items (all of them, so that size checks
/// see the buffer's length), then writes the first `written(&items)` items back into
/// `out` with one slice assignment. Errors: `out` not a writable C-contiguous int32
/// buffer (ValueError, the default build's messages), or what `fill` returns.
pub(super) fn fill_i32_buffer(
    out: &Bound<'_, PyAny>,
    fill: impl FnOnce(&mut [i32]) -> PyResult<usize>,
) -> PyResult<()> {
    let bad = |why: &str| PyValueError::new_err(format!("out {why}"));
    let Ok(view) = PyMemoryView::from(out) else {
        return Err(bad("must be a writable C-contiguous int32 buffer"));
    };
    if view_of::<i32>(out, false).is_none() {
        if !view.getattr("c_contiguous")?.extract::<bool>()? {
            return Err(bad("is not C-contiguous"));
        }
        let format = view.getattr("format")?;
        let itemsize = view.getattr("itemsize")?;
        return Err(bad(&format!(
            "must be a writable C-contiguous int32 buffer: format {format}, item size {itemsize}"
        )));
    }
    if view.getattr("readonly")?.extract::<bool>()? {
        return Err(bad("is read-only"));
    }
    let nbytes = view.getattr("nbytes")?.extract::<usize>()?;
    let mut items = vec![0i32; nbytes / 4];
    let written = fill(&mut items)?;
    if written == 0 {
        return Ok(());
    }
    let bytes: Vec<u8> = items[..written].iter().flat_map(|v| v.to_ne()).collect();
    let flat = view.call_method1("cast", ("B",))?;
    let end = isize::try_from(bytes.len()).expect("a buffer's size fits isize");
    flat.set_item(
        PySlice::new(out.py(), 0, end, 1),
        PyBytes::new(out.py(), &bytes),
    )
}
