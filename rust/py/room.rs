//! `LruRoom`: the make-room call back of a pool whose room is made by evicting in its own
//! LRU order, which the block tables' `grow_with` runs without calling into Python (spec:
//! the twin `PyLruRoom` in `enginekit/kv/pyref/pool.py`).

use pyo3::intern;
use pyo3::prelude::*;

use super::convert::{count, guard};
use super::pool::PyBlockPool;

/// `room(num_blocks)` is `pool.make_room_lru(num_blocks, reserve.total)`: it makes
/// `num_blocks` blocks free beyond the `total` free blocks `reserve` keeps (read at each
/// call), evicting the least recently released cached blocks, all or nothing.
#[pyclass(name = "LruRoom", module = "enginekit._native", frozen)]
pub(super) struct PyLruRoom {
    pool: Py<PyBlockPool>,
    reserve: Py<PyAny>,
}

impl PyLruRoom {
    /// The call back itself (what `__call__` does with a count already read).
    pub(super) fn make_room(&self, py: Python<'_>, num_blocks: u64) -> PyResult<bool> {
        let total = self.reserve.bind(py).getattr(intern!(py, "total"))?;
        let kept = count(&total, "reserve.total")?;
        let mut pool = self.pool.bind(py).try_borrow_mut()?;
        Ok(pool.inner.make_room_lru(num_blocks, kept))
    }
}

#[pymethods]
impl PyLruRoom {
    #[new]
    fn new(pool: Bound<'_, PyBlockPool>, reserve: Bound<'_, PyAny>) -> Self {
        PyLruRoom {
            pool: pool.unbind(),
            reserve: reserve.unbind(),
        }
    }

    fn __call__(&self, py: Python<'_>, num_blocks: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| {
            let n = count(num_blocks, "num_blocks")?;
            self.make_room(py, n)
        })
    }
}
