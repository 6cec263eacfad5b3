//! Matching removed rows against added rows by fingerprint, with two passes over memory-random data instead of three.
//!
//! Carry-over ([`super::carry`]) counts the added rows' fingerprints, lets every removed row use up one identical
//! added row, and finally emits the added rows nothing used up. With a counting map the last step looks every added
//! row up again; on large groups each lookup is a cache miss, and profiles showed the map as a quarter of a sync.
//!
//! Here added rows are numbered in the order they arrive (0, 1, …). The table maps a fingerprint to the newest added
//! row that has it; `next` chains older rows with the same fingerprint (duplicate rows), so a removed row that matches
//! takes one row off the chain and marks it in a bitmap. The added rows are later replayed in the same order and
//! survive unless marked — a sequential bitmap read, no lookup.
//!
//! The table is open addressing with linear probing over the fingerprint's low 64 bits (fingerprints are hashes
//! already), kept at most three quarters full. A slot holds the fingerprint and the head of its chain side by side,
//! so a probe touches one cache line (rarely two), and batch operations prefetch the slot of the fingerprint a few
//! rows ahead, so the misses of a large table overlap instead of queueing. A head's top bit says whether its chain
//! goes on: a removed row that takes a row with a unique fingerprint (almost every row) never reads `next`, which
//! would be another miss nothing prefetched.

/// No row (end of a chain, empty head).
const NONE: u32 = u32::MAX;
/// Set in a head (or a `next` link) when the chain goes on after its row.
const MORE: u32 = 1 << 31;
/// How far ahead batch operations prefetch.
const AHEAD: usize = 16;

/// Bytes a table slot costs (see [`Slot`]).
const SLOT_BYTES: u64 = std::mem::size_of::<Slot>() as u64;

/// One table slot: a fingerprint (both halves 0 = empty) and the head of the chain of rows that have it.
#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    lo: u64,
    hi: u64,
    head: u32,
}

const EMPTY: Slot = Slot { lo: 0, hi: 0, head: NONE };

impl Slot {
    fn holds(&self, fp: u128) -> bool {
        self.lo == fp as u64 && self.hi == (fp >> 64) as u64
    }

    fn is_empty(&self) -> bool {
        self.lo == 0 && self.hi == 0
    }
}

/// Added rows by fingerprint; see the module header.
pub(crate) struct Matcher {
    slots: Vec<Slot>,
    /// Head of the chain of rows whose fingerprint is 0 (0 marks an empty slot).
    zero: u32,
    len: usize,
    /// Per added row, the head its fingerprint had before it (the rest of the chain).
    next: Vec<u32>,
    taken: Vec<u64>,
    /// Added rows not yet replayed by [`Matcher::survivors`].
    replayed: usize,
}

impl Matcher {
    /// A matcher sized for about `rows` added rows (it grows beyond).
    pub(crate) fn with_capacity(rows: usize) -> Self {
        Matcher {
            slots: vec![EMPTY; slots_for(rows)],
            zero: NONE,
            len: 0,
            next: Vec::with_capacity(rows),
            taken: Vec::with_capacity(rows.div_ceil(64)),
            replayed: 0,
        }
    }

    /// Empties the matcher and sizes it for `rows`, in the memory it has (no fresh pages to fault in).
    pub(crate) fn reset(&mut self, rows: usize) {
        self.slots.clear();
        self.slots.resize(slots_for(rows), EMPTY);
        self.next.clear();
        self.next.reserve(rows);
        self.taken.clear();
        self.taken.reserve(rows.div_ceil(64));
        (self.zero, self.len, self.replayed) = (NONE, 0, 0);
    }

    /// The bytes a matcher sized for `rows` holds once it has them (table slots, a `next` link and a bit per row).
    pub(crate) fn bytes_for(rows: u64) -> u64 {
        slots_for(rows as usize) as u64 * SLOT_BYTES + rows * 4 + rows.div_ceil(8)
    }

    /// Numbers the next added rows, one per fingerprint.
    pub(crate) fn add(&mut self, fps: &[u128]) {
        assert!(self.next.len() + fps.len() < MORE as usize, "a carry-over part holds fewer than 2^31 rows");
        if (self.len + fps.len()) * 4 > self.slots.len() * 3 {
            self.grow((self.len + fps.len()) * 4 / 3 + 1);
        }
        for (i, fp) in fps.iter().enumerate() {
            if let Some(ahead) = fps.get(i + AHEAD) {
                self.prefetch(*ahead);
            }
            let row = self.next.len() as u32;
            let head = match self.slot(*fp) {
                Some(s) => &mut self.slots[s].head,
                None => &mut self.zero,
            };
            self.next.push(*head);
            *head = if *head == NONE { row } else { row | MORE };
        }
        self.taken.resize(self.next.len().div_ceil(64), 0);
    }

    /// Per removed row whether it survives: a removed row that matches an added row not yet taken takes it and
    /// vanishes. Returns the mask and how many were cancelled.
    pub(crate) fn cancel(&mut self, fps: &[u128]) -> (Vec<bool>, u64) {
        let mut cancelled = 0;
        let keep = fps
            .iter()
            .enumerate()
            .map(|(i, fp)| {
                if let Some(ahead) = fps.get(i + AHEAD) {
                    self.prefetch(*ahead);
                }
                let head = match self.find(*fp) {
                    Some(s) => &mut self.slots[s].head,
                    None if *fp == 0 => &mut self.zero,
                    None => return true,
                };
                let h = *head;
                if h == NONE {
                    return true;
                }
                let row = (h & !MORE) as usize;
                *head = if h & MORE != 0 { self.next[row] } else { NONE };
                self.taken[row / 64] |= 1 << (row % 64);
                cancelled += 1;
                false
            })
            .collect();
        (keep, cancelled)
    }

    /// Per next `n` added rows (in the order they were added) whether they survive (no removed row took them).
    pub(crate) fn survivors(&mut self, n: usize) -> Vec<bool> {
        let from = self.replayed;
        self.replayed += n;
        (from..from + n).map(|r| self.taken[r / 64] & (1 << (r % 64)) == 0).collect()
    }

    /// The slot holding `fp`, inserted if new (None for fingerprint 0, which has its own head).
    fn slot(&mut self, fp: u128) -> Option<usize> {
        match self.probe(fp)? {
            Ok(s) => Some(s),
            Err(empty) => {
                self.slots[empty] = Slot { lo: fp as u64, hi: (fp >> 64) as u64, head: NONE };
                self.len += 1;
                Some(empty)
            }
        }
    }

    /// The slot holding `fp`, if any (never for 0).
    fn find(&self, fp: u128) -> Option<usize> {
        self.probe(fp)?.ok()
    }

    /// Linear probing from `fp`'s home slot: Ok(the slot holding it) or Err(the empty slot where it would go); None
    /// for fingerprint 0 (the empty marker).
    fn probe(&self, fp: u128) -> Option<std::result::Result<usize, usize>> {
        if fp == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut s = fp as u64 as usize & mask;
        loop {
            let slot = &self.slots[s];
            if slot.holds(fp) {
                return Some(Ok(s));
            }
            if slot.is_empty() {
                return Some(Err(s));
            }
            s = (s + 1) & mask;
        }
    }

    fn grow(&mut self, at_least: usize) {
        let n = at_least.next_power_of_two().max(self.slots.len() * 2);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; n]);
        self.len = 0;
        for o in old.into_iter().filter(|o| !o.is_empty()) {
            let s = self.slot(((o.hi as u128) << 64) | o.lo as u128).expect("non-zero key");
            self.slots[s].head = o.head;
        }
    }

    #[inline]
    fn prefetch(&self, fp: u128) {
        #[cfg(target_arch = "x86_64")]
        {
            let s = fp as u64 as usize & (self.slots.len() - 1);
            // SAFETY: prefetching is a hint that never faults; both pointers are inside the slot anyway.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                let p = self.slots.as_ptr().add(s) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(p);
                // a slot may straddle two cache lines
                _mm_prefetch::<_MM_HINT_T0>(p.add(std::mem::size_of::<Slot>() - 1));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = fp;
    }
}

/// Table slots for `rows` rows: a power of two, at most three quarters full.
fn slots_for(rows: usize) -> usize {
    (rows * 4 / 3 + 1).next_power_of_two().max(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matcher against a naive multiset, duplicates, fingerprint 0, colliding low halves and growth included.
    #[test]
    fn matches_like_a_multiset() {
        let mut added: Vec<u128> = (1..5000u128).map(|i| i.wrapping_mul(0x9e3779b97f4a7c15_f39cc0605cedc835)).collect();
        added.extend([0, 0, 7, 7, 7]);
        // same low 64 bits, different high bits: must not match each other
        added.extend((1..50u128).map(|i| (i << 64) | 42));
        let removed: Vec<u128> = added.iter().step_by(3).copied().chain([7, 7, 7, 7, 0, 0, 0, 42, 99 << 64 | 42, 12345]).collect();

        // a matcher another group used (rows added, taken, replayed), reused: nothing of its state may leak
        let mut old = Matcher::with_capacity(10_000);
        old.add(&added[..2000]);
        old.cancel(&removed);
        old.survivors(100);
        old.reset(10);
        let mut m = old; // grows
        for chunk in added.chunks(333) {
            m.add(chunk);
        }
        assert_eq!(m.next.len(), added.len());
        let (keep_removed, cancelled) = m.cancel(&removed);
        let mut keep_added = Vec::new();
        for chunk in added.chunks(1000) {
            keep_added.extend(m.survivors(chunk.len()));
        }

        // naive: count every added fingerprint, removed rows use counts up
        let mut counts = std::collections::HashMap::<u128, i64>::new();
        added.iter().for_each(|f| *counts.entry(*f).or_default() += 1);
        let naive_removed: Vec<bool> = removed
            .iter()
            .map(|f| match counts.get_mut(f) {
                Some(c) if *c > 0 => {
                    *c -= 1;
                    false
                }
                _ => true,
            })
            .collect();
        assert_eq!(keep_removed, naive_removed);
        assert_eq!(cancelled as usize, naive_removed.iter().filter(|k| !**k).count());
        // per fingerprint, as many added rows survive as the counts say (which of identical rows does not matter)
        let mut surviving = std::collections::HashMap::<u128, i64>::new();
        added.iter().zip(&keep_added).filter(|(_, k)| **k).for_each(|(f, _)| *surviving.entry(*f).or_default() += 1);
        counts.retain(|_, c| *c > 0);
        assert_eq!(surviving, counts);
    }
}
