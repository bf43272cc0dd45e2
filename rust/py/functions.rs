//! The module's functions: block hashing (spec in rust/hash.rs) and the panic fence's test hook.

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::convert::{as_u64, extra_key_arg, guard, hash_arg, token_ids_arg, value_err};
use super::out::vec_list;
use crate::hash::{self, ROOT_HASH};

/// Chained 64-bit hash of one block (spec in rust/hash.rs).
#[pyfunction]
#[pyo3(signature = (parent_hash, token_ids, extra_key = None))]
fn hash_block(
    parent_hash: &Bound<'_, PyAny>,
    token_ids: &Bound<'_, PyAny>,
    extra_key: Option<Bound<'_, PyAny>>,
) -> PyResult<u64> {
    guard(|| {
        let parent = hash_arg(parent_hash, "parent_hash")?;
        let tokens = token_ids_arg(token_ids)?;
        let extra = extra_key_arg(&extra_key)?;
        Ok(hash::hash_block(parent, &tokens, extra)?)
    })
}

/// Chained hashes of every full block of token_ids; a trailing partial block is ignored.
#[pyfunction]
#[pyo3(
    signature = (token_ids, block_size, extra_key = None, parent_hash = root_hash_default()),
    text_signature = "(token_ids, block_size, extra_key=None, parent_hash=ROOT_HASH)"
)]
fn hash_blocks<'py>(
    py: Python<'py>,
    token_ids: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    extra_key: Option<Bound<'py, PyAny>>,
    parent_hash: Py<PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    guard(|| {
        let tokens = token_ids_arg(token_ids)?;
        let bs = match as_u64(block_size)? {
            Some(v) if v >= 1 => v,
            _ => {
                return Err(value_err(format!(
                    "block_size must be in [1, 2**64), got {block_size}"
                )))
            }
        };
        let extra = extra_key_arg(&extra_key)?;
        let parent = hash_arg(parent_hash.bind(py), "parent_hash")?;
        let bs = usize::try_from(bs).unwrap_or(usize::MAX);
        vec_list(py, hash::hash_blocks(&tokens, bs, extra, parent)?)
    })
}

fn root_hash_default() -> Py<PyAny> {
    Python::with_gil(|py| {
        ROOT_HASH
            .into_pyobject(py)
            .map_or_else(|e| match e {}, |o| o.into_any().unbind())
    })
}

/// Test hook: panics inside the guard, proving a panic reaches Python as KVCacheError.
#[pyfunction]
fn _panic_for_test() -> PyResult<()> {
    guard(|| panic!("forced panic for test"))
}

/// Adds the functions to the module.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hash_block, m)?)?;
    m.add_function(wrap_pyfunction!(hash_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)
}
