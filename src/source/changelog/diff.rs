//! One data file's changes in a snapshot: its rows live before and after, compared position by position (or, for
//! equality deletes, by key), read with the scan's shared readers and delete cache.
use super::*;

/// What every file task of one scan shares.
pub(super) struct FileReads {
    pub(super) file_io: FileIO,
    pub(super) cache: Arc<DeleteCache>,
    pub(super) gate: reader::ReadGate,
    /// The identity of the schema the files are read with ([`dead::read_as`]).
    pub(super) read_as: u128,
}

/// What reading one data file cost.
pub(super) struct FileRead {
    pub(super) rows: u64,
    pub(super) bytes: u64,
}

/// Streams one data file and sends the rows it loses and gains. When only position deletes changed, only the rows
/// at the changed positions are read ([`reader::read_rows_at`]); otherwise the whole file is.
pub(super) async fn diff_file(
    shared: &FileReads,
    job: FileJob,
    schema: SchemaRef,
    schema_id: i32,
    fingerprint: bool,
    views: bool,
    tx: &tokio::sync::mpsc::Sender<Result<FileRows>>,
) -> Result<FileRead> {
    let f = job.file.as_ref();
    let fp = if fingerprint { Some(Fingerprinter::new(&schema)?) } else { None };
    let (file_io, cache) = (&shared.file_io, shared.cache.as_ref());
    let mut sb = load_state(file_io, cache, f, job.before.0, &job.before.1, &schema, schema_id).await?;
    let mut sa = load_state(file_io, cache, f, job.after.0, &job.after.1, &schema, schema_id).await?;
    // the rows the equality deletes of each state remove, when an earlier pass kept them; else those of the state
    // after are gathered for the next poll, by any pass over every row of the file
    let mut found = None;
    for (st, after) in [(&mut sb, false), (&mut sa, true)] {
        if st.exists && !st.eq.is_empty() {
            let set = dead::set_of(shared.read_as, st);
            st.eq_removed = dead::get(f, set).await;
            if after && st.eq_removed.is_none() {
                found = Some(dead::Found::new(set));
            }
        }
    }
    let states = States { before: &sb, after: &sa, fp: fp.as_ref() };
    // a read that asks for row lineage (a v3 compaction) gets each row's, stored or inherited
    let lineage = crate::spec::row_lineage::lineage_columns(&schema);
    let with_lineage = |batch: RecordBatch, at: At<'_>| match lineage {
        Some(cols) => crate::spec::row_lineage::fill(&batch, cols, |i| at.position(i), f.first_row_id, f.seq),
        None => Ok(batch),
    };
    let mut bytes = 0;
    // the compared columns of a whole-file read, kept for the next time the file's equality deletes change
    let mut collect = None;
    let changed = match positional_change(&job, &sb, &sa) {
        Some(changed) => Some(changed),
        None if sb.exists && sa.exists => {
            // equality deletes differ: the rows whose liveness changes are found from the columns the deletes
            // compare — kept from an earlier read, or read first when the deletes hold few keys
            let (cols, compared) = compared_columns(&schema, &sb, &sa)?;
            let kept = keys::get(f, &compared).await;
            if kept.is_some() || few_equality_keys(&job) {
                let changed = changed_by_equality(shared, f, &compared, &sb, &sa, kept, found.take()).await?;
                bytes += changed.bytes;
                Some(changed.positions)
            } else {
                collect = Some(keys::Collect::new(cols, compared));
                None
            }
        }
        None => None,
    };
    if let Some(changed) = changed {
        if changed.is_empty() {
            return Ok(FileRead { rows: 0, bytes });
        }
        let read = reader::read_rows_at(file_io, f.path(), f.file.file_format(), schema, Some(&shared.gate), Some(&changed)).await?;
        check_rows(f, read.rows_in_file)?;
        let mut stream = Box::pin(read.stream);
        let mut positions = changed.iter().take_while(|p| *p < read.rows_in_file);
        let mut rows = 0u64;
        while let Some(batch) = stream.try_next().await? {
            let at: Vec<u64> = positions.by_ref().take(batch.num_rows()).collect();
            if at.len() != batch.num_rows() {
                return Err(Error::data(f.path(), "the reader returned more rows than positions were selected"));
            }
            rows += at.len() as u64;
            let batch = with_lineage(batch, At::Positions(&at))?;
            if !states.send(&batch, At::Positions(&at), tx, None).await? {
                break;
            }
        }
        return Ok(FileRead { rows, bytes: bytes + read.fetched.load(std::sync::atomic::Ordering::Relaxed) });
    }
    // without delete files (whose key encoding wants plain strings)
    let views = views && job.before.1.is_empty() && job.after.1.is_empty();
    let mut stream = reader::read_data_file(file_io, f.path(), f.file.file_format(), schema, Some(&shared.gate), views).await?;
    let mut offset = 0u64;
    while let Some(batch) = stream.try_next().await? {
        let at = At::From(offset);
        offset += batch.num_rows() as u64;
        if let Some(c) = collect.as_mut() {
            c.push(&batch)?;
        }
        let batch = with_lineage(batch, at)?;
        if !states.send(&batch, at, tx, found.as_mut()).await? {
            // receiver gone: the scan failed elsewhere
            return Ok(FileRead { rows: offset, bytes: f.file.file_size_in_bytes() });
        }
    }
    check_rows(f, offset)?;
    if let Some(c) = collect {
        c.store(f).await;
    }
    if let Some(found) = found {
        found.store(f).await;
    }
    Ok(FileRead { rows: offset, bytes: f.file.file_size_in_bytes() })
}

/// A file's rows as read must be the rows its manifest entry counts (else positions would point at other rows).
pub(super) fn check_rows(f: &FileEntry, rows: u64) -> Result<()> {
    if rows != f.file.record_count() {
        return Err(Error::data(f.path(), format!("file has {rows} rows but its manifest entry says {}", f.file.record_count())));
    }
    Ok(())
}

/// The positions of a file whose liveness changes, and the bytes read to find them.
pub(super) struct Changed {
    pub(super) positions: RoaringTreemap,
    pub(super) bytes: u64,
}

/// The columns the equality deletes of either state compare: their positions in `schema`, and their schema.
pub(super) fn compared_columns(schema: &SchemaRef, before: &StateDeletes, after: &StateDeletes) -> Result<(Vec<usize>, SchemaRef)> {
    let ids: HashSet<i32> = before.eq.iter().chain(&after.eq).flat_map(|g| g.sets.iter().flat_map(|e| e.field_ids.iter().copied())).collect();
    let cols: Vec<usize> = (0..schema.fields().len()).filter(|&i| reader::field_id(schema.field(i)).is_some_and(|id| ids.contains(&id))).collect();
    let compared = Arc::new(schema.project(&cols)?);
    Ok((cols, compared))
}

/// The positions of `f` (in both states) live in one state and not in the other, found from the columns the states'
/// equality deletes compare (`compared`, see [`compared_columns`]): those `kept` from an earlier read ([`keys`]), or
/// else read now and kept. The key is usually a small part of a row, and the rows it finds are then read by
/// position — so an equality delete of a few keys, which applies to every older file of its partition, reads their
/// keys (once) and the pages of the matching rows, not the files.
pub(super) async fn changed_by_equality(
    shared: &FileReads,
    f: &FileEntry,
    compared: &SchemaRef,
    before: &StateDeletes,
    after: &StateDeletes,
    kept: Option<Arc<Vec<RecordBatch>>>,
    mut found: Option<dead::Found>,
) -> Result<Changed> {
    let (kb, ka) = (before.on(compared)?, after.on(compared)?);
    let (mut positions, mut offset) = (RoaringTreemap::new(), 0u64);
    // the positions of `batch` (the next rows of the file) whose liveness changes
    let mut mark = |batch: &RecordBatch, offset: &mut u64| -> Result<()> {
        let at = At::From(*offset);
        let masks = live_masks(&kb, &ka, batch, at)?;
        positions.extend(masks.before.iter().zip(&masks.after).enumerate().filter(|(_, (b, a))| b != a).map(|(i, _)| *offset + i as u64));
        if let Some(found) = found.as_mut() {
            found.push(&masks.eq_removed_after, at);
        }
        *offset += batch.num_rows() as u64;
        Ok(())
    };
    if let Some(kept) = kept {
        for batch in kept.iter() {
            mark(batch, &mut offset)?;
        }
        check_rows(f, offset)?;
        if let Some(found) = found {
            found.store(f).await;
        }
        return Ok(Changed { positions, bytes: 0 });
    }
    let read = reader::read_rows_at(&shared.file_io, f.path(), f.file.file_format(), compared.clone(), Some(&shared.gate), None).await?;
    let mut stream = Box::pin(read.stream);
    let mut collect = keys::Collect::all(compared.clone());
    while let Some(batch) = stream.try_next().await? {
        mark(&batch, &mut offset)?;
        collect.push(&batch)?;
    }
    check_rows(f, offset)?;
    collect.store(f).await;
    if let Some(found) = found {
        found.store(f).await;
    }
    Ok(Changed { positions, bytes: read.fetched.load(std::sync::atomic::Ordering::Relaxed) })
}

impl StateDeletes {
    /// The same state, its equality deletes compared on the columns of `schema` (a projection of the one it was
    /// loaded with).
    pub(super) fn on(&self, schema: &SchemaRef) -> Result<StateDeletes> {
        let mut st = StateDeletes { exists: self.exists, positions: self.positions.clone(), eq: Vec::new(), eq_removed: self.eq_removed.clone() };
        for e in self.eq.iter().flat_map(|g| &g.sets) {
            st.add_eq(e.clone(), schema)?;
        }
        Ok(st)
    }
}

/// The two states of one file, and the fingerprinter when the read wants fingerprints.
pub(super) struct States<'a> {
    pub(super) before: &'a StateDeletes,
    pub(super) after: &'a StateDeletes,
    pub(super) fp: Option<&'a Fingerprinter>,
}

impl States<'_> {
    /// Sends the rows of `batch` (at `at` in the file) that are live before and not after (removed), and after and not
    /// before (added). `false` when the receiver is gone (the scan failed elsewhere).
    /// The rows the state after's equality deletes remove go to `found`, when given.
    pub(super) async fn send(
        &self,
        batch: &RecordBatch,
        at: At<'_>,
        tx: &tokio::sync::mpsc::Sender<Result<FileRows>>,
        found: Option<&mut dead::Found>,
    ) -> Result<bool> {
        let Masks { before: lb, after: la, eq_removed_after } = live_masks(self.before, self.after, batch, at)?;
        if let Some(found) = found {
            found.push(&eq_removed_after, at);
        }
        for (side, mask) in [
            (Side::Removed, lb.iter().zip(&la).map(|(b, a)| *b && !*a).collect::<Vec<_>>()),
            (Side::Added, la.iter().zip(&lb).map(|(a, b)| *a && !*b).collect::<Vec<_>>()),
        ] {
            if mask.iter().any(|m| *m) {
                // a whole file added or removed (the common case) passes its batches on without a copy
                let batch = if mask.iter().all(|m| *m) {
                    batch.clone()
                } else {
                    arrow_select::filter::filter_record_batch(batch, &BooleanArray::from(mask))?
                };
                let fps = self.fp.map(|f| f.fingerprints(&batch)).transpose()?;
                if tx.send(Ok(FileRows { side, batch, fps })).await.is_err() {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}
