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
//! Memory is bounded by `share`, whatever the size of the group, and no data file is read twice:
//! - one part (the added rows' [`Matcher`] fits half the share): added fingerprints go into the matcher; added rows
//!   are kept in memory while they fit the rest of the share, and beyond it appended to a local spill file (Arrow
//!   IPC) that `finish` streams back in the same order (the matcher knows added rows by their order).
//! - several parts: rows of both sides are written once to per-part spill files by fingerprint (`fp % parts`, so
//!   equal rows meet in one part); `finish` then handles part by part: the part's added fingerprints into a fresh
//!   matcher (read back as a projection), its removed rows streamed (cancelling), its added rows streamed.
//!
//! [`Matcher::bytes_for`] says what the matcher of a part holds; per-part spill files carry the fingerprint as two
//! extra `UInt64` columns.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, BooleanArray, RecordBatch, UInt32Array, UInt64Array};
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::source::matcher::Matcher;
use crate::source::net::Side;

const FP_HI: &str = "__cdc_fp_hi";
const FP_LO: &str = "__cdc_fp_lo";

/// What a carry-over pass did, for the scan's statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct CarryStats {
    /// Identical removed/added pairs cancelled.
    pub cancelled: u64,
    /// Fingerprint parts (1 = everything in memory at once).
    pub parts: u64,
    /// Bytes written to local spill files (0 when everything fit).
    pub spilled_bytes: u64,
}

impl CarryStats {
    /// Adds another group's statistics (parts: the most any group needed).
    pub fn absorb(&mut self, other: CarryStats) {
        self.cancelled += other.cancelled;
        self.parts = self.parts.max(other.parts);
        self.spilled_bytes += other.spilled_bytes;
    }
}

/// Emits surviving rows to the netter (or a test).
pub(crate) type Emit<'a> = dyn FnMut(Side, RecordBatch) -> Result<()> + 'a;

/// Carry-over cancellation for one group of files; see the module header for the protocol.
pub(crate) struct CarryOver {
    schema: SchemaRef,
    spill_schema: SchemaRef,
    spill_dir: PathBuf,
    parts: u64,
    /// Added rows a part is sized for (all of them with one part).
    rows_per_part: usize,
    matcher: Matcher,
    /// One part: added rows kept in memory, and where they went once the memory left by the matcher was used up.
    kept: Vec<RecordBatch>,
    kept_bytes: u64,
    keep_limit: u64,
    added_overflow: Option<Spill>,
    /// Several parts: per-part spill files of each side.
    added_parts: Vec<Option<Spill>>,
    removed_parts: Vec<Option<Spill>>,
    stats: CarryStats,
}

impl CarryOver {
    /// `added_upper`: an upper bound on the added rows (manifest record counts); `share`: the bytes this group may hold.
    pub(crate) fn new(schema: SchemaRef, added_upper: u64, share: u64, spill_dir: &Path) -> Self {
        let half = (share / 2).max(1);
        // as many parts as it takes for each part's matcher to fit half the share
        let mut parts = (added_upper * 30 / half).max(1); // a matcher holds more than 30 bytes a row
        while Matcher::bytes_for(added_upper.div_ceil(parts)) > half && parts < added_upper.max(1) {
            parts += 1;
        }
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(FP_HI, DataType::UInt64, false));
        fields.push(Field::new(FP_LO, DataType::UInt64, false));
        let rows_per_part = added_upper.div_ceil(parts) as usize;
        CarryOver {
            spill_schema: Arc::new(Schema::new(fields)),
            schema,
            spill_dir: spill_dir.to_path_buf(),
            parts,
            rows_per_part,
            // several parts: each part's matcher is built when the part is handled
            matcher: Matcher::with_capacity(if parts == 1 { rows_per_part } else { 0 }),
            kept: Vec::new(),
            kept_bytes: 0,
            // the rows kept get what the matcher leaves of the share
            keep_limit: if parts == 1 { share.saturating_sub(Matcher::bytes_for(added_upper)) } else { 0 },
            added_overflow: None,
            added_parts: (0..parts).map(|_| None).collect(),
            removed_parts: (0..parts).map(|_| None).collect(),
            stats: CarryStats { parts, ..Default::default() },
        }
    }

    /// An added row batch with its fingerprints (all adds come before the first remove).
    pub(crate) fn add(&mut self, batch: RecordBatch, fps: Vec<u128>) -> Result<()> {
        if self.parts > 1 {
            return self.split(Side::Added, &batch, &fps);
        }
        self.matcher.add(&fps);
        let bytes = batch.get_array_memory_size() as u64;
        if self.added_overflow.is_none() && self.kept_bytes + bytes <= self.keep_limit {
            self.kept_bytes += bytes;
            self.kept.push(batch);
            return Ok(());
        }
        let spill = match &mut self.added_overflow {
            Some(s) => s,
            None => self.added_overflow.insert(Spill::create(&self.spill_dir, &self.schema)?),
        };
        spill.write(&batch)
    }

    /// A removed row batch with its fingerprints; with one part the rows no added row cancels are emitted now.
    pub(crate) fn remove(&mut self, batch: RecordBatch, fps: Vec<u128>, emit: &mut Emit<'_>) -> Result<()> {
        if self.parts > 1 {
            return self.split(Side::Removed, &batch, &fps);
        }
        self.cancel(&batch, &fps, emit)
    }

    /// Emits what is left: the added rows no removed row cancelled (one part), or every part's survivors.
    pub(crate) fn finish(mut self, emit: &mut Emit<'_>) -> Result<CarryStats> {
        if self.parts == 1 {
            for batch in std::mem::take(&mut self.kept) {
                let keep = self.matcher.survivors(batch.num_rows());
                emit_masked(emit, Side::Added, &batch, keep)?;
            }
            if let Some(spill) = self.added_overflow.take() {
                self.drain(spill, Side::Added, emit)?;
            }
            return Ok(self.stats);
        }
        let n = self.schema.fields().len();
        for part in 0..self.parts as usize {
            let mut added = self.added_parts[part].take();
            let removed = self.removed_parts[part].take();
            // sized up front: growing a part's table would rehash it several times
            self.matcher = Matcher::with_capacity(self.rows_per_part);
            if let Some(a) = &mut added {
                for b in a.read(Some(vec![n, n + 1]))? {
                    self.matcher.add(&fps_of(&b?, 0));
                }
            }
            if let Some(r) = removed {
                self.drain(r, Side::Removed, emit)?;
            }
            if let Some(a) = added {
                self.drain(a, Side::Added, emit)?;
            }
        }
        Ok(self.stats)
    }

    /// Emits the removed rows of `batch` that no added row cancels.
    fn cancel(&mut self, batch: &RecordBatch, fps: &[u128], emit: &mut Emit<'_>) -> Result<()> {
        let (keep, cancelled) = self.matcher.cancel(fps);
        self.stats.cancelled += cancelled;
        emit_masked(emit, Side::Removed, batch, keep)
    }

    /// Streams a spill file of `side` back, emitting its survivors. Added rows come back in the order they were
    /// added (the matcher knows them by that order); removed rows carry their fingerprints.
    fn drain(&mut self, mut spill: Spill, side: Side, emit: &mut Emit<'_>) -> Result<()> {
        let n = self.schema.fields().len();
        let data_only = (side == Side::Added).then(|| (0..n).collect());
        for b in spill.read(data_only)? {
            let b = b?;
            match side {
                Side::Added => {
                    let keep = self.matcher.survivors(b.num_rows());
                    let data = RecordBatch::try_new(self.schema.clone(), b.columns()[..n].to_vec())?;
                    emit_masked(emit, side, &data, keep)?;
                }
                Side::Removed => {
                    let (batch, fps) = split_fps(&self.schema, b);
                    self.cancel(&batch, &fps, emit)?;
                }
            }
        }
        self.stats.spilled_bytes += spill.bytes()?;
        Ok(())
    }

    /// Appends the rows of `batch` to their parts' spill files of `side`.
    fn split(&mut self, side: Side, batch: &RecordBatch, fps: &[u128]) -> Result<()> {
        let parts = self.parts;
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); parts as usize];
        for (i, fp) in fps.iter().enumerate() {
            // the matcher indexes by the low half: partition by the high half so each part's table still spreads
            rows[((*fp >> 64) as u64 % parts) as usize].push(i as u32);
        }
        let full = with_fps(&self.spill_schema, batch, fps)?;
        for (part, idx) in rows.into_iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let slot = match side {
                Side::Added => &mut self.added_parts[part],
                Side::Removed => &mut self.removed_parts[part],
            };
            let spill = match slot {
                Some(s) => s,
                None => slot.insert(Spill::create(&self.spill_dir, &self.spill_schema)?),
            };
            let taken =
                if idx.len() == full.num_rows() { full.clone() } else { arrow_select::take::take_record_batch(&full, &UInt32Array::from(idx))? };
            spill.write(&taken)?;
        }
        Ok(())
    }
}

fn emit_masked(emit: &mut Emit<'_>, side: Side, batch: &RecordBatch, keep: Vec<bool>) -> Result<()> {
    if keep.iter().all(|k| !*k) {
        return Ok(());
    }
    let b = if keep.iter().all(|k| *k) { batch.clone() } else { arrow_select::filter::filter_record_batch(batch, &BooleanArray::from(keep))? };
    emit(side, b)
}

/// `batch` with its fingerprints appended as two `UInt64` columns.
fn with_fps(spill_schema: &SchemaRef, batch: &RecordBatch, fps: &[u128]) -> Result<RecordBatch> {
    let mut cols = batch.columns().to_vec();
    cols.push(Arc::new(UInt64Array::from_iter_values(fps.iter().map(|f| (*f >> 64) as u64))));
    cols.push(Arc::new(UInt64Array::from_iter_values(fps.iter().map(|f| *f as u64))));
    Ok(RecordBatch::try_new(spill_schema.clone(), cols)?)
}

/// The fingerprints stored in columns `at` and `at + 1` of a spilled batch.
fn fps_of(b: &RecordBatch, at: usize) -> Vec<u128> {
    let hi = b.column(at).as_any().downcast_ref::<UInt64Array>().expect("fingerprint column");
    let lo = b.column(at + 1).as_any().downcast_ref::<UInt64Array>().expect("fingerprint column");
    hi.values().iter().zip(lo.values()).map(|(h, l)| ((*h as u128) << 64) | *l as u128).collect()
}

/// A spilled batch back as (data columns, fingerprints).
fn split_fps(schema: &SchemaRef, b: RecordBatch) -> (RecordBatch, Vec<u128>) {
    let n = schema.fields().len();
    let fps = fps_of(&b, n);
    let data = RecordBatch::try_new(schema.clone(), b.columns()[..n].to_vec()).expect("spill schema starts with the data schema");
    (data, fps)
}

/// A local Arrow IPC file written once and read back (deleted when dropped).
struct Spill {
    tmp: tempfile::NamedTempFile,
    writer: Option<FileWriter<File>>,
}

impl Spill {
    fn create(dir: &Path, schema: &SchemaRef) -> Result<Self> {
        let tmp = tempfile::Builder::new().prefix("cdc-carry-").suffix(".arrow").tempfile_in(dir).map_err(|e| spill_error(dir, e))?;
        let writer = FileWriter::try_new(tmp.reopen().map_err(|e| spill_error(dir, e))?, schema)?;
        Ok(Spill { tmp, writer: Some(writer) })
    }
    fn write(&mut self, b: &RecordBatch) -> Result<()> {
        self.writer.as_mut().expect("spill written before it is read").write(b)?;
        Ok(())
    }
    fn bytes(&self) -> Result<u64> {
        Ok(self.tmp.as_file().metadata().map_err(|e| spill_error(self.tmp.path(), e))?.len())
    }
    /// Finishes writing (once) and reads the batches back, only the columns `projection` names when given.
    fn read(&mut self, projection: Option<Vec<usize>>) -> Result<impl Iterator<Item = Result<RecordBatch>> + use<>> {
        if let Some(mut w) = self.writer.take() {
            w.finish()?;
        }
        Ok(FileReader::try_new(File::open(self.tmp.path()).map_err(|e| spill_error(self.tmp.path(), e))?, projection)?
            .map(|b| b.map_err(Error::from)))
    }
}

fn spill_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io { path: path.display().to_string(), message: format!("carry-over spill: {e}"), retryable: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::fingerprint::Fingerprinter;
    use arrow_array::{Int64Array, StringArray};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]))
    }

    fn batch(rows: &[(i64, &str)]) -> RecordBatch {
        let ids = Int64Array::from_iter_values(rows.iter().map(|r| r.0));
        let vs = StringArray::from_iter_values(rows.iter().map(|r| r.1));
        RecordBatch::try_new(schema(), vec![Arc::new(ids), Arc::new(vs)]).unwrap()
    }

    /// Runs the protocol over `removed`/`added` in batches of 100 and returns the surviving (side, id, value) rows.
    fn run(removed: &[(i64, &str)], added: &[(i64, &str)], share: u64) -> (Vec<(Side, i64, String)>, CarryStats) {
        let dir = tempfile::tempdir().unwrap();
        let fp = Fingerprinter::new(&schema()).unwrap();
        let mut c = CarryOver::new(schema(), added.len() as u64, share, dir.path());
        let mut out = Vec::new();
        let mut emit = |side: Side, b: RecordBatch| -> Result<()> {
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let vs = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            out.extend((0..b.num_rows()).map(|i| (side, ids.value(i), vs.value(i).to_string())));
            Ok(())
        };
        for chunk in added.chunks(100) {
            let b = batch(chunk);
            let fps = fp.fingerprints(&b).unwrap();
            c.add(b, fps).unwrap();
        }
        for chunk in removed.chunks(100) {
            let b = batch(chunk);
            let fps = fp.fingerprints(&b).unwrap();
            c.remove(b, fps, &mut emit).unwrap();
        }
        let stats = c.finish(&mut emit).unwrap();
        out.sort_by(|a, b| (a.1, a.0, &a.2).cmp(&(b.1, b.0, &b.2)));
        // spill files are gone with the carry-over
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        (out, stats)
    }

    #[test]
    fn only_real_changes_survive_in_memory_with_overflow_and_in_parts() {
        let names: Vec<String> = (0..3000).map(|i| format!("v{i}-{}", "x".repeat(60))).collect();
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
        let (got, st) = run(&removed, &added, 2 * Matcher::bytes_for(500));
        assert!(st.parts >= 6, "{st:?}");
        assert!(st.spilled_bytes > 0);
        assert_eq!(got, expected);
    }
}
