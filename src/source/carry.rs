//! Copy-on-write carry-over: cancelling the rows a rewrite removed and re-added unchanged, in one read of each file.
//!
//! A copy-on-write commit removes whole files and adds rewritten ones; most of their rows are identical on both
//! sides. Before netting, each added row is matched against a removed row with the same 128-bit fingerprint
//! ([`super::fingerprint`]); matched pairs vanish, the rest are real changes.
//!
//! Protocol (per group of files that can share rows, see `changelog`): every added row first ([`CarryOver::add`]),
//! then every removed row ([`CarryOver::remove`], which emits the removed rows that no added row cancels), then
//! [`CarryOver::finish`] emits the added rows no removed row cancelled.
//!
//! Memory is bounded by `share` and no data file is read twice. What a group holds does not grow with its rows,
//! only the number of its parts does (each part's matcher fits the share). A group so large that its parts' file
//! buffers would fill the share (~5 billion rows at the default budget) is refused before anything is read; the
//! scan names the budget that does ([`CarryOver::parts_for`]):
//! - one part (the added rows' [`Matcher`] fits the share): added fingerprints go into the matcher; added rows
//!   are kept in memory while they fit the rest of the share, and beyond it appended to a local spill file (Arrow
//!   IPC) that `finish` streams back in the same order (the matcher knows added rows by their order).
//! - several parts: rows of each side are appended once, whole batches in arrival order, to one spill file per side
//!   (no copy per part); only their fingerprints, with the row's number on its side, are partitioned (by the
//!   fingerprint, so equal rows meet in one part) into small per-part files. `finish` matches part by part on
//!   fingerprints alone — the part's added fingerprints into a fresh matcher, its removed fingerprints cancelling —
//!   and writes the numbers of the rows that survive on each side to a small file per part (ascending: a part's
//!   files hold its rows in arrival order). Then it streams each side's rows back once and emits those that a merge
//!   of its parts' lists names. An earlier version marked the cancelled rows in two bitmaps held in memory, a bit
//!   per row of each side. At the default budget those bitmaps filled the share from ~500 M rows in one group.
//! - resident parts (a hybrid of the two, whenever there are several parts): the first parts, as many as the share
//!   holds beside the rest, keep their added fingerprints in a matcher in memory instead of a file. A removed row of
//!   a resident part is decided as it arrives — cancelled, or emitted at once — so only the removed rows of the
//!   other parts are spilled; the resident parts' surviving added rows become one more list. The added
//!   side is spilled whole either way (its survivors are known only once every removed row has been seen). At 100 M
//!   rows, a partition group's added fingerprints are about twice its share: a third of the removed side no longer
//!   goes to disk.
//! - taking turns: after the last removed row, [`CarryOver::release_resident`] lists the resident parts' surviving
//!   added rows and shrinks the matcher to one part's size. From there the group holds a part's matcher and the
//!   lists' buffers, so the scan lets groups in parts take turns with a share 1.5 times as large — the next group reads and
//!   matches while this one finishes (at 100 M rows 56 % of the parts resident instead of 32 %).
//!
//! [`Matcher::bytes_for`] says what the matcher of a part holds; a part also maps its matcher's rows back to their
//! numbers (4 bytes a row).
//!
//! The sides are roles: the one taken whole first is called added here, the one that streams through removed.
//! Matching is a multiset difference, so a caller may give the removed rows first — when a sink reads only their
//! key and partition columns, they are a fraction of a row to hold or spill ([`super::slim`],
//! [`CarryOver::with_first_schema`]) and the whole rows that stream through are decided as they arrive — and swap
//! the sides of what is emitted back.
//! Size: ~700 lines of code and ~240 of unit tests, kept beside the algorithm they pin down.
use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use std::io::{BufReader, Read, Write};

use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_data::ArrayData;
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::source::matcher::Matcher;
use crate::source::net::Side;

/// Bytes of one entry of a part's fingerprint file: the fingerprint and the row's number on its side.
const ENTRY_BYTES: usize = 20;
/// What a part's matcher may hold when the share allows more parts (see [`CarryOver::parts_for`]): about an L2
/// cache. At 100 M rows, 1 MiB parts halved the lookups' cost against parts as large as the share, but scattering
/// fingerprints into their 200 part files' buffers cost most of what that saved; 2 MiB is between.
const PART_MATCHER_BYTES: u64 = 2 << 20;
/// Rows one matcher holds at most (it numbers them with 32 bits), and rows one side of a group in parts may have
/// (the parts' files and survivor lists number them with 32 bits too).
pub(crate) const MAX_MATCHER_ROWS: u64 = u32::MAX as u64;
/// How far the parts' file buffers may pass the share's room before a plan counts as not fitting: tiny budgets (tests,
/// a few MiB) still run, within the fixed overhead the budget does not cover.
const BUFFER_SLACK: u64 = 32 << 20;
/// Entries read from a part's fingerprint file at once.
const ENTRIES_PER_READ: usize = 8192;

/// What a carry-over pass did, for the scan's statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct CarryStats {
    /// Identical removed/added pairs cancelled.
    pub cancelled: u64,
    /// Fingerprint parts (1 = everything in memory at once).
    pub parts: u64,
    /// Of those, the parts matched in memory as rows arrived (the most any group had).
    pub resident_parts: u64,
    /// Bytes written to local spill files (0 when everything fit).
    pub spilled_bytes: u64,
}

impl CarryStats {
    /// Adds another group's statistics (parts: the most any group needed).
    pub fn absorb(&mut self, other: CarryStats) {
        self.cancelled += other.cancelled;
        self.parts = self.parts.max(other.parts);
        self.resident_parts = self.resident_parts.max(other.resident_parts);
        self.spilled_bytes += other.spilled_bytes;
    }
}

/// What [`CarryOver::finish`] gives back.
pub(crate) struct Finished {
    pub(crate) stats: CarryStats,
    /// The matcher, for the next group to reuse: its table is faulted in already, and glibc would keep a freed one
    /// in the arena of the thread that freed it, beside the next group's fresh table (+70 MB peak RSS at 10 M rows
    /// when groups ran on two workers).
    pub(crate) matcher: Matcher,
}

/// Emits surviving rows to the netter (or a test).
pub(crate) type Emit<'a> = dyn FnMut(Side, RecordBatch) -> Result<()> + 'a;

/// Carry-over cancellation for one group of files; see the module header for the protocol.
pub(crate) struct CarryOver {
    /// The schema of each side's rows (indexed by [`Side`]); the same unless the first side is slim
    /// ([`CarryOver::with_first_schema`]).
    schemas: [SchemaRef; 2],
    spill_dir: PathBuf,
    parts: u64,
    /// Added rows a part is sized for (all of them with one part).
    rows_per_part: usize,
    matcher: Matcher,
    /// One part: added rows kept in memory, and where they went once the memory left by the matcher was used up.
    kept: Vec<RecordBatch>,
    kept_bytes: u64,
    /// The buffers of `kept` already counted in `kept_bytes`.
    kept_buffers: HashSet<usize>,
    keep_limit: u64,
    added_overflow: Option<Spill>,
    /// Several parts: each side's rows in arrival order (the removed side: only rows of parts not resident), and per
    /// part the fingerprints of each side.
    sides: [SideSpill; 2],
    /// Several parts: parts `0..resident` match in `matcher` as rows arrive; `resident_rows[i]` is the added row
    /// number of the matcher's row `i`.
    resident: u64,
    resident_rows: Vec<u32>,
    /// Several parts, once [`CarryOver::release_resident`] ran: per side, sorted lists of the rows that survive,
    /// one per part matched (and one for the resident parts' added rows).
    survivors: Option<[Vec<RowList>; 2]>,
    stats: CarryStats,
}

/// Several parts: one side's rows and its partitioned fingerprints.
#[derive(Default)]
struct SideSpill {
    rows: Option<Spill>,
    count: u64,
    parts: Vec<Option<FpFile>>,
}

impl CarryOver {
    /// `added_upper`: an upper bound on the added rows (manifest record counts); `share`: the bytes this group may
    /// hold; `recycled`: a matcher an earlier group handed back, whose memory is reused (see [`Finished`]).
    /// Fails when no plan fits the share ([`CarryOver::parts_for`]; the scan checks every group before reading).
    pub(crate) fn new(schema: SchemaRef, added_upper: u64, share: u64, spill_dir: &Path, recycled: Option<Matcher>) -> Result<Self> {
        let Some(parts) = Self::parts_for(added_upper, share) else {
            return Err(Error::Internal(format!("carry-over of {added_upper} added rows planned with a share of {share} bytes, which no plan fits")));
        };
        let resident = if parts == 1 { 0 } else { Self::resident_for(added_upper, share, parts) };
        Ok(Self::with_parts(schema, added_upper, share, spill_dir, recycled, parts, resident))
    }

    /// [`CarryOver::new`] with the parts and resident parts given (tests force them).
    fn with_parts(schema: SchemaRef, added_upper: u64, share: u64, spill_dir: &Path, recycled: Option<Matcher>, parts: u64, resident: u64) -> Self {
        let rows_per_part = added_upper.div_ceil(parts) as usize;
        let side = || SideSpill { rows: None, count: 0, parts: (0..parts).map(|_| None).collect() };
        // several parts: the matcher holds the resident parts first; each other part's is sized when it is handled
        let first = if parts == 1 { rows_per_part } else { rows_per_part * resident as usize };
        CarryOver {
            schemas: [schema.clone(), schema],
            spill_dir: spill_dir.to_path_buf(),
            parts,
            rows_per_part,
            matcher: match recycled {
                Some(mut m) => {
                    m.reset(first);
                    m
                }
                None => Matcher::with_capacity(first),
            },
            kept: Vec::new(),
            kept_bytes: 0,
            kept_buffers: HashSet::new(),
            // the rows kept get what the matcher leaves of the share
            keep_limit: if parts == 1 { share.saturating_sub(Matcher::bytes_for(added_upper)) } else { 0 },
            added_overflow: None,
            sides: [side(), side()],
            resident,
            resident_rows: Vec::with_capacity(if parts == 1 { 0 } else { first }),
            survivors: None,
            stats: CarryStats { parts, resident_parts: resident, ..Default::default() },
        }
    }

    /// The rows that come first (the ones [`CarryOver::add`] takes) are in `schema` (slim removed rows, see
    /// [`super::slim`]; the caller then adds the removed rows first and swaps the sides of what is emitted).
    pub(crate) fn with_first_schema(mut self, schema: SchemaRef) -> Self {
        self.schemas[Side::Added as usize] = schema;
        self
    }

    /// With several parts: how many of them stay resident (see the module header). What the share must hold beside
    /// them: the other parts' file buffers (two a part), and, once the resident parts are done, a part's matcher and
    /// the survivor lists' read buffers — in the same memory. A resident added row costs its matcher entry and its
    /// number.
    fn resident_for(added_upper: u64, share: u64, parts: u64) -> u64 {
        // the largest r that fits (a resident part costs more than the file buffers it saves)
        let (mut lo, mut hi) = (0, parts - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if Self::resident_for_fits(added_upper, share, parts, mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Whether `r` resident parts of `parts` fit the share (see [`CarryOver::resident_for`]).
    fn resident_for_fits(added_upper: u64, share: u64, parts: u64, r: u64) -> bool {
        let per_part = added_upper.div_ceil(parts);
        if per_part * r >= MAX_MATCHER_ROWS {
            return false;
        }
        let resident_bytes = Matcher::bytes_for(per_part * r) + per_part * r * 4;
        let part_bytes = Matcher::bytes_for(per_part) + per_part * 4 + parts * LIST_BUFFER as u64;
        resident_bytes.max(part_bytes) + (parts - r) * 2 * FP_BUFFER as u64 <= share
    }

    /// The parts a carry-over of these arguments to [`CarryOver::new`] uses: one whenever the added rows' matcher
    /// fits the share (the rows it leaves no room for spill, the removed side streams through). Else enough parts
    /// that each part's matcher fits the share, and more, up to [`PART_MATCHER_BYTES`]
    /// a part, while the parts' file buffers take at most a quarter of the share: a part's lookups then mostly hit
    /// the cache (at 100 M rows, parts as large as the share spent 13 % of a sync in cache misses).
    ///
    /// `None` when no plan fits: parts small enough for the share are so many that their file buffers would pass it
    /// by more than [`BUFFER_SLACK`] (from about 14 rows a side per byte of share). The scan reports that with the
    /// budget that would do ([`CarryOver::least_share`]) before it reads anything.
    pub(crate) fn parts_for(added_upper: u64, share: u64) -> Option<u64> {
        if Matcher::bytes_for(added_upper) <= share && added_upper < MAX_MATCHER_ROWS {
            return Some(1);
        }
        // a part's matcher maps its rows back to their numbers (4 bytes a row)
        let room = share;
        let most = (share / 4 / (2 * FP_BUFFER as u64)).max(2);
        let rows = |parts: u64| added_upper.div_ceil(parts);
        let part_bytes = |parts: u64| Matcher::bytes_for(rows(parts)) + rows(parts) * 4;
        let fits =
            |parts: u64| part_bytes(parts) <= room && rows(parts) < MAX_MATCHER_ROWS && (part_bytes(parts) <= PART_MATCHER_BYTES || parts >= most);
        let mut parts = (added_upper * 20 / room.min(PART_MATCHER_BYTES)).clamp(2, most); // a part holds more than 20 bytes a row
        while !fits(parts) {
            parts += 1;
            // every further part adds two file buffers and a survivor list's: past this, more parts only need more memory
            if parts * (2 * FP_BUFFER + LIST_BUFFER) as u64 > room + BUFFER_SLACK || parts > added_upper.max(2) {
                return None;
            }
        }
        Some(parts)
    }

    /// The least share with which [`CarryOver::parts_for`] finds a plan for `added_upper` added rows.
    pub(crate) fn least_share(added_upper: u64) -> u64 {
        least_bytes(|share| Self::parts_for(added_upper, share).is_some())
    }

    /// An added row batch with its fingerprints (all adds come before the first remove).
    pub(crate) fn add(&mut self, batch: RecordBatch, fps: Vec<u128>) -> Result<()> {
        if self.parts > 1 {
            return self.split(Side::Added, &batch, &fps);
        }
        self.matcher.add(&fps);
        let bytes = unseen_bytes(&mut self.kept_buffers, &batch);
        if self.added_overflow.is_none() && self.kept_bytes + bytes <= self.keep_limit {
            self.kept_bytes += bytes;
            self.kept.push(batch);
            return Ok(());
        }
        let spill = match &mut self.added_overflow {
            Some(s) => s,
            None => self.added_overflow.insert(Spill::create(&self.spill_dir, &self.schemas[Side::Added as usize])?),
        };
        spill.write(&batch)
    }

    /// A removed row batch with its fingerprints; with one part the rows no added row cancels are emitted now.
    pub(crate) fn remove(&mut self, batch: RecordBatch, fps: Vec<u128>, emit: &mut Emit<'_>) -> Result<()> {
        if self.parts == 1 {
            return self.cancel(&batch, &fps, emit);
        }
        if self.resident == 0 {
            return self.split(Side::Removed, &batch, &fps);
        }
        // rows of resident parts are decided now; only the others go to disk
        let resident: Vec<bool> = fps.iter().map(|fp| Self::part_in(*fp, self.parts) < self.resident).collect();
        let resident_fps: Vec<u128> = fps.iter().zip(&resident).filter(|(_, r)| **r).map(|(fp, _)| *fp).collect();
        let (keep, cancelled) = self.matcher.cancel(&resident_fps);
        self.stats.cancelled += cancelled;
        let mut keep = keep.into_iter();
        let emitted: Vec<bool> = resident.iter().map(|r| *r && keep.next().expect("a decision per resident row")).collect();
        emit_masked(emit, Side::Removed, &batch, emitted, &self.schemas[Side::Removed as usize])?;
        if resident.iter().all(|r| *r) {
            return Ok(());
        }
        let spilled = resident.iter().map(|r| !r).collect::<Vec<_>>();
        let fps: Vec<u128> = fps.iter().zip(&spilled).filter(|(_, s)| **s).map(|(fp, _)| *fp).collect();
        let batch = if spilled.iter().all(|s| *s) { batch } else { arrow_select::filter::filter_record_batch(&batch, &BooleanArray::from(spilled))? };
        self.split(Side::Removed, &batch, &fps)
    }

    /// Emits what is left: the added rows no removed row cancelled (one part), or every part's survivors.
    pub(crate) fn finish(mut self, emit: &mut Emit<'_>) -> Result<Finished> {
        if self.parts == 1 {
            for batch in std::mem::take(&mut self.kept) {
                let keep = self.matcher.survivors(batch.num_rows());
                emit_masked(emit, Side::Added, &batch, keep, &self.schemas[Side::Added as usize])?;
            }
            if let Some(spill) = self.added_overflow.take() {
                self.drain(spill, emit)?;
            }
            return Ok(Finished { stats: self.stats, matcher: self.matcher });
        }
        // match part by part on fingerprints alone, listing the surviving rows of both sides
        self.release_resident()?;
        let [removed, added] = std::mem::take(&mut self.sides);
        let mut lists = self.survivors.take().expect("release_resident starts the survivor lists");
        let mut numbers: Vec<u32> = Vec::with_capacity(self.rows_per_part);
        let resident = self.resident as usize;
        for (a, r) in added.parts.into_iter().zip(removed.parts).skip(resident) {
            self.stats.spilled_bytes += a.as_ref().map_or(0, |f| f.bytes) + r.as_ref().map_or(0, |f| f.bytes);
            // sized up front: growing a part's table would rehash it several times
            self.matcher.reset(self.rows_per_part);
            numbers.clear();
            if let Some(mut a) = a {
                a.for_each(|fps, rows| {
                    self.matcher.add(fps);
                    numbers.extend_from_slice(rows);
                })?;
            }
            if let Some(mut r) = r {
                let mut list = RowList::create(&self.spill_dir)?;
                let (matcher, stats) = (&mut self.matcher, &mut self.stats);
                let mut failed = None;
                r.for_each(|fps, rows| {
                    let (keep, cancelled) = matcher.cancel(fps);
                    stats.cancelled += cancelled;
                    for (row, _) in rows.iter().zip(keep).filter(|(_, k)| *k) {
                        if let Err(e) = list.push(*row) {
                            failed.get_or_insert(e);
                        }
                    }
                })?;
                failed.map_or(Ok(()), Err)?;
                lists[0].push(list);
            }
            let keep = self.matcher.survivors(numbers.len());
            let mut list = RowList::create(&self.spill_dir)?;
            for (row, _) in numbers.iter().zip(keep).filter(|(_, k)| *k) {
                list.push(*row)?;
            }
            lists[1].push(list);
        }
        // then each side's rows once, in the order they were spilled, the survivors picked by merging the lists
        let [removed_lists, added_lists] = lists;
        for (side, spill, lists) in [(Side::Removed, removed.rows, removed_lists), (Side::Added, added.rows, added_lists)] {
            let mut next = RowMerge::new(lists)?;
            let Some(mut spill) = spill else { continue };
            let mut at = 0u64;
            for b in spill.read(None)? {
                let b = b?;
                let end = at + b.num_rows() as u64;
                let mut keep = vec![false; b.num_rows()];
                while let Some(row) = next.peek().filter(|r| (*r as u64) < end) {
                    keep[(row as u64 - at) as usize] = true;
                    next.advance()?;
                }
                at = end;
                emit_masked(emit, side, &b, keep, &self.schemas[side as usize])?;
            }
            self.stats.spilled_bytes += spill.bytes()? + next.bytes;
        }
        Ok(Finished { stats: self.stats, matcher: self.matcher })
    }

    /// Several parts, after the last removed row: lists the resident parts' surviving added rows and shrinks the
    /// matcher to one part's size, so that from here on this group holds little memory (the other parts are matched
    /// from disk, a part at a time). Nothing with one part (false: the group still holds its share until `finish`
    /// ends).
    pub(crate) fn release_resident(&mut self) -> Result<bool> {
        if self.parts == 1 {
            return Ok(false);
        }
        if self.survivors.is_some() {
            return Ok(true);
        }
        let mut list = RowList::create(&self.spill_dir)?;
        let keep = self.matcher.survivors(self.resident_rows.len());
        for (row, _) in self.resident_rows.iter().zip(keep).filter(|(_, k)| *k) {
            list.push(*row)?;
        }
        self.resident_rows = Vec::new();
        self.matcher.shrink(self.rows_per_part);
        self.survivors = Some([Vec::new(), vec![list]]);
        Ok(true)
    }

    /// Emits the removed rows of `batch` that no added row cancels.
    fn cancel(&mut self, batch: &RecordBatch, fps: &[u128], emit: &mut Emit<'_>) -> Result<()> {
        let (keep, cancelled) = self.matcher.cancel(fps);
        self.stats.cancelled += cancelled;
        emit_masked(emit, Side::Removed, batch, keep, &self.schemas[Side::Removed as usize])
    }

    /// Streams the added rows that overflowed to disk back (in the order they were added, which is how the matcher
    /// knows them), emitting the survivors.
    fn drain(&mut self, mut spill: Spill, emit: &mut Emit<'_>) -> Result<()> {
        for b in spill.read(None)? {
            let b = b?;
            let keep = self.matcher.survivors(b.num_rows());
            emit_masked(emit, Side::Added, &b, keep, &self.schemas[Side::Added as usize])?;
        }
        self.stats.spilled_bytes += spill.bytes()?;
        Ok(())
    }

    /// Several parts: appends `batch` to its side's row spill and its fingerprints, numbered, to their parts' files.
    fn split(&mut self, side: Side, batch: &RecordBatch, fps: &[u128]) -> Result<()> {
        let parts = self.parts;
        let dir = self.spill_dir.clone();
        let s = &mut self.sides[side as usize];
        let rows = match &mut s.rows {
            Some(r) => r,
            None => s.rows.insert(Spill::create(&dir, &self.schemas[side as usize])?),
        };
        rows.write(batch)?;
        let first = s.count;
        s.count += batch.num_rows() as u64;
        if u32::try_from(s.count).is_err() {
            return Err(Error::Internal(format!(
                "a copy-on-write rewrite of one partition group has more than 2^32 {side:?} rows; carry-over numbers rows with 32 bits"
            )));
        }
        let mut resident = Vec::new();
        for (i, fp) in fps.iter().enumerate() {
            let row = (first + i as u64) as u32;
            let part = Self::part_in(*fp, parts);
            if part < self.resident {
                // only added rows get here: removed rows of resident parts were decided by `remove`
                resident.push(*fp);
                self.resident_rows.push(row);
                continue;
            }
            let part = part as usize;
            let file = match &mut s.parts[part] {
                Some(f) => f,
                None => s.parts[part].insert(FpFile::create(&dir)?),
            };
            file.push(*fp, row)?;
        }
        if !resident.is_empty() {
            self.matcher.add(&resident);
        }
        Ok(())
    }

    /// A fingerprint's part of `parts`. The matcher indexes by the low half, so parts go by the high half
    /// (multiply-shift onto 0..parts; it is a hash already), and each part's table still spreads.
    fn part_in(fp: u128, parts: u64) -> u64 {
        (((fp >> 64) * parts as u128) >> 64) as u64
    }
}

fn emit_masked(emit: &mut Emit<'_>, side: Side, batch: &RecordBatch, keep: Vec<bool>, schema: &SchemaRef) -> Result<()> {
    if keep.iter().all(|k| !*k) {
        return Ok(());
    }
    let b = if keep.iter().all(|k| *k) { batch.clone() } else { arrow_select::filter::filter_record_batch(batch, &BooleanArray::from(keep))? };
    emit(side, canonical(b, schema)?)
}

/// `batch` with the types of `schema`: string and binary views (how carry-over reads files without deletes) become
/// plain strings and binaries again — only for the rows that leave carry-over, or go to a spill file, where a view
/// would write the whole dictionary page it points into with every batch.
fn canonical(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields().iter().zip(schema.fields()).all(|(a, b)| a.data_type() == b.data_type()) {
        return Ok(batch);
    }
    let cols = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| if c.data_type() == f.data_type() { Ok(c.clone()) } else { arrow_cast::cast(c, f.data_type()) })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// The bytes of `batch` not counted before: a buffer several batches share (the dictionary pages string views point
/// into) counts once.
fn unseen_bytes(seen: &mut HashSet<usize>, batch: &RecordBatch) -> u64 {
    fn walk(d: &ArrayData, seen: &mut HashSet<usize>, total: &mut u64) {
        let nulls = d.nulls().map(|n| n.buffer());
        for b in d.buffers().iter().chain(nulls) {
            if seen.insert(b.as_ptr() as usize) {
                *total += b.capacity() as u64;
            }
        }
        d.child_data().iter().for_each(|c| walk(c, seen, total));
    }
    let mut total = 0;
    batch.columns().iter().for_each(|c| walk(&c.to_data(), seen, &mut total));
    total
}

/// The least number of bytes for which `enough` holds, given that it holds from some number on: doubling from 1 MiB,
/// then bisecting (`u64::MAX` when it never does).
pub(crate) fn least_bytes(enough: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (1u64, 1u64 << 20);
    while !enough(hi) {
        if hi == u64::MAX {
            return hi;
        }
        (lo, hi) = (hi, hi.saturating_mul(2));
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if enough(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// Surviving row numbers of one side, ascending, as little-endian u32 in a local file (deleted when dropped). A
/// part's survivors come in row order because its fingerprint files hold its rows in the order they arrived.
struct RowList {
    tmp: tempfile::NamedTempFile,
    file: Option<std::io::BufWriter<File>>,
    rows: u64,
}

impl RowList {
    fn create(dir: &Path) -> Result<Self> {
        let tmp = tempfile::Builder::new().prefix("cdc-carry-rows-").tempfile_in(dir).map_err(|e| Error::spill(dir, e))?;
        let file = std::io::BufWriter::with_capacity(LIST_BUFFER, tmp.reopen().map_err(|e| Error::spill(dir, e))?);
        Ok(RowList { tmp, file: Some(file), rows: 0 })
    }
    fn push(&mut self, row: u32) -> Result<()> {
        let f = self.file.as_mut().expect("rows listed before they are read");
        f.write_all(&row.to_le_bytes()).map_err(|e| Error::spill(self.tmp.path(), e))?;
        self.rows += 1;
        Ok(())
    }
}

/// Bytes a survivor list buffers while written or read.
const LIST_BUFFER: usize = 4 << 10;

/// The rows of several ascending [`RowList`]s in one ascending sequence (a heap over the lists' heads; the lists
/// are disjoint: every row is in one part).
struct RowMerge {
    readers: Vec<(BufReader<File>, u64, tempfile::NamedTempFile)>,
    heads: std::collections::BinaryHeap<std::cmp::Reverse<(u32, usize)>>,
    /// Bytes the lists took on disk.
    bytes: u64,
}

impl RowMerge {
    fn new(lists: Vec<RowList>) -> Result<Self> {
        let mut m = RowMerge { readers: Vec::new(), heads: Default::default(), bytes: 0 };
        for mut l in lists.into_iter().filter(|l| l.rows > 0) {
            let path = l.tmp.path().to_path_buf();
            if let Some(f) = l.file.take() {
                f.into_inner().map_err(|e| Error::spill(&path, e.into_error()))?;
            }
            m.bytes += l.rows * 4;
            let r = BufReader::with_capacity(LIST_BUFFER, File::open(&path).map_err(|e| Error::spill(&path, e))?);
            m.readers.push((r, l.rows, l.tmp));
            let i = m.readers.len() - 1;
            m.pull(i)?;
        }
        Ok(m)
    }
    /// Moves list `i`'s next row onto the heap.
    fn pull(&mut self, i: usize) -> Result<()> {
        let (r, left, tmp) = &mut self.readers[i];
        if *left == 0 {
            return Ok(());
        }
        let mut b = [0u8; 4];
        r.read_exact(&mut b).map_err(|e| Error::spill(tmp.path(), e))?;
        *left -= 1;
        self.heads.push(std::cmp::Reverse((u32::from_le_bytes(b), i)));
        Ok(())
    }
    fn peek(&self) -> Option<u32> {
        self.heads.peek().map(|h| h.0 .0)
    }
    fn advance(&mut self) -> Result<()> {
        if let Some(std::cmp::Reverse((_, i))) = self.heads.pop() {
            self.pull(i)?;
        }
        Ok(())
    }
}

/// A part's fingerprints of one side with their rows' numbers, as fixed-size little-endian entries in a local file
/// (deleted when dropped).
struct FpFile {
    tmp: tempfile::NamedTempFile,
    file: Option<File>,
    /// Entries not yet written.
    buf: Vec<u8>,
    bytes: u64,
}

/// Bytes of entries a part's file collects before writing them.
const FP_BUFFER: usize = 64 << 10;

impl FpFile {
    fn create(dir: &Path) -> Result<Self> {
        let tmp = tempfile::Builder::new().prefix("cdc-carry-fp-").tempfile_in(dir).map_err(|e| Error::spill(dir, e))?;
        let file = tmp.reopen().map_err(|e| Error::spill(dir, e))?;
        Ok(FpFile { tmp, file: Some(file), buf: Vec::with_capacity(FP_BUFFER), bytes: 0 })
    }
    #[inline]
    fn push(&mut self, fp: u128, row: u32) -> Result<()> {
        self.buf.extend_from_slice(&fp.to_le_bytes());
        self.buf.extend_from_slice(&row.to_le_bytes());
        self.bytes += ENTRY_BYTES as u64;
        if self.buf.len() >= FP_BUFFER {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        let f = self.file.as_mut().expect("fingerprints written before they are read");
        f.write_all(&self.buf).map_err(|e| Error::spill(self.tmp.path(), e))?;
        self.buf.clear();
        Ok(())
    }
    /// Finishes writing and hands the entries back in order, in chunks: (fingerprints, row numbers).
    fn for_each(&mut self, mut f: impl FnMut(&[u128], &[u32])) -> Result<()> {
        if self.file.is_some() {
            self.flush()?;
            self.file = None;
            self.buf = Vec::new();
        }
        let err = |e| Error::spill(self.tmp.path(), e);
        let mut r = BufReader::with_capacity(ENTRY_BYTES * ENTRIES_PER_READ, File::open(self.tmp.path()).map_err(err)?);
        let mut buf = vec![0u8; ENTRY_BYTES * ENTRIES_PER_READ];
        let (mut fps, mut rows) = (Vec::with_capacity(ENTRIES_PER_READ), Vec::with_capacity(ENTRIES_PER_READ));
        let mut left = self.bytes as usize;
        while left > 0 {
            let n = left.min(buf.len());
            r.read_exact(&mut buf[..n]).map_err(err)?;
            left -= n;
            fps.clear();
            rows.clear();
            for e in buf[..n].chunks_exact(ENTRY_BYTES) {
                fps.push(u128::from_le_bytes(e[..16].try_into().expect("16 bytes")));
                rows.push(u32::from_le_bytes(e[16..].try_into().expect("4 bytes")));
            }
            f(&fps, &rows);
        }
        Ok(())
    }
}

/// A local Arrow IPC file written once and read back (deleted when dropped).
struct Spill {
    tmp: tempfile::NamedTempFile,
    writer: Option<FileWriter<File>>,
    schema: SchemaRef,
}

impl Spill {
    fn create(dir: &Path, schema: &SchemaRef) -> Result<Self> {
        let tmp = tempfile::Builder::new().prefix("cdc-carry-").suffix(".arrow").tempfile_in(dir).map_err(|e| Error::spill(dir, e))?;
        let writer = FileWriter::try_new(tmp.reopen().map_err(|e| Error::spill(dir, e))?, schema).map_err(|e| Error::spill(tmp.path(), e))?;
        Ok(Spill { tmp, writer: Some(writer), schema: schema.clone() })
    }
    fn write(&mut self, b: &RecordBatch) -> Result<()> {
        let b = canonical(b.clone(), &self.schema)?;
        self.writer.as_mut().expect("spill written before it is read").write(&b).map_err(|e| Error::spill(self.tmp.path(), e))?;
        Ok(())
    }
    fn bytes(&self) -> Result<u64> {
        Ok(self.tmp.as_file().metadata().map_err(|e| Error::spill(self.tmp.path(), e))?.len())
    }
    /// Finishes writing (once) and reads the batches back, only the columns `projection` names when given.
    fn read(&mut self, projection: Option<Vec<usize>>) -> Result<impl Iterator<Item = Result<RecordBatch>> + use<>> {
        if let Some(mut w) = self.writer.take() {
            w.finish().map_err(|e| Error::spill(self.tmp.path(), e))?;
        }
        let path = self.tmp.path().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::spill(&path, e))?;
        Ok(FileReader::try_new(file, projection).map_err(|e| Error::spill(&path, e))?.map(move |b| b.map_err(|e| Error::spill(&path, e))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::fingerprint::Fingerprinter;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]))
    }

    fn batch(rows: &[(i64, &str)]) -> RecordBatch {
        let ids = Int64Array::from_iter_values(rows.iter().map(|r| r.0));
        let vs = StringArray::from_iter_values(rows.iter().map(|r| r.1));
        RecordBatch::try_new(schema(), vec![Arc::new(ids), Arc::new(vs)]).unwrap()
    }

    /// Runs the protocol over `removed`/`added` in batches of 100 and returns the surviving (side, id, value) rows.
    /// `views`: the (removed, added) batches arrive with their strings as views, as the reader gives them.
    fn run_with(removed: &[(i64, &str)], added: &[(i64, &str)], share: u64, views: (bool, bool)) -> (Vec<(Side, i64, String)>, CarryStats) {
        run_planned(removed, added, share, views, None)
    }

    /// [`run_with`], with `(parts, resident)` forced when given.
    fn run_planned(
        removed: &[(i64, &str)],
        added: &[(i64, &str)],
        share: u64,
        views: (bool, bool),
        plan: Option<(u64, u64)>,
    ) -> (Vec<(Side, i64, String)>, CarryStats) {
        let read = |rows: &[(i64, &str)], view: bool| {
            let b = batch(rows);
            if !view {
                return b;
            }
            let s = crate::source::reader::view_types(&schema());
            let cols = vec![b.column(0).clone(), arrow_cast::cast(b.column(1), &DataType::Utf8View).unwrap()];
            RecordBatch::try_new(s, cols).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let fp = Fingerprinter::new(&schema()).unwrap();
        let upper = added.len() as u64;
        let mut c = match plan {
            None => CarryOver::new(schema(), upper, share, dir.path(), None).unwrap(),
            Some((parts, resident)) => CarryOver::with_parts(schema(), upper, share, dir.path(), None, parts, resident),
        };
        let mut out = Vec::new();
        let mut emit = |side: Side, b: RecordBatch| -> Result<()> {
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let vs = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            out.extend((0..b.num_rows()).map(|i| (side, ids.value(i), vs.value(i).to_string())));
            Ok(())
        };
        for chunk in added.chunks(100) {
            let b = read(chunk, views.1);
            let fps = fp.fingerprints(&b).unwrap();
            c.add(b, fps).unwrap();
        }
        for chunk in removed.chunks(100) {
            let b = read(chunk, views.0);
            let fps = fp.fingerprints(&b).unwrap();
            c.remove(b, fps, &mut emit).unwrap();
        }
        // as the worker does when groups take turns: the resident matches marked and the matcher shrunk first
        let (parts, released) = (c.parts, c.release_resident().unwrap());
        assert_eq!(released, parts > 1);
        let stats = c.finish(&mut emit).unwrap().stats;
        out.sort_by(|a, b| (a.1, a.0, &a.2).cmp(&(b.1, b.0, &b.2)));
        // spill files are gone with the carry-over
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        (out, stats)
    }

    /// [`run_planned`] the way a sink that reads only the key of removed rows has it ([`crate::source::slim`]): the
    /// removed rows first, held without their value, the added rows streaming through, the emitted sides swapped
    /// back and the removed rows given a placeholder (an empty string here) for what they were not carried with.
    fn run_slim(removed: &[(i64, &str)], added: &[(i64, &str)], share: u64, plan: Option<(u64, u64)>) -> (Vec<(Side, i64, String)>, CarryStats) {
        let slim = crate::source::slim::Slim::new(&schema(), &[0], &[]).expect("the value is dropped");
        let dir = tempfile::tempdir().unwrap();
        let fp = Fingerprinter::new(&schema()).unwrap();
        let upper = removed.len() as u64;
        let c = match plan {
            None => CarryOver::new(schema(), upper, share, dir.path(), None).unwrap(),
            Some((parts, resident)) => CarryOver::with_parts(schema(), upper, share, dir.path(), None, parts, resident),
        };
        let mut c = c.with_first_schema(slim.schema().clone());
        let mut out = Vec::new();
        let mut emit = |side: Side, b: RecordBatch| -> Result<()> {
            let (side, b) = slim.restore(side, b)?;
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let vs = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            out.extend((0..b.num_rows()).map(|i| (side, ids.value(i), if vs.is_null(i) { "<null>".to_string() } else { vs.value(i).to_string() })));
            Ok(())
        };
        for chunk in removed.chunks(100) {
            let b = batch(chunk);
            let fps = fp.fingerprints(&b).unwrap();
            c.add(slim.slim(&b).unwrap(), fps).unwrap();
        }
        for chunk in added.chunks(100) {
            let b = batch(chunk);
            let fps = fp.fingerprints(&b).unwrap();
            c.remove(b, fps, &mut emit).unwrap();
        }
        c.release_resident().unwrap();
        let stats = c.finish(&mut emit).unwrap().stats;
        out.sort_by(|a, b| (a.1, a.0, &a.2).cmp(&(b.1, b.0, &b.2)));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        (out, stats)
    }

    fn run(removed: &[(i64, &str)], added: &[(i64, &str)], share: u64) -> (Vec<(Side, i64, String)>, CarryStats) {
        run_with(removed, added, share, (false, false))
    }

    /// Resident parts fill the share: none when it holds nothing beside the parts' buffers, most when it nearly
    /// holds every part, and what they and the rest hold stays within the share.
    #[test]
    fn resident_parts_fill_the_share() {
        // a 100 M-row partition group (6.4 M added rows) at two groups per 256 MiB budget, and at one
        let upper = 6_375_000;
        for share in [54u64 << 20, 108 << 20] {
            let parts = CarryOver::parts_for(upper, share).unwrap();
            let r = CarryOver::resident_for(upper, share, parts);
            assert!(parts > 1 && r > 0 && r < parts, "{share}: {r} of {parts}");
            assert!(!CarryOver::resident_for_fits(upper, share, parts, r + 1));
            assert!(CarryOver::resident_for_fits(upper, share, parts, r));
        }
        let (half, full) = (54u64 << 20, 108 << 20);
        let parts = |share| CarryOver::parts_for(upper, share).unwrap();
        let frac = |share| CarryOver::resident_for(upper, share, parts(share)) as f64 / parts(share) as f64;
        assert!(frac(half) > 0.25 && frac(full) > 0.7 && frac(full) < 1.0, "{} {}", frac(half), frac(full));
        // a share that only holds the parts' buffers
        assert_eq!(CarryOver::resident_for(upper, 4 << 20, parts(4 << 20)), 0);
    }

    /// A group too large for the share has no plan, found at once (not by counting parts up to its rows); the least
    /// share that has one is what its parts need, and a plan made with it fits it. A billion rows plan within the
    /// default budget's share: what a group needs no longer grows with its rows, only a part's matcher does.
    #[test]
    fn a_group_too_large_for_its_share_has_no_plan() {
        let share = 108u64 << 20;
        assert!(CarryOver::parts_for(1_000_000_000, share).is_some_and(|p| p > 1));
        for rows in [6_000_000_000u64, 20_000_000_000] {
            let t = std::time::Instant::now();
            assert_eq!(CarryOver::parts_for(rows, share), None, "{rows}");
            assert!(t.elapsed() < std::time::Duration::from_secs(1), "{rows}: {:?}", t.elapsed());
            let least = CarryOver::least_share(rows);
            let parts = CarryOver::parts_for(rows, least).expect("the least share has a plan");
            // what the plan holds: a part's matcher and numbers; its parts' file and list buffers, within the slack
            let per_part = rows.div_ceil(parts);
            assert!(per_part < MAX_MATCHER_ROWS);
            assert!(Matcher::bytes_for(per_part) + per_part * 4 <= least, "{rows}: {parts} parts at {least}");
            assert!(parts * (2 * FP_BUFFER + LIST_BUFFER) as u64 <= least + BUFFER_SLACK, "{rows}: {parts} parts at {least}");
            assert!(least < rows / 10, "{rows}: {least} bytes");
        }
        // the 100 M-row case's groups (6.4 M added rows) still plan in parts, and a small group in one
        assert!(CarryOver::parts_for(6_375_000, share).is_some_and(|p| p > 1));
        assert_eq!(CarryOver::parts_for(100_000, share), Some(1));
        // more rows than a matcher numbers are never one part, whatever the share
        assert_ne!(CarryOver::parts_for(MAX_MATCHER_ROWS, u64::MAX / 4), Some(1));
    }

    #[test]
    fn only_real_changes_survive_in_memory_with_overflow_and_in_parts() {
        let names: Vec<String> = (0..3000).map(|i| format!("v{i}-{}", "x".repeat(200))).collect();
        let removed: Vec<(i64, &str)> = (0..3000).map(|i| (i as i64, names[i].as_str())).collect();
        // rewrite: every 10th row changed, every 50th (offset 1) deleted, 30 new rows, one row duplicated
        let mut added: Vec<(i64, &str)> =
            removed.iter().filter(|r| r.0 % 50 != 1).map(|r| if r.0 % 10 == 0 { (r.0, "changed") } else { *r }).collect();
        added.extend((5000..5030).map(|i| (i, "new")));
        added.push(removed[7]);
        let mut expected = Vec::new();
        for r in &removed {
            if r.0 % 10 == 0 || r.0 % 50 == 1 {
                expected.push((Side::Removed, r.0, r.1.to_string()));
            }
            if r.0 % 10 == 0 {
                expected.push((Side::Added, r.0, "changed".to_string()));
            }
        }
        expected.extend((5000..5030).map(|i| (Side::Added, i, "new".to_string())));
        expected.push((Side::Added, 7, names[7].clone()));
        expected.sort_by(|a, b| (a.1, a.0, &a.2).cmp(&(b.1, b.0, &b.2)));

        // everything in memory
        let (got, st) = run(&removed, &added, 64 << 20);
        assert_eq!((st.parts, st.spilled_bytes), (1, 0));
        assert_eq!(got, expected);
        assert_eq!(st.cancelled, 3000 - 300 - 60);
        // fingerprints fit, rows overflow to a spill file
        let (got, st) = run(&removed, &added, 2 * Matcher::bytes_for(3100));
        assert_eq!(st.parts, 1);
        assert!(st.spilled_bytes > 0);
        assert_eq!(got, expected);
        // fingerprints split into parts
        let (got, st) = run(&removed, &added, Matcher::bytes_for(500));
        assert!(st.parts >= 6, "{st:?}");
        assert!(st.spilled_bytes > 0);
        assert_eq!(got, expected);
        // some parts resident: the same changes, and less spilled than with none; all but one resident, and one
        // part resident of many (the removed rows of resident parts never reach a file)
        let (_, none) = run_planned(&removed, &added, 0, (false, false), Some((8, 0)));
        for (parts, resident) in [(8, 3), (8, 7), (30, 1)] {
            let (got, st) = run_planned(&removed, &added, 0, (false, false), Some((parts, resident)));
            assert_eq!(got, expected, "{parts} parts, {resident} resident");
            assert_eq!((st.cancelled, st.resident_parts), (3000 - 300 - 60, resident));
            assert!(st.spilled_bytes < none.spilled_bytes, "{parts}/{resident}: {} vs {}", st.spilled_bytes, none.spilled_bytes);
        }
        // slim removed rows taken first: the same pairs cancel and the same rows survive, the removed ones without
        // their value; what is held or spilled is a fraction of the rows (in memory: nothing overflows where whole
        // added rows did)
        let slim_expected: Vec<_> =
            expected.iter().map(|(side, id, v)| (*side, *id, if *side == Side::Removed { String::new() } else { v.clone() })).collect();
        let overflowing = 2 * Matcher::bytes_for(3100);
        for (share, plan) in [(64 << 20, None), (overflowing, None), (Matcher::bytes_for(500), None), (0, Some((8, 3))), (0, Some((8, 0)))] {
            let (got, st) = run_slim(&removed, &added, share, plan);
            assert_eq!(got, slim_expected, "{share} {plan:?}");
            assert_eq!(st.cancelled, 3000 - 300 - 60);
            let whole = match plan {
                None => run(&removed, &added, share).1,
                Some(p) => run_planned(&removed, &added, 0, (false, false), Some(p)).1,
            };
            assert!(st.spilled_bytes < whole.spilled_bytes || whole.spilled_bytes == 0, "{share} {plan:?}: {st:?} vs {whole:?}");
            if share == overflowing {
                assert_eq!(st.spilled_bytes, 0, "slim removed rows fit beside the matcher");
            }
        }
        // strings read as views on either side: the same pairs cancel and survivors leave as plain strings (the emit
        // above downcasts to StringArray), in memory, overflowing and in parts
        for share in [64 << 20, 2 * Matcher::bytes_for(3100), Matcher::bytes_for(500)] {
            for views in [(true, true), (true, false), (false, true)] {
                assert_eq!(run_with(&removed, &added, share, views).0, expected, "{share} {views:?}");
            }
        }
    }
}
