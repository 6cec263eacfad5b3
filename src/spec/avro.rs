//! Avro object container files, decoded lean: the header (metadata, codec, sync marker), blocks under the null,
//! deflate, snappy and zstandard codecs, and records decoded by the writer's schema into values that borrow their
//! bytes. Manifest lists ([`super::manifest_list`]) and manifests ([`super::manifest`]) are read through it.
//!
//! Every length and count read from the file is checked against the bytes left before anything is allocated or
//! looped over; a block decompresses to at most [`MAX_BLOCK`] bytes. Anything unexpected is `None`: the callers then
//! fall back to iceberg-rust's decoder, whose error names what is wrong.
use std::io::Read;

use serde_json::Value as Json;

/// An opened container: its header, and its blocks yet to read.
pub(super) struct Container<'a> {
    /// The header's metadata, in file order.
    pub(super) meta: Vec<(&'a [u8], &'a [u8])>,
    codec: &'a [u8],
    sync: &'a [u8],
    rest: Cursor<'a>,
}

impl<'a> Container<'a> {
    /// The header of the container in `bytes`.
    pub(super) fn open(bytes: &'a [u8]) -> Option<Self> {
        let body = bytes.strip_prefix(b"Obj\x01")?;
        let mut c = Cursor { b: body };
        let mut meta = Vec::new();
        loop {
            let n = c.count()?;
            if n == 0 {
                break;
            }
            for _ in 0..n {
                meta.push((c.bytes()?, c.bytes()?));
            }
        }
        let sync = c.take(16)?;
        let codec = meta.iter().find(|(k, _)| *k == b"avro.codec").map_or(&b"null"[..], |(_, v)| v);
        Some(Container { meta, codec, sync, rest: c })
    }

    /// The metadata value under `key`.
    pub(super) fn get(&self, key: &str) -> Option<&'a [u8]> {
        self.meta.iter().find(|(k, _)| *k == key.as_bytes()).map(|(_, v)| *v)
    }

    /// The writer's schema.
    pub(super) fn schema(&self) -> Option<Json> {
        serde_json::from_slice(self.get("avro.schema")?).ok()
    }

    /// Every record, each decoded by `record` from a cursor at its start (it must read the whole record); `None`
    /// when a block is damaged or a record fails.
    pub(super) fn records<T>(self, mut record: impl FnMut(&mut Cursor<'_>) -> Option<T>) -> Option<Vec<T>> {
        let mut out = Vec::new();
        self.each(|c| {
            out.push(record(c)?);
            Some(())
        })?;
        Some(out)
    }

    /// Calls `record` with a cursor at the start of each record (it must read the whole record); `None` when a block
    /// is damaged or a call fails.
    pub(super) fn each(mut self, mut record: impl FnMut(&mut Cursor<'_>) -> Option<()>) -> Option<()> {
        while !self.rest.b.is_empty() {
            let count = self.rest.count()?;
            let size = usize::try_from(self.rest.long()?).ok()?;
            let raw = self.rest.take(size)?;
            if self.rest.take(16)? != self.sync {
                return None;
            }
            let block = decompress(self.codec, raw)?;
            let mut d = Cursor { b: &block };
            for _ in 0..count {
                record(&mut d)?;
            }
            if !d.b.is_empty() {
                return None;
            }
        }
        Some(())
    }
}

/// The most bytes one block may decompress to (the blocks of lists and manifests are tens of KB).
const MAX_BLOCK: u64 = 64 << 20;

/// A block's data as stored with `codec`.
pub(super) fn decompress<'a>(codec: &[u8], raw: &'a [u8]) -> Option<std::borrow::Cow<'a, [u8]>> {
    let mut out = Vec::new();
    match codec {
        b"null" => return Some(std::borrow::Cow::Borrowed(raw)),
        b"deflate" => {
            flate2::read::DeflateDecoder::new(raw).take(MAX_BLOCK).read_to_end(&mut out).ok()?;
        }
        b"zstandard" => {
            zstd::stream::read::Decoder::new(raw).ok()?.take(MAX_BLOCK).read_to_end(&mut out).ok()?;
        }
        b"snappy" => {
            // the compressed bytes, then the CRC-32 of the uncompressed ones (big-endian)
            let (data, crc) = raw.split_at_checked(raw.len().checked_sub(4)?)?;
            if snap::raw::decompress_len(data).ok()? as u64 > MAX_BLOCK {
                return None;
            }
            out = snap::raw::Decoder::new().decompress_vec(data).ok()?;
            if crc32fast::hash(&out).to_be_bytes() != crc {
                return None;
            }
        }
        _ => return None,
    }
    Some(std::borrow::Cow::Owned(out))
}

/// The Avro types manifests and manifest lists are made of.
#[derive(Debug)]
pub(super) enum Shape {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    /// `fixed` of this many bytes.
    Fixed(usize),
    Record(Vec<(String, Shape)>),
    Array(Box<Shape>),
    Union(Vec<Shape>),
}

impl Shape {
    /// The shape of an Avro schema (JSON), or `None` for one neither manifests nor their lists use (named
    /// references, maps, enums).
    pub(super) fn of(j: &Json) -> Option<Self> {
        Some(match j {
            Json::String(t) => Self::primitive(t)?,
            Json::Array(options) => Self::Union(options.iter().map(Self::of).collect::<Option<_>>()?),
            Json::Object(o) => match o.get("type")? {
                Json::String(t) if t == "record" => Self::Record(
                    o.get("fields")?
                        .as_array()?
                        .iter()
                        .map(|f| Some((f.get("name")?.as_str()?.to_string(), Self::of(f.get("type")?)?)))
                        .collect::<Option<_>>()?,
                ),
                Json::String(t) if t == "array" => Self::Array(Box::new(Self::of(o.get("items")?)?)),
                Json::String(t) if t == "fixed" => Self::Fixed(usize::try_from(o.get("size")?.as_u64()?).ok()?),
                // a logical type over a primitive reads as the primitive
                Json::String(t) => Self::primitive(t)?,
                nested => Self::of(nested)?,
            },
            _ => return None,
        })
    }

    /// The field names of the record this shape holds, through unions and arrays (none when it holds no record).
    pub(super) fn record_fields(&self) -> Vec<&str> {
        match self {
            Self::Record(fields) => fields.iter().map(|(n, _)| n.as_str()).collect(),
            Self::Array(items) => items.record_fields(),
            Self::Union(options) => options.iter().map(Self::record_fields).find(|f| !f.is_empty()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn primitive(t: &str) -> Option<Self> {
        Some(match t {
            "null" => Self::Null,
            "boolean" => Self::Boolean,
            "int" => Self::Int,
            "long" => Self::Long,
            "float" => Self::Float,
            "double" => Self::Double,
            "bytes" => Self::Bytes,
            "string" => Self::String,
            _ => return None,
        })
    }
}

/// One decoded value, borrowing its bytes from the block (`int` and `long` both as `Long`; `string`, `bytes` and
/// `fixed` as `Bytes`, a string checked to be UTF-8).
#[derive(Debug)]
pub(super) enum Val<'a> {
    Null,
    Bool(bool),
    Long(i64),
    Float(f32),
    Double(f64),
    Bytes(&'a [u8]),
    Record(Vec<Val<'a>>),
    Array(Vec<Val<'a>>),
}

/// Avro's binary encoding over a byte slice; every read checks what is left.
pub(super) struct Cursor<'a> {
    pub(super) b: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.b.split_at_checked(n)?;
        self.b = rest;
        Some(head)
    }

    /// A zig-zag varint of at most 10 bytes.
    pub(super) fn long(&mut self) -> Option<i64> {
        let mut z = 0u64;
        for shift in (0..70).step_by(7) {
            let (&byte, rest) = self.b.split_first()?;
            self.b = rest;
            z |= u64::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                return Some((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        None
    }

    /// Moves past a long as [`Self::long`] reads it (at most ten bytes), without decoding it: a skip-through of a
    /// long manifest list is mostly these.
    fn skip_long(&mut self) -> Option<()> {
        let last = self.b.iter().take(10).position(|byte| byte & 0x80 == 0)?;
        self.b = &self.b[last + 1..];
        Some(())
    }

    pub(super) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.long()?).ok()?;
        self.take(n)
    }

    /// A block's item count (a negative one is followed by the block's byte size), no larger than the bytes left:
    /// every item takes at least one byte, so a larger count is damage.
    pub(super) fn count(&mut self) -> Option<usize> {
        let n = self.long()?;
        if n < 0 {
            self.long()?;
        }
        let n = usize::try_from(n.checked_abs()?).ok()?;
        (n <= self.b.len()).then_some(n)
    }

    /// Moves past a value of `shape` without decoding it (nothing is allocated).
    pub(super) fn skip(&mut self, shape: &Shape) -> Option<()> {
        match shape {
            Shape::Null => {}
            Shape::Boolean => _ = self.take(1)?,
            Shape::Int | Shape::Long => self.skip_long()?,
            Shape::Float => _ = self.take(4)?,
            Shape::Double => _ = self.take(8)?,
            Shape::Fixed(n) => _ = self.take(*n)?,
            Shape::Bytes | Shape::String => _ = self.bytes()?,
            Shape::Record(fields) => {
                for (_, f) in fields {
                    self.skip(f)?;
                }
            }
            Shape::Array(items) => loop {
                let n = self.count()?;
                if n == 0 {
                    break;
                }
                for _ in 0..n {
                    self.skip(items)?;
                }
            },
            Shape::Union(options) => {
                let branch = options.get(usize::try_from(self.long()?).ok()?)?;
                self.skip(branch)?
            }
        }
        Some(())
    }

    pub(super) fn value(&mut self, shape: &Shape) -> Option<Val<'a>> {
        Some(match shape {
            Shape::Null => Val::Null,
            Shape::Boolean => match self.take(1)?[0] {
                0 => Val::Bool(false),
                1 => Val::Bool(true),
                _ => return None,
            },
            Shape::Int | Shape::Long => Val::Long(self.long()?),
            Shape::Float => Val::Float(f32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            Shape::Double => Val::Double(f64::from_le_bytes(self.take(8)?.try_into().ok()?)),
            Shape::Fixed(n) => Val::Bytes(self.take(*n)?),
            Shape::Bytes => Val::Bytes(self.bytes()?),
            Shape::String => Val::Bytes(self.bytes().filter(|b| std::str::from_utf8(b).is_ok())?),
            Shape::Record(fields) => Val::Record(fields.iter().map(|(_, f)| self.value(f)).collect::<Option<_>>()?),
            Shape::Array(items) => {
                let mut out = Vec::new();
                loop {
                    let n = self.count()?;
                    if n == 0 {
                        break Val::Array(out);
                    }
                    for _ in 0..n {
                        out.push(self.value(items)?);
                    }
                }
            }
            Shape::Union(options) => {
                let branch = options.get(usize::try_from(self.long()?).ok()?)?;
                self.value(branch)?
            }
        })
    }
}

/// `count` damaged copies of `bytes`, each with one to four bytes overwritten at random (a fixed seed: the same
/// copies every run), for tests that damaged files end in an error or another reading, never in a panic, an
/// allocation abort or a loop.
#[cfg(test)]
pub(super) fn damaged(bytes: &[u8], count: usize) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count).map(move |_| {
        let mut b = bytes.to_vec();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            b[i] = next() as u8;
        }
        b
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long as Avro writes it: zigzag, then seven bits a byte, low first.
    fn encoded(v: i64) -> Vec<u8> {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let byte = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    #[test]
    fn a_skipped_long_ends_where_a_read_one_does() {
        let values = [0, 1, -1, 63, -64, 64, 300, -300, i64::from(i32::MAX), i64::MIN, i64::MAX, 1 << 56];
        let mut b: Vec<u8> = values.iter().flat_map(|v| encoded(*v)).collect();
        b.push(7);
        let (mut read, mut skipped) = (Cursor { b: &b }, Cursor { b: &b });
        for v in values {
            assert_eq!(read.long(), Some(v));
            skipped.skip_long().unwrap();
            assert_eq!(skipped.b.len(), read.b.len(), "after {v}");
        }
        // a long cut short, or longer than ten bytes, is damage to both
        for bad in [&[0x80u8, 0x80][..], &[0xff; 11][..]] {
            assert_eq!(Cursor { b: bad }.long(), None);
            assert_eq!(Cursor { b: bad }.skip_long(), None);
        }
    }
}
