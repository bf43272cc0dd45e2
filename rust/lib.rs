//! Host-side KV-cache bookkeeping of enginekit: block pool, block tables, block hashing.
//!
//! The modules `hash`, `block_pool` and `block_table` are pure Rust; `py` (feature `python`)
//! wraps them for Python as `enginekit._native`, converting types and errors only.

pub mod block_pool;
pub mod block_table;
pub mod hash;

#[cfg(feature = "python")]
mod py;

#[cfg(feature = "python")]
#[pyo3::pymodule]
fn _native(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    py::register(m)
}
