//! Matching removed rows against added rows by fingerprint: a multiset difference in 32 bytes a row.
//!
//! Carry-over ([`super::carry`]) lets every removed row use up one identical added row (same fingerprint), and finally
//! emits the added rows nothing used up. All added rows arrive before the first removed row, so the added side can be
//! a static structure built once, in between.
//!
//! Added rows are numbered in the order they arrive (0, 1, …) and stored as 16-byte entries: 96 bits of the
//! fingerprint and the row's number. Adding already partitions them by the top bits of the fingerprint's low half
//! into 2^11 first-level buckets: each bucket fills blocks of its own (at most 4 KiB), taken from one array as they
//! are needed, so only 2^11 write positions are live and stay in cache. The first removed row seals the matcher:
//! the blocks are put in bucket order in place (whole blocks swapped, each moved at most twice), then each
//! first-level bucket — cache-sized — is counting-sorted by the remaining bucket bits through a small scratch and
//! written back, closing the gaps the half-filled last blocks left. Final buckets hold about four rows, and a
//! directory gives each bucket's first entry. A removed row looks at its bucket only (one or two cache lines) and
//! takes the first entry with its fingerprint whose row is not taken yet, marking that row in a bitmap; duplicate
//! rows are simply equal entries of one bucket. The added rows are later replayed in the order they came and survive
//! unless marked — a sequential bitmap read, no lookup.
//!
//! Memory: 16 bytes a row, plus the last blocks' slack (at most 6 %), the directory and the bitmap — at most about
//! 19 bytes a row.
//! Why not a hash table: it was 36–68 bytes a row (slots of 24 bytes at most three quarters full, a power of two,
//! plus a chain link), and every insert was a cache miss. The tenth round partitioned at sealing, out of place (32
//! bytes a row); an in-place first pass at sealing (swapping each entry to its bucket) cost a sixth of the matching,
//! every swap waiting for the one before. The smaller footprint lets larger groups match in memory instead of
//! spilling both sides ([`super::carry`]'s parts). Lookups still miss the cache once each; batch lookups prefetch a
//! few rows ahead so the misses overlap.
//!
//! 96 bits (the whole low half, the low 32 bits of the high half) decide a match. Two different rows of one group
//! would have to agree on all of them: for a group of n added and m removed rows that happens with probability
//! n·m/2^96, about 10^-11 for a billion rows on each side.

/// How far ahead batch lookups prefetch a bucket's entries (the directory twice as far).
const AHEAD: usize = 16;
/// Rows a bucket holds on average at most (a bucket is scanned linearly).
const BUCKET_ROWS: usize = 4;
/// Bits of the first level, which adding partitions by (2^11 open blocks: their write positions fit the L1/L2 cache).
const FIRST_BITS: u32 = 11;
/// Entries of a block at most (4 KiB). Smaller matchers take smaller blocks, so that the half-filled last block of
/// each first-level bucket stays a few percent of the entries.
const MAX_BLOCK: usize = 256;

/// One added row: 96 bits of its fingerprint and its number.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Entry {
    lo: u64,
    hi: u32,
    row: u32,
}

impl Entry {
    fn key(fp: u128) -> (u64, u32) {
        (fp as u64, (fp >> 64) as u32)
    }
}

/// How a matcher expecting `rows` added rows lays them out while adding.
#[derive(Clone, Copy)]
struct Layout {
    /// First-level bucket bits.
    first_bits: u32,
    /// Entries a block holds.
    block: usize,
}

impl Layout {
    fn for_rows(rows: usize) -> Self {
        let first_bits = bits_for(rows).min(FIRST_BITS);
        // a sixteenth of a first-level bucket's expected rows: the last blocks' slack is at most a sixteenth of the rows
        let block = ((rows >> first_bits) / 16).clamp(8, MAX_BLOCK);
        Layout { first_bits, block }
    }
}

/// Added rows by fingerprint; see the module header.
pub(crate) struct Matcher {
    layout: Layout,
    /// While adding: blocks of `layout.block` entries, each holding entries of one first-level bucket. Once sealed:
    /// the entries bucket by bucket, without gaps.
    entries: Vec<Entry>,
    /// Added rows.
    rows: usize,
    /// Per first-level bucket: its entries, and where its next entry goes (a block boundary: it needs a new block).
    counts: Vec<u32>,
    next: Vec<usize>,
    /// Per block, the first-level bucket it belongs to.
    owner: Vec<u16>,
    /// Once sealed: bucket `b`'s entries are `entries[dir[b]..dir[b + 1]]`.
    dir: Vec<u32>,
    /// Bucket bits (the top `bits` bits of a fingerprint's low half); valid once sealed.
    bits: u32,
    sealed: bool,
    taken: Vec<u64>,
    /// Added rows already replayed by [`Matcher::survivors`].
    replayed: usize,
    /// One first-level bucket being sorted by [`Matcher::seal`]; kept for the next group.
    scratch: Vec<Entry>,
}

impl Matcher {
    /// A matcher sized for about `rows` added rows (it grows beyond, at the cost of larger first-level buckets).
    pub(crate) fn with_capacity(rows: usize) -> Self {
        let mut m = Matcher {
            layout: Layout::for_rows(rows),
            entries: Vec::new(),
            rows: 0,
            counts: Vec::new(),
            next: Vec::new(),
            owner: Vec::new(),
            dir: Vec::new(),
            bits: 0,
            sealed: false,
            taken: Vec::new(),
            replayed: 0,
            scratch: Vec::new(),
        };
        m.reset(rows);
        m
    }

    /// Empties the matcher and sizes it for `rows`, in the memory it has (no fresh pages to fault in).
    pub(crate) fn reset(&mut self, rows: usize) {
        self.layout = Layout::for_rows(rows);
        let buckets = 1 << self.layout.first_bits;
        self.entries.clear();
        self.entries.reserve(rows + buckets * self.layout.block);
        self.rows = 0;
        self.counts.clear();
        self.counts.resize(buckets, 0);
        self.next.clear();
        self.next.resize(buckets, 0);
        self.owner.clear();
        self.owner.reserve(rows / self.layout.block + buckets);
        self.dir.clear();
        self.taken.clear();
        self.taken.reserve(rows.div_ceil(64));
        (self.bits, self.sealed, self.replayed) = (0, false, 0);
    }

    /// [`Matcher::reset`] for `rows`, giving back the memory beyond what they need (a group in parts keeps only a
    /// part's matcher once its resident parts are done).
    pub(crate) fn shrink(&mut self, rows: usize) {
        // a fresh matcher sized like `reset` sizes one; the old tables are freed
        *self = Matcher::with_capacity(rows);
    }

    /// The bytes a matcher sized for `rows` holds at most once it has them and is sealed: entries with the last
    /// blocks' slack, the per-block owners, the sorting scratch (a first-level bucket with room for variance), the
    /// directory and a bit per row.
    pub(crate) fn bytes_for(rows: u64) -> u64 {
        let layout = Layout::for_rows(rows as usize);
        let buckets = 1u64 << layout.first_bits;
        let entry = std::mem::size_of::<Entry>() as u64;
        let entries = (rows + buckets * layout.block as u64) * entry;
        let owners = (rows / layout.block as u64 + buckets) * 2;
        let scratch = ((rows >> layout.first_bits) * 5 / 4 + 64) * entry;
        let dir = (buckets_for(rows as usize) as u64 + 1) * 4;
        entries + owners + scratch + dir + buckets * 12 + rows.div_ceil(8)
    }

    /// Numbers the next added rows, one per fingerprint.
    pub(crate) fn add(&mut self, fps: &[u128]) {
        assert!(!self.sealed, "carry-over adds every added row before the first removed one");
        assert!(self.rows + fps.len() < u32::MAX as usize, "a carry-over part holds fewer than 2^32 rows");
        let Layout { first_bits, block } = self.layout;
        for fp in fps {
            let (lo, hi) = Entry::key(*fp);
            let b = bucket(lo, first_bits);
            let mut at = self.next[b];
            if at % block == 0 {
                // the bucket's block is full (or it has none): a new one at the end
                at = self.entries.len();
                self.entries.resize(at + block, Entry::default());
                self.owner.push(b as u16);
            }
            self.entries[at] = Entry { lo, hi, row: self.rows as u32 };
            self.next[b] = at + 1;
            self.counts[b] += 1;
            self.rows += 1;
        }
        self.taken.resize(self.rows.div_ceil(64), 0);
    }

    /// Per removed row whether it survives: a removed row that matches an added row not yet taken takes it and
    /// vanishes. Returns the mask and how many were cancelled.
    pub(crate) fn cancel(&mut self, fps: &[u128]) -> (Vec<bool>, u64) {
        self.seal();
        let (entries, dir, taken, bits) = (&self.entries, &self.dir, &mut self.taken, self.bits);
        let bucket_of = |fp: u128| bucket(fp as u64, bits);
        let mut cancelled = 0;
        let mut keep = Vec::with_capacity(fps.len());
        for (i, fp) in fps.iter().enumerate() {
            if let Some(ahead) = fps.get(i + 2 * AHEAD) {
                prefetch(&dir[bucket_of(*ahead)]);
            }
            if let Some(ahead) = fps.get(i + AHEAD) {
                let from = dir[bucket_of(*ahead)] as usize;
                // a bucket of four entries may straddle two cache lines
                entries.get(from).inspect(|e| prefetch(*e));
                entries.get(from + BUCKET_ROWS - 1).inspect(|e| prefetch(*e));
            }
            let (lo, hi) = Entry::key(*fp);
            let b = bucket(lo, bits);
            let found = entries[dir[b] as usize..dir[b + 1] as usize]
                .iter()
                .map(|e| (e, e.row as usize))
                .find(|(e, row)| e.lo == lo && e.hi == hi && taken[row / 64] & (1 << (row % 64)) == 0);
            match found {
                Some((_, row)) => {
                    taken[row / 64] |= 1 << (row % 64);
                    cancelled += 1;
                    keep.push(false);
                }
                None => keep.push(true),
            }
        }
        (keep, cancelled)
    }

    /// Per next `n` added rows (in the order they were added) whether they survive (no removed row took them).
    pub(crate) fn survivors(&mut self, n: usize) -> Vec<bool> {
        let from = self.replayed;
        self.replayed += n;
        (from..from + n).map(|r| self.taken[r / 64] & (1 << (r % 64)) == 0).collect()
    }

    /// Sorts the entries into buckets and builds the directory (once, before the first lookup).
    ///
    /// Adding left each first-level bucket in blocks of its own, scattered over the array in the order they
    /// filled. First the blocks are permuted into bucket order, in place: a block is swapped straight to where it
    /// belongs, so each moves at most twice, as whole blocks (sequential copies, no chain of dependent swaps). Then
    /// per first-level bucket (cache-sized): a counting sort by the remaining bucket bits into the scratch, copied
    /// back to where the previous bucket ended — at or before the bucket's own blocks, so no unsorted entry is
    /// overwritten, and the gaps of half-filled blocks close. Entries inside a bucket stay unordered.
    fn seal(&mut self) {
        if self.sealed {
            return;
        }
        self.sealed = true;
        let Layout { first_bits, block } = self.layout;
        let n = self.rows;
        self.bits = bits_for(n).max(first_bits);
        let second_bits = self.bits - first_bits;
        let firsts = 1usize << first_bits;

        // blocks into bucket order: `dest[j]` is where the block now at `j` belongs
        let mut first_block = vec![0usize; firsts + 1];
        for (b, c) in self.counts.iter().enumerate() {
            first_block[b + 1] = first_block[b] + (*c as usize).div_ceil(block);
        }
        let mut filled = first_block.clone();
        let mut dest: Vec<usize> = self
            .owner
            .iter()
            .map(|o| {
                filled[*o as usize] += 1;
                filled[*o as usize] - 1
            })
            .collect();
        for j in 0..dest.len() {
            while dest[j] != j {
                // blocks before `j` are in place, so the one `j` holds goes further right
                let d = dest[j];
                let (left, right) = self.entries.split_at_mut(d * block);
                left[j * block..(j + 1) * block].swap_with_slice(&mut right[..block]);
                dest.swap(j, d);
            }
        }

        // per first-level bucket: sorted by the remaining bits, written back without gaps
        self.dir.clear();
        self.dir.resize((1 << self.bits) + 1, 0);
        let mask = (1usize << second_bits) - 1;
        let bits = self.bits;
        let sub = |e: &Entry| bucket(e.lo, bits) & mask;
        let mut counts = vec![0usize; mask + 2];
        let mut written = 0usize;
        self.scratch.clear();
        self.scratch.reserve_exact(*self.counts.iter().max().unwrap_or(&0) as usize);
        for (b, first) in first_block[..firsts].iter().enumerate() {
            let (from, c) = (first * block, self.counts[b] as usize);
            let base = b << second_bits;
            if second_bits == 0 {
                self.entries.copy_within(from..from + c, written);
                self.dir[base] = written as u32;
                written += c;
                continue;
            }
            counts.iter_mut().for_each(|c| *c = 0);
            self.entries[from..from + c].iter().for_each(|e| counts[sub(e) + 1] += 1);
            for s in 0..=mask {
                counts[s + 1] += counts[s];
            }
            for (d, c) in self.dir[base..=base + mask].iter_mut().zip(&counts) {
                *d = (written + c) as u32;
            }
            self.scratch.clear();
            self.scratch.resize(c, Entry::default());
            for e in &self.entries[from..from + c] {
                let s = sub(e);
                self.scratch[counts[s]] = *e;
                counts[s] += 1;
            }
            self.entries[written..written + c].copy_from_slice(&self.scratch);
            written += c;
        }
        self.entries.truncate(n);
        self.dir[1 << self.bits] = n as u32;
    }
}

/// The bucket of a fingerprint's low half `lo`: its top `bits` bits.
#[inline(always)]
fn bucket(lo: u64, bits: u32) -> usize {
    lo.checked_shr(64 - bits).unwrap_or(0) as usize
}

/// Hints the CPU to load `x`'s cache line.
#[inline(always)]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint that never faults, and the pointer comes from a reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(x as *const T as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Bucket bits for `rows` rows: at most [`BUCKET_ROWS`] rows a bucket on average.
fn bits_for(rows: usize) -> u32 {
    rows.div_ceil(BUCKET_ROWS).max(1).next_power_of_two().trailing_zeros()
}

fn buckets_for(rows: usize) -> usize {
    1 << bits_for(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Matches `removed` against `added` (added in chunks of 333) and checks the result against a naive multiset.
    fn check(m: &mut Matcher, added: &[u128], removed: &[u128]) {
        for chunk in added.chunks(333) {
            m.add(chunk);
        }
        assert_eq!(m.rows, added.len());
        let mut keep_removed = Vec::new();
        let mut cancelled = 0;
        for chunk in removed.chunks(1000) {
            let (keep, c) = m.cancel(chunk);
            keep_removed.extend(keep);
            cancelled += c;
        }
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

    fn spread(i: u128) -> u128 {
        i.wrapping_mul(0x9e3779b97f4a7c15_f39cc0605cedc835)
    }

    /// Duplicates, fingerprint 0, equal low halves, and a reused matcher.
    #[test]
    fn matches_like_a_multiset() {
        let mut added: Vec<u128> = (1..5000u128).map(spread).collect();
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
        check(&mut old, &added, &removed);
    }

    /// Enough rows for both partitioning passes, many duplicates, more rows than the matcher was sized for, and
    /// the tiny sizes (one bucket, empty).
    #[test]
    fn matches_like_a_multiset_at_every_size() {
        for n in [0u128, 1, 3, 40, 70_000, 300_000] {
            // every 7th row twice, every 11th three times more
            let mut added: Vec<u128> = (0..n).map(spread).collect();
            added.extend((0..n).step_by(7).map(spread));
            added.extend((0..n).step_by(11).flat_map(|i| [spread(i); 3]));
            // half of the rows, the duplicates more often than added, and rows never added
            let removed: Vec<u128> =
                (0..n).step_by(2).chain((0..n).step_by(7).flat_map(|i| [i; 3])).map(spread).chain((n..n + 500).map(spread)).collect();
            let mut m = Matcher::with_capacity(n as usize / 3);
            check(&mut m, &added, &removed);
            if n == 300_000 {
                assert!(m.bits > FIRST_BITS, "both levels ran");
            }
        }
    }

    /// Entries fill their buckets: on average at most four, none far above (the directory spreads them evenly).
    #[test]
    fn buckets_stay_small() {
        let mut m = Matcher::with_capacity(0);
        m.add(&(0..200_000u128).map(spread).collect::<Vec<_>>());
        m.cancel(&[]);
        let sizes: Vec<u32> = m.dir.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(sizes.iter().sum::<u32>(), 200_000);
        assert!(200_000 / sizes.len() <= BUCKET_ROWS, "{} buckets", sizes.len());
        assert!(*sizes.iter().max().unwrap() <= 24, "largest bucket {}", sizes.iter().max().unwrap());
    }

    /// What a matcher holds once sealed stays within [`Matcher::bytes_for`] of the rows it was sized for, under 20
    /// bytes a row at sizes where that matters; a reused matcher needs no new memory for a group of the same size.
    #[test]
    fn memory_stays_within_bytes_for() {
        let held = |m: &Matcher| {
            let entry = std::mem::size_of::<Entry>();
            (m.entries.capacity() + m.scratch.capacity()) * entry
                + m.owner.capacity() * 2
                + (m.counts.capacity() + m.dir.capacity()) * 4
                + m.next.capacity() * 8
                + m.taken.capacity() * 8
        };
        for n in [0usize, 100, 10_000, 625_000, 3_000_000] {
            let fps: Vec<u128> = (0..n as u128).map(spread).collect();
            let mut m = Matcher::with_capacity(n);
            m.add(&fps);
            m.cancel(&fps[..n / 2]);
            assert!(held(&m) as u64 <= Matcher::bytes_for(n as u64), "{n} rows: {} > {}", held(&m), Matcher::bytes_for(n as u64));
            if n >= 625_000 {
                assert!(Matcher::bytes_for(n as u64) < n as u64 * 20, "{n} rows: {} bytes", Matcher::bytes_for(n as u64));
            }
            let before = m.entries.capacity();
            m.reset(n);
            m.add(&fps);
            m.cancel(&[]);
            assert_eq!(m.entries.capacity(), before, "reused in place");
            // shrunk to a part's size: what it holds is what that part needs, and it still matches
            let part = n / 16;
            m.shrink(part);
            assert!(held(&m) as u64 <= Matcher::bytes_for(part as u64), "{n} rows shrunk to {part}: {}", held(&m));
            m.add(&fps[..part]);
            let (keep, cancelled) = m.cancel(&fps[..part / 2]);
            assert_eq!((cancelled as usize, keep.iter().filter(|k| !**k).count()), (part / 2, part / 2));
        }
    }
}
