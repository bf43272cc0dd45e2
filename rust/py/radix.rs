//! Python wrapper of [`RadixTree`]: argument conversion and error mapping only.
//!
//! Results are instances of the NamedTuples of `enginekit.interfaces.structures`
//! (`RadixMatch`, `InsertResult`, `RadixNode`), the one definition the pure-Python twin
//! returns too; a tree looks them up when it is created.

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::convert::{
    as_u64, cache_err, count, guard, leading_token_ids_arg, reserve, table_block_ids, to_py,
    token_ids_arg, value_err,
};
use super::out::{int, int_list, object_list, tuple, vec_list};
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
            Ok(self.inner.num_evictable_among(&blocks)?)
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
            let m = self.inner.match_prefix(&tokens)?;
            let fields = tuple(
                py,
                [
                    int(py, m.num_tokens)?,
                    vec_list(py, m.block_ids)?.into_any(),
                    int(py, m.node_id)?,
                ],
            )?;
            Ok(self.match_type.bind(py).call1(fields)?.unbind())
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
            // The result is made before the tree changes: a MemoryError changes nothing.
            let insert_type = self.insert_type.bind(py);
            let (result, _) = self.inner.insert_then(&tokens, &blocks, |r| {
                let fields = tuple(
                    py,
                    [
                        int(py, r.num_new_tokens)?,
                        int_list(py, r.new_block_refs.iter().copied())?.into_any(),
                        int(py, r.node_id)?,
                        int_list(py, r.released_block_refs.iter().copied())?.into_any(),
                    ],
                )?;
                Ok::<_, PyErr>(insert_type.call1(fields)?.unbind())
            })?;
            Ok(result)
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

    fn evict<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let n = count(num_blocks, "num_blocks")?;
            vec_list(py, self.inner.evict(n)?)
        })
    }

    fn evictable_tails<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| Ok(PyList::new(py, self.inner.evictable_tails()?)?))
    }

    fn evict_tail(&mut self, node_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(|| {
            let n = node_arg(node_id)?;
            self.inner.evict_tail(n).map_err(to_py)
        })
    }

    fn nodes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let node_type = self.node_type.bind(py);
            let nodes = self.inner.nodes()?;
            let mut objects = Vec::new();
            reserve(&mut objects, nodes.len(), "the nodes")?;
            for n in nodes {
                let parent = match n.parent_id {
                    Some(p) => int(py, p)?,
                    None => py.None().into_bound(py),
                };
                let fields = tuple(
                    py,
                    [
                        int(py, n.node_id)?,
                        parent,
                        vec_list(py, n.token_ids)?.into_any(),
                        vec_list(py, n.block_ids)?.into_any(),
                        int(py, n.lock_count)?,
                        int(py, n.stamp)?,
                    ],
                )?;
                objects.push(node_type.call1(fields)?);
            }
            object_list(py, objects)
        })
    }

    fn check_integrity(&self) -> PyResult<()> {
        guard(|| self.inner.check_integrity().map_err(to_py))
    }
}
