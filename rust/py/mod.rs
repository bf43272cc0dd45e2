//! Python wrappers (`enginekit._native`): registration of the module's contents.
//!
//! No logic lives here or below: `convert` turns Python arguments into the core's types and
//! the core's errors into exceptions; `out` makes the results' Python lists, tuples and
//! dicts with checked calls only; `pool`, `tables`, `hash_chains` and `radix` wrap one
//! structure each; `functions` holds the module-level functions; `decode` the decode
//! batch's per-step passes over Python requests. The wrappers depend on `convert` and
//! `out`, never on this module.

use pyo3::prelude::*;

use crate::error::{MAX_BLOCKS, MAX_TABLE_LEN};
use crate::hash::ROOT_HASH;

mod convert;
mod decode;
mod functions;
mod hash_chains;
mod out;
mod pool;
mod radix;
mod room;
mod tables;

/// Fills the `enginekit._native` module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ROOT_HASH", ROOT_HASH)?;
    m.add("MAX_BLOCKS", MAX_BLOCKS)?;
    m.add("MAX_TABLE_LEN", MAX_TABLE_LEN)?;
    functions::register(m)?;
    decode::register(m)?;
    m.add_class::<pool::PyBlockPool>()?;
    m.add_class::<room::PyLruRoom>()?;
    m.add_class::<tables::PyBlockTables>()?;
    m.add_class::<hash_chains::PyHashChains>()?;
    m.add_class::<radix::PyRadixTree>()
}
