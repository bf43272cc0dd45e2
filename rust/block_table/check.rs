//! `BlockTables::check_integrity`: every invariant re-derived from the tables.

use super::{BlockTables, HOLE};
use crate::block_pool::BlockPool;
use crate::error::{cache_err, KvResult, MAX_BLOCK_ID};

impl BlockTables {
    /// Every held id is inside the pool with ref_count > 0; without a pool, only that ids are
    /// valid table entries (non-negative as int32). Holes may sit anywhere; each table's hole
    /// count must equal its holes.
    pub fn check_integrity(&self, pool: Option<&BlockPool>) -> KvResult<()> {
        for s in self.seq_ids()? {
            let t = &self.tables[&s];
            let mut holes = 0usize;
            for (i, &b) in t.entries.iter().enumerate() {
                if b == HOLE {
                    holes += 1;
                    continue;
                }
                if b > MAX_BLOCK_ID {
                    return cache_err(format!(
                        "block tables integrity: sequence {s} block {i} holds invalid id {b}"
                    ));
                }
                if let Some(p) = pool {
                    match p.ref_count(b) {
                        Err(_) => {
                            return cache_err(format!(
                                "block tables integrity: sequence {s} block {i} holds id {b}, outside the pool of {} blocks",
                                p.num_blocks()
                            ))
                        }
                        Ok(0) => {
                            return cache_err(format!(
                                "block tables integrity: sequence {s} block {i} holds block {b} with ref_count 0"
                            ))
                        }
                        Ok(_) => {}
                    }
                }
            }
            if holes != t.num_holes {
                return cache_err(format!(
                    "block tables integrity: sequence {s} counts {} holes but has {holes}",
                    t.num_holes
                ));
            }
        }
        Ok(())
    }
}
