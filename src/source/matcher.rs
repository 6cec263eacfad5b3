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
//! already), kept at most three quarters full, keys and heads in separate arrays. Batch operations prefetch the slot of the
//! fingerprint a few rows ahead, so the cache misses of a large table overlap instead of queueing.

/// No row (end of a chain, empty head).
const NONE: u32 = u32::MAX;
/// How far ahead batch operations prefetch.
const AHEAD: usize = 16;

/// Bytes a table slot costs (16 key + 4 head).
const SLOT_BYTES: u64 = 20;

/// Added rows by fingerprint; see the module header.
pub(crate) struct Matcher {
    keys: Vec<u128>,
    heads: Vec<u32>,
    /// Head of the chain of rows whose fingerprint is 0 (0 marks an empty slot).
    zero: u32,
    len: usize,
    next: Vec<u32>,
    taken: Vec<u64>,
    /// Added rows not yet replayed by [`Matcher::survivors`].
    replayed: usize,
}

impl Matcher {
    /// A matcher sized for about `rows` added rows (it grows beyond).
    pub(crate) fn with_capacity(rows: usize) -> Self {
        let slots = slots_for(rows);
        Matcher {
            keys: vec![0; slots],
            heads: vec![NONE; slots],
            zero: NONE,
            len: 0,
            next: Vec::with_capacity(rows),
            taken: Vec::with_capacity(rows.div_ceil(64)),
            replayed: 0,
        }
    }

    /// The bytes a matcher sized for `rows` holds once it has them (table slots, a `next` link and a bit per row).
    pub(crate) fn bytes_for(rows: u64) -> u64 {
        slots_for(rows as usize) as u64 * SLOT_BYTES + rows * 4 + rows.div_ceil(8)
    }

    /// Numbers the next added rows, one per fingerprint.
    pub(crate) fn add(&mut self, fps: &[u128]) {
        assert!(self.next.len() + fps.len() < NONE as usize, "a carry-over part holds fewer than 2^32 rows");
        if (self.len + fps.len()) * 4 > self.keys.len() * 3 {
            self.grow((self.len + fps.len()) * 4 / 3 + 1);
        }
        for (i, fp) in fps.iter().enumerate() {
            if let Some(ahead) = fps.get(i + AHEAD) {
                self.prefetch(*ahead);
            }
            let row = self.next.len() as u32;
            let head = match self.slot(*fp) {
                Some(s) => &mut self.heads[s],
                None => &mut self.zero,
            };
            self.next.push(*head);
            *head = row;
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
                    Some(s) => &mut self.heads[s],
                    None if *fp == 0 => &mut self.zero,
                    None => return true,
                };
                if *head == NONE {
                    return true;
                }
                let row = *head as usize;
                *head = self.next[row];
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
                self.keys[empty] = fp;
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
        let mask = self.keys.len() - 1;
        let mut s = fp as u64 as usize & mask;
        loop {
            if self.keys[s] == fp {
                return Some(Ok(s));
            }
            if self.keys[s] == 0 {
                return Some(Err(s));
            }
            s = (s + 1) & mask;
        }
    }

    fn grow(&mut self, at_least: usize) {
        let slots = at_least.next_power_of_two().max(self.keys.len() * 2);
        let keys = std::mem::replace(&mut self.keys, vec![0; slots]);
        let heads = std::mem::replace(&mut self.heads, vec![NONE; slots]);
        self.len = 0;
        for (k, h) in keys.into_iter().zip(heads).filter(|(k, _)| *k != 0) {
            let s = self.slot(k).expect("non-zero key");
            self.heads[s] = h;
        }
    }

    #[inline]
    fn prefetch(&self, fp: u128) {
        #[cfg(target_arch = "x86_64")]
        {
            let s = fp as u64 as usize & (self.keys.len() - 1);
            // SAFETY: prefetching is a hint that never faults; the pointer is in bounds anyway.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(self.keys.as_ptr().add(s) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(self.heads.as_ptr().add(s) as *const i8);
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

        let mut m = Matcher::with_capacity(10); // grows
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
