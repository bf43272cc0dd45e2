//! Host-side KV-cache bookkeeping of enginekit: block pool, block tables, block hashing and a
//! token-granular radix tree over blocks.
//!
//! The modules `error` (errors and limits), `hash`, `block_pool`, `block_table` and `radix` are
//! pure Rust; `py` and the
//! `py_*` modules (feature `python`) wrap them for Python as `enginekit._native`, converting
//! types and errors only.

pub mod block_pool;
pub mod block_table;
pub mod error;
pub mod hash;
pub mod radix;

#[cfg(feature = "python")]
mod py;
#[cfg(feature = "python")]
mod py_pool;
#[cfg(feature = "python")]
mod py_radix;
#[cfg(feature = "python")]
mod py_tables;

#[cfg(feature = "python")]
#[pyo3::pymodule]
fn _native(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    py::register(m)
}
