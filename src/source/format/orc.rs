//! ORC data files (orc-rust), read through ranged reads of the table's storage a stripe at a time.
//!
//! Field ids: orc-rust decodes the footer but keeps no type attributes, so the footer is decoded once more here
//! (postscript → footer, decompressed with the file's codec) for the `iceberg.id` attribute of every type — from the
//! tail bytes orc-rust fetched, kept by the reader, so the footer costs no second fetch; the
//! decoded Arrow schema is walked beside the ORC type tree (struct children, list element, map key and value, in
//! type order) to put each id on its field. Timestamps are decoded to microseconds, Iceberg's unit.
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_schema::{DataType, Field, FieldRef};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use iceberg::io::{FileIO, FileRead};
use orc_rust::compression::{Compression, Decompressor};
use orc_rust::proto;
use orc_rust::reader::AsyncChunkReader;
use orc_rust::{ArrowReaderBuilder, TimestampPrecision};
use prost::Message;

use super::{opening_error, BATCH_SIZE};
use super::{relabel_batch, schema_of, with_id, Opened};
use crate::error::{Error, Result};

/// The attribute Iceberg's ORC writer puts the field id in.
const ID_ATTRIBUTE: &str = "iceberg.id";

/// Ranged reads of one file, counted; the last range that ends at the file's end (the tail orc-rust reads for the
/// footer) is kept.
struct Chunks {
    input: Arc<dyn FileRead>,
    len: u64,
    fetched: Arc<AtomicU64>,
    tail: Arc<std::sync::Mutex<Option<(u64, Bytes)>>>,
}

impl AsyncChunkReader for Chunks {
    fn len(&mut self) -> BoxFuture<'_, std::io::Result<u64>> {
        let len = self.len;
        async move { Ok(len) }.boxed()
    }

    fn get_bytes(&mut self, offset: u64, length: u64) -> BoxFuture<'_, std::io::Result<Bytes>> {
        let (input, tail, at_end) = (self.input.clone(), self.tail.clone(), offset + length == self.len);
        self.fetched.fetch_add(length, Ordering::Relaxed);
        async move {
            let bytes = input.read(offset..offset + length).await.map_err(|e| std::io::Error::other(e.to_string()))?;
            if at_end {
                *tail.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((offset, bytes.clone()));
            }
            Ok(bytes)
        }
        .boxed()
    }
}

pub(crate) async fn open(file_io: &FileIO, path: &str) -> Result<Opened> {
    let err = |e: &dyn std::fmt::Display| Error::data(path, e);
    let input = file_io.new_input(path).map_err(|e| err(&e))?;
    let len = input.metadata().await.map_err(|e| opening_error(path, e))?.size;
    let input: Arc<dyn FileRead> = Arc::from(input.reader().await.map_err(|e| err(&e))?);
    let fetched = Arc::new(AtomicU64::new(0));
    let tail = Arc::new(std::sync::Mutex::new(None));
    let chunks = Chunks { input: input.clone(), len, fetched: fetched.clone(), tail: tail.clone() };
    let builder = ArrowReaderBuilder::try_new_async(chunks).await.map_err(|e| err(&format!("not a readable ORC file: {e}")))?;
    let rows = builder.file_metadata().number_of_rows();
    let tail = tail.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    let ids = type_ids(input.as_ref(), len, tail, builder.file_metadata().compression()).await.map_err(|e| err(&e))?;
    let builder = builder.with_batch_size(BATCH_SIZE).with_timestamp_precision(TimestampPrecision::Microsecond);
    let decoded = builder.schema();
    let fields: Vec<FieldRef> = {
        let root = ids.first().map(|t| t.1.clone()).unwrap_or_default();
        decoded.fields().iter().zip(root).map(|(f, child)| Arc::new(assign(f, child as usize, &ids))).collect()
    };
    let schema = schema_of(fields, decoded.metadata().clone());
    let path_owned = path.to_string();
    let stream = builder
        .build_async()
        .map(move |b| {
            let b = b.map_err(|e| Error::data_from(&path_owned, e))?;
            relabel_batch(&b, &schema)
        })
        .boxed();
    Ok(Opened { stream, rows, fetched })
}

/// `f` and its nested fields with the ids of ORC type `ty` and its subtypes; `types` holds (id, subtypes) per type.
fn assign(f: &Field, ty: usize, types: &[(Option<i32>, Vec<u32>)]) -> Field {
    let Some((id, subtypes)) = types.get(ty) else { return f.clone() };
    let child = |i: usize, f: &Field| -> FieldRef { Arc::new(subtypes.get(i).map(|t| assign(f, *t as usize, types)).unwrap_or_else(|| f.clone())) };
    let dt = match f.data_type() {
        DataType::Struct(fs) => DataType::Struct(fs.iter().enumerate().map(|(i, c)| child(i, c)).collect()),
        DataType::List(e) => DataType::List(child(0, e)),
        DataType::LargeList(e) => DataType::LargeList(child(0, e)),
        DataType::Map(entries, sorted) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                let kv = vec![child(0, &kv[0]), child(1, &kv[1])];
                DataType::Map(Arc::new(entries.as_ref().clone().with_data_type(DataType::Struct(kv.into()))), *sorted)
            }
            _ => f.data_type().clone(),
        },
        other => other.clone(),
    };
    with_id(f.clone().with_data_type(dt), *id)
}

/// Every type of the file's footer: its `iceberg.id` and its subtypes, by type index (0 is the root struct). `tail`:
/// the file's last bytes from `offset` on, when already fetched.
async fn type_ids(
    input: &dyn FileRead,
    len: u64,
    tail: Option<(u64, Bytes)>,
    compression: Option<Compression>,
) -> std::result::Result<Vec<(Option<i32>, Vec<u32>)>, String> {
    let tail = match tail {
        Some((offset, bytes)) if offset + bytes.len() as u64 == len && !bytes.is_empty() => bytes,
        _ => input.read(len - len.min(16 * 1024)..len).await.map_err(|e| e.to_string())?,
    };
    let tail_len = tail.len() as u64;
    let ps_len = *tail.last().ok_or("empty file")? as u64;
    if ps_len + 1 > tail_len {
        return Err("postscript longer than the file".into());
    }
    let ps_start = (tail_len - 1 - ps_len) as usize;
    let ps = proto::PostScript::decode(&tail[ps_start..tail.len() - 1]).map_err(|e| format!("postscript: {e}"))?;
    let footer_len = ps.footer_length();
    let footer_end = len - 1 - ps_len;
    let footer_start = footer_end.checked_sub(footer_len).ok_or("footer longer than the file")?;
    let footer = if footer_start >= len - tail_len {
        let off = (footer_start - (len - tail_len)) as usize;
        tail.slice(off..off + footer_len as usize)
    } else {
        input.read(footer_start..footer_end).await.map_err(|e| e.to_string())?
    };
    let mut raw = Vec::new();
    Decompressor::new(footer, compression, Vec::new()).read_to_end(&mut raw).map_err(|e| format!("footer: {e}"))?;
    let footer = proto::Footer::decode(raw.as_slice()).map_err(|e| format!("footer: {e}"))?;
    Ok(footer
        .types
        .iter()
        .map(|t| {
            let id = t.attributes.iter().find(|a| a.key() == ID_ATTRIBUTE).and_then(|a| a.value().parse().ok());
            (id, t.subtypes.clone())
        })
        .collect())
}
