//! Python wrapper of [`RadixTree`]: argument conversion and error mapping only.
//!
//! Results are instances of the NamedTuples of `enginekit.interfaces.structures`
//! (`RadixMatch`, `InsertResult`, `RadixNode`), the one definition the pure-Python twin
//! returns too; a tree looks them up when it is created.

use pyo3::prelude::*;

use super::convert::{
    as_u64, cache_err, count, guard, leading_token_ids_arg, table_block_ids, to_py, token_ids_arg,
    value_err,
};
use crate::radix::RadixTree;

#[pyclass(name = "RadixTree", module = "enginekit._native")]
pub(super) struct PyRadixTree {
    inner: RadixTree,
    /// The result types of `enginekit.interfaces.structures`: RadixMatch, InsertResult,
    /// RadixNode.
    match_type: Py<PyAny>,
    insert_type: Py<PyAny>,
    node_type: Py<PyAny>,
}

/// An existing node's id: an int outside u64 is an unknown node.
fn node_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    as_u64(obj)?.ok_or_else(|| cache_err(format!("unknown node {obj}")))
}

#[pymethods]
impl PyRadixTree {
    #[new]
    fn new(py: Python<'_>, block_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(|| {
            let bs = as_u64(block_size)?.ok_or_else(|| {
                value_err(format!(
                    "block_size must be in [1, 2**64), got {block_size}"
                ))
            })?;
            let inner = RadixTree::new(bs).map_err(to_py)?;
            let types = py.import("enginekit.interfaces.structures")?;
            Ok(PyRadixTree {
                inner,
                match_type: types.getattr("RadixMatch")?.unbind(),
                insert_type: types.getattr("InsertResult")?.unbind(),
                node_type: types.getattr("RadixNode")?.unbind(),
            })
        })
    }

    #[getter]
    fn block_size(&self) -> PyResult<u64> {
        guard(|| Ok(self.inner.block_size()))
    }

    fn num_evictable_blocks(&self) -> PyResult<u64> {
        guard(|| Ok(self.inner.num_evictable_blocks()))
    }

    fn num_evictable_among(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<u64> {
        guard(|| {
            let blocks = table_block_ids(block_ids)?;
            Ok(self.inner.num_evictable_among(&blocks))
        })
    }

    #[pyo3(signature = (token_ids, max_tokens=None))]
    fn match_prefix(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        max_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        guard(|| {
            let limit = match max_tokens {
                Some(obj) => usize::try_from(count(obj, "max_tokens")?).unwrap_or(usize::MAX),
                None => usize::MAX,
            };
            let tokens = leading_token_ids_arg(token_ids, limit)?;
            let m = self.inner.match_prefix(&tokens);
            Ok(self
                .match_type
                .bind(py)
                .call1((m.num_tokens, m.block_ids, m.node_id))?
                .unbind())
        })
    }

    fn insert(
        &mut self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        guard(|| {
            let tokens = token_ids_arg(token_ids)?;
            let blocks = table_block_ids(block_ids)?;
            let r = self.inner.insert(&tokens, &blocks).map_err(to_py)?;
            Ok(self
                .insert_type
                .bind(py)
                .call1((
                    r.num_new_tokens,
                    r.new_block_refs,
                    r.node_id,
                    r.released_block_refs,
                ))?
                .unbind())
        })
    }

    fn lock(&mut self, node_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let n = node_arg(node_id)?;
            self.inner.lock(n).map_err(to_py)
        })
    }

    fn unlock(&mut self, node_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let n = node_arg(node_id)?;
            self.inner.unlock(n).map_err(to_py)
        })
    }

    fn evict(&mut self, num_blocks: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        guard(|| {
            let n = count(num_blocks, "num_blocks")?;
            Ok(self.inner.evict(n))
        })
    }

    fn nodes(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        guard(|| {
            let node_type = self.node_type.bind(py);
            self.inner
                .nodes()
                .into_iter()
                .map(|n| {
                    let fields = (
                        n.node_id,
                        n.parent_id,
                        n.token_ids,
                        n.block_ids,
                        n.lock_count,
                        n.stamp,
                    );
                    Ok(node_type.call1(fields)?.unbind())
                })
                .collect()
        })
    }

    fn check_integrity(&self) -> PyResult<()> {
        guard(|| self.inner.check_integrity().map_err(to_py))
    }
}
