//! `BlockPool::check_integrity`: every invariant re-derived from the per-block arrays, the
//! free stack and the LRU list.

use super::{BlockPool, NIL};
use crate::error::{cache_err, try_filled, KvResult};

impl BlockPool {
    /// Checks every invariant; the error names the first broken one.
    pub fn check_integrity(&self) -> KvResult<()> {
        let n = self.ref_count.len();
        let fail = |msg: String| cache_err(format!("block pool integrity: {msg}"));
        if self.hash.len() != n || self.prev.len() != n || self.next.len() != n {
            return fail("per-block arrays differ in length".into());
        }
        // 0 = not seen, 1 = on the free stack, 2 = in the LRU list.
        let mut seen = try_filled(n, 0u8, "the integrity check's marks")?;
        for &b in &self.free {
            let i = b as usize;
            if i >= n {
                return fail(format!("free stack holds unknown block {b}"));
            }
            if seen[i] != 0 {
                return fail(format!("block {b} is on the free stack twice"));
            }
            seen[i] = 1;
            if self.ref_count[i] != 0 || self.hash[i].is_some() {
                return fail(format!(
                    "block {b} is on the free stack but is {}",
                    self.state_name(i)
                ));
            }
            if self.prev[i] != NIL || self.next[i] != NIL {
                return fail(format!("free block {b} has LRU links"));
            }
        }
        let mut count = 0u32;
        let mut prev = NIL;
        let mut b = self.lru_head;
        while b != NIL {
            let i = b as usize;
            if i >= n {
                return fail(format!("LRU list holds unknown block {b}"));
            }
            if seen[i] != 0 {
                return fail(format!("block {b} is in the LRU list twice or also free"));
            }
            seen[i] = 2;
            if !self.is_evictable(i) {
                return fail(format!(
                    "block {b} is in the LRU list but is {}",
                    self.state_name(i)
                ));
            }
            if self.prev[i] != prev {
                return fail(format!("LRU prev link of block {b} is inconsistent"));
            }
            count += 1;
            prev = b;
            b = self.next[i];
        }
        if self.lru_tail != prev {
            return fail("LRU tail is not the last block of the list".into());
        }
        if count != self.num_evictable {
            return fail(format!(
                "LRU list has {count} blocks but the counter says {}",
                self.num_evictable
            ));
        }
        let mut num_hashed = 0usize;
        for i in 0..n {
            let expected = match (self.ref_count[i], self.hash[i]) {
                (0, None) => 1,
                (0, Some(_)) => 2,
                _ => 0,
            };
            if seen[i] != expected {
                return fail(format!(
                    "block {i} is {} but {}",
                    self.state_name(i),
                    [
                        "is in no list",
                        "is on the free stack",
                        "is in the LRU list"
                    ][seen[i] as usize]
                ));
            }
            if expected == 0 && (self.prev[i] != NIL || self.next[i] != NIL) {
                return fail(format!("used block {i} has LRU links"));
            }
            if let Some(h) = self.hash[i] {
                num_hashed += 1;
                if self.cached.get(&h) != Some(&(i as u32)) {
                    return fail(format!(
                        "block {i} carries hash {h:#018x} but the hash map disagrees"
                    ));
                }
            }
        }
        if num_hashed != self.cached.len() {
            return fail(format!(
                "hash map has {} entries but {num_hashed} blocks carry a hash",
                self.cached.len()
            ));
        }
        Ok(())
    }
}
