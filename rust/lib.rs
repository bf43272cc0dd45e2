//! Host-side KV-cache bookkeeping of enginekit: block pool, block tables, block hashing, the
//! hash chains of block-hash prefix caching and a token-granular radix tree over blocks.
//!
//! The modules `error` (errors and limits), `hash`, `hash_chains`, `block_pool`, `block_table`
//! and `radix` are pure Rust, free of pyo3 types; `py` (feature `python`) wraps them for
//! Python as `enginekit._native`, converting types and errors only.

pub mod block_pool;
pub mod block_table;
pub mod error;
pub mod hash;
pub mod hash_chains;
pub mod radix;

#[cfg(feature = "python")]
mod py;

#[cfg(feature = "python")]
#[pyo3::pymodule]
fn _native(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    py::register(m)
}
