//! Deletion vectors (Iceberg v3): the Puffin blob `deletion-vector-v1`.
//!
//! Layout of the blob located by `content_offset`/`content_size_in_bytes`:
//! `u32 BE length` of (magic + bitmap) · magic `D1 D3 39 64` · a 64-bit roaring bitmap in the portable format
//! (`u64 LE` count of 32-bit buckets, then per bucket `u32 LE` high key + a portable 32-bit roaring bitmap) ·
//! `u32 BE` CRC-32 of (magic + bitmap).
use std::io::Read;

use roaring::{RoaringBitmap, RoaringTreemap};

pub const DV_MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DvError {
    #[error("deletion vector blob is {0} bytes, too short")]
    TooShort(usize),
    #[error("deletion vector length field {declared} does not match blob size {actual}")]
    Length { declared: usize, actual: usize },
    #[error("deletion vector magic bytes are wrong")]
    Magic,
    #[error("deletion vector CRC mismatch (stored {stored:08x}, computed {computed:08x})")]
    Crc { stored: u32, computed: u32 },
    #[error("deletion vector bitmap is malformed: {0}")]
    Bitmap(String),
}

/// Decodes one `deletion-vector-v1` blob into the set of deleted row positions.
pub fn decode(blob: &[u8]) -> Result<RoaringTreemap, DvError> {
    if blob.len() < 12 {
        return Err(DvError::TooShort(blob.len()));
    }
    let declared = u32::from_be_bytes(blob[0..4].try_into().unwrap()) as usize;
    if declared + 8 != blob.len() {
        return Err(DvError::Length { declared, actual: blob.len() });
    }
    let body = &blob[4..4 + declared];
    if body[0..4] != DV_MAGIC {
        return Err(DvError::Magic);
    }
    let stored = u32::from_be_bytes(blob[4 + declared..].try_into().unwrap());
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(DvError::Crc { stored, computed });
    }
    decode_portable64(&body[4..])
}

fn decode_portable64(mut bytes: &[u8]) -> Result<RoaringTreemap, DvError> {
    let bad = |e: std::io::Error| DvError::Bitmap(e.to_string());
    let mut n = [0u8; 8];
    bytes.read_exact(&mut n).map_err(bad)?;
    let buckets = u64::from_le_bytes(n);
    let mut out = RoaringTreemap::new();
    let mut last_key: Option<u32> = None;
    for _ in 0..buckets {
        let mut k = [0u8; 4];
        bytes.read_exact(&mut k).map_err(bad)?;
        let key = u32::from_le_bytes(k);
        if last_key.is_some_and(|l| key <= l) {
            return Err(DvError::Bitmap("bucket keys are not ascending".into()));
        }
        last_key = Some(key);
        let bm = RoaringBitmap::deserialize_from(&mut bytes).map_err(bad)?;
        for low in bm {
            out.insert(((key as u64) << 32) | low as u64);
        }
    }
    if !bytes.is_empty() {
        return Err(DvError::Bitmap(format!("{} trailing bytes", bytes.len())));
    }
    Ok(out)
}

/// Encodes positions as a `deletion-vector-v1` blob (used by the applier and by tests).
pub fn encode(positions: &RoaringTreemap) -> Vec<u8> {
    let mut body = DV_MAGIC.to_vec();
    let mut buckets: Vec<(u32, RoaringBitmap)> = Vec::new();
    for p in positions.iter() {
        let (hi, lo) = ((p >> 32) as u32, p as u32);
        match buckets.last_mut() {
            Some((k, bm)) if *k == hi => {
                bm.insert(lo);
            }
            _ => buckets.push((hi, RoaringBitmap::from_iter([lo]))),
        }
    }
    body.extend_from_slice(&(buckets.len() as u64).to_le_bytes());
    for (k, bm) in &buckets {
        body.extend_from_slice(&k.to_le_bytes());
        bm.serialize_into(&mut body).expect("writing to a Vec cannot fail");
    }
    let mut blob = (body.len() as u32).to_be_bytes().to_vec();
    let crc = crc32fast::hash(&body);
    blob.extend_from_slice(&body);
    blob.extend_from_slice(&crc.to_be_bytes());
    blob
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_including_high_positions() {
        let mut p = RoaringTreemap::new();
        for x in [0u64, 1, 5, 65_536, 1 << 33, (1 << 33) + 7] {
            p.insert(x);
        }
        let blob = encode(&p);
        assert_eq!(decode(&blob).unwrap(), p);
    }

    #[test]
    fn rejects_corruption() {
        let p = RoaringTreemap::from_iter([3u64, 9]);
        let mut blob = encode(&p);
        let n = blob.len();
        blob[n - 6] ^= 0xff;
        assert!(matches!(decode(&blob), Err(DvError::Crc { .. })));
        let mut blob = encode(&p);
        blob[4] = 0;
        assert_eq!(decode(&blob), Err(DvError::Magic));
        assert!(matches!(decode(&blob[..5]), Err(DvError::TooShort(5))));
    }

    #[test]
    fn known_bytes_from_spec_layout() {
        // one bucket (key 0) holding {1}: portable 32-bit roaring, no-run cookie 12346, 1 container, card 1
        let mut body = DV_MAGIC.to_vec();
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&12346u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes()); // key
        body.extend_from_slice(&0u16.to_le_bytes()); // cardinality - 1
        body.extend_from_slice(&(4u32 + 8 + 4).to_le_bytes()); // offset of the container
        body.extend_from_slice(&1u16.to_le_bytes()); // value 1
        let mut blob = (body.len() as u32).to_be_bytes().to_vec();
        blob.extend_from_slice(&body);
        blob.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        assert_eq!(decode(&blob).unwrap().iter().collect::<Vec<_>>(), vec![1]);
    }
}
