//! Copy-on-write carry-over: cancelling the rows a rewrite removed and re-added unchanged, in one read of each file.
//!
//! A copy-on-write commit removes whole files and adds rewritten ones; most of their rows are identical on both
//! sides. Before netting, each added row is matched against a removed row with the same 128-bit fingerprint (a hash
//! of the whole row encoding); matched pairs vanish, the rest are real changes.
//!
//! Protocol (per group of files that can share rows, see `changelog`): every added row first ([`CarryOver::add`]),
//! then every removed row ([`CarryOver::remove`], which emits the removed rows that no added row cancels), then
//! [`CarryOver::finish`] emits the added rows no removed row cancelled.
//!
//! Memory is bounded by `share`, whatever the size of the group, and no data file is read twice:
//! - one part (the fingerprints fit half the share): added fingerprints are counted in a map; added rows are kept in
//!   memory while they fit the rest of the share, and beyond it appended to a local spill file (Arrow IPC) that
//!   `finish` streams back.
//! - several parts: rows of both sides are written once to per-part spill files by fingerprint (`fp % parts`, so
//!   equal rows meet in one part); `finish` then handles part by part: count the part's added fingerprints (read
//!   back as a projection), stream its removed rows (cancelling), stream its added rows.
//!
//! A map entry costs about [`FP_ENTRY_BYTES`]; spill files carry the fingerprint as two extra `UInt64` columns.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, BooleanArray, RecordBatch, UInt32Array, UInt64Array};
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_row::RowConverter;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::source::net::Side;
use crate::spec::rowenc;

/// Bytes one fingerprint costs in the count map (16 key + 4 count, padding, control byte, load factor).
pub(crate) const FP_ENTRY_BYTES: u64 = 48;

const FP_HI: &str = "__cdc_fp_hi";
const FP_LO: &str = "__cdc_fp_lo";

/// Seeds fixed so that every read of a snapshot fingerprints a row the same way (SHA-512's initial words; not the
/// digits of pi, which ahash XORs its seeds with — those zero its keys).
const FP_SEEDS: [u64; 8] = [
    0x6a09e667f3bcc908,
    0xbb67ae8584caa73b,
    0x3c6ef372fe94f82b,
    0xa54ff53a5f1d36f1,
    0x510e527fade682d1,
    0x9b05688c2b3e6c1f,
    0x1f83d9abfb41bd6b,
    0x5be0cd19137e2179,
];

/// Fingerprints are hashes already: the map uses their low bits instead of hashing them again.
#[derive(Default)]
pub(crate) struct FpHasher(u64);

impl std::hash::Hasher for FpHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ *b as u64;
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type FpBuild = std::hash::BuildHasherDefault<FpHasher>;
type Counts = HashMap<u128, u32, FpBuild>;

/// 128-bit fingerprints of whole rows (two independent 64-bit hashes of the row encoding). `conv` must encode every
/// column of `batch`.
pub(crate) fn fingerprints(conv: &RowConverter, batch: &RecordBatch) -> Result<Vec<u128>> {
    let rows = rowenc::convert(conv, batch.columns())?;
    let h1 = ahash::RandomState::with_seeds(FP_SEEDS[0], FP_SEEDS[1], FP_SEEDS[2], FP_SEEDS[3]);
    let h2 = ahash::RandomState::with_seeds(FP_SEEDS[4], FP_SEEDS[5], FP_SEEDS[6], FP_SEEDS[7]);
    Ok(rows.iter().map(|r| ((h1.hash_one(r.as_ref()) as u128) << 64) | h2.hash_one(r.as_ref()) as u128).collect())
}

/// A row converter over every column of `schema`, for [`fingerprints`].
pub(crate) fn fingerprint_converter(schema: &SchemaRef) -> Result<RowConverter> {
    rowenc::converter(schema.fields().iter().map(|f| f.data_type().clone()))
}

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
    counts: Counts,
    /// One part: added rows kept in memory, and where they went once the memory half was used up.
    kept: Vec<(RecordBatch, Vec<u128>)>,
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
        let parts = (added_upper * FP_ENTRY_BYTES).div_ceil(half).max(1);
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(FP_HI, DataType::UInt64, false));
        fields.push(Field::new(FP_LO, DataType::UInt64, false));
        let capacity = if parts == 1 { added_upper as usize } else { 0 };
        CarryOver {
            spill_schema: Arc::new(Schema::new(fields)),
            schema,
            spill_dir: spill_dir.to_path_buf(),
            parts,
            counts: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            kept: Vec::new(),
            kept_bytes: 0,
            // the rows kept get what the fingerprints leave of the share
            keep_limit: if parts == 1 { share - added_upper * FP_ENTRY_BYTES } else { 0 },
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
        for fp in &fps {
            *self.counts.entry(*fp).or_default() += 1;
        }
        let bytes = batch.get_array_memory_size() as u64 + 16 * fps.len() as u64;
        if self.added_overflow.is_none() && self.kept_bytes + bytes <= self.keep_limit {
            self.kept_bytes += bytes;
            self.kept.push((batch, fps));
            return Ok(());
        }
        let spill = match &mut self.added_overflow {
            Some(s) => s,
            None => self.added_overflow.insert(Spill::create(&self.spill_dir, &self.spill_schema)?),
        };
        spill.write(&with_fps(&self.spill_schema, &batch, &fps)?)
    }

    /// A removed row batch with its fingerprints; with one part the rows no added row cancels are emitted now.
    pub(crate) fn remove(&mut self, batch: RecordBatch, fps: Vec<u128>, emit: &mut Emit<'_>) -> Result<()> {
        if self.parts > 1 {
            return self.split(Side::Removed, &batch, &fps);
        }
        let keep = self.use_up(&fps, false);
        emit_masked(emit, Side::Removed, &batch, keep)
    }

    /// Emits what is left: the added rows no removed row cancelled (one part), or every part's survivors.
    pub(crate) fn finish(mut self, emit: &mut Emit<'_>) -> Result<CarryStats> {
        if self.parts == 1 {
            for (batch, fps) in std::mem::take(&mut self.kept) {
                let keep = self.use_up(&fps, true);
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
            self.counts.clear();
            if let Some(a) = &mut added {
                for b in a.read(Some(vec![n, n + 1]))? {
                    let b = b?;
                    for fp in fps_of(&b, 0) {
                        *self.counts.entry(fp).or_default() += 1;
                    }
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

    /// Streams a spill file of `side` back through the counts, emitting its survivors.
    fn drain(&mut self, mut spill: Spill, side: Side, emit: &mut Emit<'_>) -> Result<()> {
        for b in spill.read(None)? {
            let (batch, fps) = split_fps(&self.schema, b?);
            let keep = self.use_up(&fps, side == Side::Added);
            emit_masked(emit, side, &batch, keep)?;
        }
        self.stats.spilled_bytes += spill.bytes()?;
        Ok(())
    }

    /// Per row whether it survives. A removed row survives unless an identical added row was counted (and uses the
    /// count up); an added row survives while its count — what no removed row cancelled — lasts.
    fn use_up(&mut self, fps: &[u128], added: bool) -> Vec<bool> {
        fps.iter()
            .map(|fp| {
                let counted = match self.counts.get_mut(fp) {
                    Some(c) if *c > 0 => {
                        *c -= 1;
                        true
                    }
                    _ => false,
                };
                if counted && !added {
                    self.stats.cancelled += 1;
                }
                counted == added
            })
            .collect()
    }

    /// Appends the rows of `batch` to their parts' spill files of `side`.
    fn split(&mut self, side: Side, batch: &RecordBatch, fps: &[u128]) -> Result<()> {
        let parts = self.parts;
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); parts as usize];
        for (i, fp) in fps.iter().enumerate() {
            // the map indexes by the low half: partition by the high half so each part's map still spreads
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
        let conv = fingerprint_converter(&schema()).unwrap();
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
            let fps = fingerprints(&conv, &b).unwrap();
            c.add(b, fps).unwrap();
        }
        for chunk in removed.chunks(100) {
            let b = batch(chunk);
            let fps = fingerprints(&conv, &b).unwrap();
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
        let (got, st) = run(&removed, &added, 2 * 3100 * FP_ENTRY_BYTES);
        assert_eq!(st.parts, 1);
        assert!(st.spilled_bytes > 0);
        assert_eq!(got, expected);
        // fingerprints split into parts
        let (got, st) = run(&removed, &added, 2 * 500 * FP_ENTRY_BYTES);
        assert!(st.parts >= 6, "{st:?}");
        assert!(st.spilled_bytes > 0);
        assert_eq!(got, expected);
    }

    #[test]
    fn fingerprints_spread_and_the_map_stays_fast() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..200_000))]).unwrap();
        let fps = fingerprints(&fingerprint_converter(&schema).unwrap(), &b).unwrap();
        // both halves must spread: the map indexes by the low half, parts split by the high half
        let low: std::collections::HashSet<u64> = fps.iter().map(|f| *f as u64).collect();
        let high: std::collections::HashSet<u64> = fps.iter().map(|f| (*f >> 64) as u64).collect();
        assert_eq!((low.len(), high.len()), (200_000, 200_000));
        let t = std::time::Instant::now();
        let mut m: Counts = HashMap::default();
        for f in &fps {
            *m.entry(*f).or_default() += 1;
        }
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
    }
}
