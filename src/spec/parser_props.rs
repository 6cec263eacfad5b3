//! Property tests of every parser of outside bytes `cdc` runs (issue 50): deletion vectors, table metadata JSON,
//! manifest lists and manifests (iceberg-rust's parsers, which `cdc` calls on whatever a table's files hold), the
//! configuration file, REST responses and the damaged-file corpus (`fixtures/damaged`). Arbitrary and mutated inputs
//! must never panic or hang: each gives a value or a typed error. Case counts are bounded so that the whole module
//! runs in seconds.
use proptest::prelude::*;

/// `base` with up to `edits` bytes replaced, inserted or removed at positions drawn from `seed`.
fn mutate(base: &[u8], seed: &[(u16, u8, u8)]) -> Vec<u8> {
    let mut out = base.to_vec();
    for &(at, op, byte) in seed {
        if out.is_empty() {
            out.push(byte);
            continue;
        }
        let i = at as usize % out.len();
        match op % 3 {
            0 => out[i] = byte,
            1 => out.insert(i, byte),
            _ => {
                out.remove(i);
            }
        }
    }
    out
}

fn edits() -> impl Strategy<Value = Vec<(u16, u8, u8)>> {
    prop::collection::vec(any::<(u16, u8, u8)>(), 1..8)
}

fn valid_metadata_json() -> String {
    let s = |id, parent, seq| (id, parent, seq, 1_000 * id, serde_json::json!({"cdc.source-snapshot-id": "7"}));
    let meta = crate::spec::testing::metadata(&[s(1, None, 1), s(2, Some(1), 2)], serde_json::json!({}), serde_json::json!({"k": "v"}), 2);
    serde_json::to_string(&meta).unwrap()
}

const CONFIG: &str = "[source]\ntable = \"db.t\"\nkey_columns = [\"id\"]\n[source.catalog]\ntype = \"rest\"\nuri = \"http://x\"\n[target]\ntable = \"r.t\"\nformat_version = 3\n[target.catalog]\ntype = \"hadoop\"\nwarehouse = \"/w\"\n[engine]\nmemory_budget = \"64MiB\"\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn deletion_vectors_decode_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = crate::spec::dv::decode(&bytes);
    }

    #[test]
    fn deletion_vectors_with_valid_framing_decode_or_refuse(body in prop::collection::vec(any::<u8>(), 0..256)) {
        // framing and CRC right, the bitmap arbitrary: the portable-format parser itself is exercised
        let mut inner = crate::spec::dv::DV_MAGIC.to_vec();
        inner.extend_from_slice(&body);
        let mut blob = (inner.len() as u32).to_be_bytes().to_vec();
        blob.extend_from_slice(&inner);
        blob.extend_from_slice(&crc32fast::hash(&inner).to_be_bytes());
        let _ = crate::spec::dv::decode(&blob);
    }

    #[test]
    fn deletion_vectors_round_trip_and_any_flip_is_caught(positions in prop::collection::btree_set(any::<u64>(), 0..64), flip in any::<(u16, u8)>()) {
        let set = roaring::RoaringTreemap::from_iter(positions);
        let blob = crate::spec::dv::encode(&set);
        prop_assert_eq!(crate::spec::dv::decode(&blob).unwrap(), set);
        let mut bad = blob.clone();
        let i = flip.0 as usize % bad.len();
        bad[i] ^= flip.1.max(1);
        prop_assert!(crate::spec::dv::decode(&bad).is_err(), "a flipped byte is never read as positions");
    }

    #[test]
    fn table_metadata_json_parses_or_refuses(e in edits()) {
        let text = mutate(valid_metadata_json().as_bytes(), &e);
        let _ = serde_json::from_slice::<iceberg::spec::TableMetadata>(&text);
    }

    #[test]
    fn manifest_lists_and_manifests_parse_or_refuse(tail in prop::collection::vec(any::<u8>(), 0..512), e in edits()) {
        // Avro object container files: the magic, then arbitrary (or mutated) header and blocks
        super::bound_avro_allocations();
        let mut bytes = b"Obj\x01".to_vec();
        bytes.extend_from_slice(&tail);
        let bytes = mutate(&bytes, &e);
        for v in [iceberg::spec::FormatVersion::V1, iceberg::spec::FormatVersion::V2, iceberg::spec::FormatVersion::V3] {
            let _ = iceberg::spec::ManifestList::parse_with_version(&bytes, v);
            let _ = crate::spec::manifest_list::parse(&bytes, v, None);
        }
        let _ = iceberg::spec::Manifest::parse_avro(&bytes);
        let _ = crate::spec::manifest::parse(&bytes, &listed());
    }

    #[test]
    fn a_damaged_manifest_list_spark_wrote_parses_or_refuses(e in edits()) {
        super::bound_avro_allocations();
        let list = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/manifest-lists/spark-v2.avro")).unwrap();
        let _ = crate::spec::manifest_list::parse(&mutate(&list, &e), iceberg::spec::FormatVersion::V2, None);
    }

    #[test]
    fn the_config_file_parses_or_lists_its_problems(e in edits()) {
        let text = String::from_utf8_lossy(&mutate(CONFIG.as_bytes(), &e)).into_owned();
        let _ = crate::config::Config::parse(&text);
        let _ = crate::service::config::ServiceConfig::parse(&text);
    }

    #[test]
    fn arbitrary_text_is_no_config(text in ".{0,300}") {
        prop_assert!(crate::config::Config::parse(&text).is_err() || text.contains("[source]"));
    }

    #[test]
    fn rest_responses_parse_or_refuse(e in edits(), body in ".{0,200}") {
        let load = format!(r#"{{"metadata-location":"/t/metadata/v2.metadata.json","metadata":{},"config":{{"a":"b"}}}}"#, valid_metadata_json());
        let _ = crate::catalog::rest::parse_load_response(&mutate(load.as_bytes(), &e));
        let _ = crate::catalog::rest::server_message(&body);
        let _ = crate::catalog::rest::server_message(&String::from_utf8_lossy(&mutate(br#"{"error":{"message":"m","type":"T","code":409}}"#, &e)));
    }
}

/// An Avro header whose metadata map claims 400 million entries (what a mutated manifest once held): the decoder
/// used to reserve ~87 GB for it and abort the process; bounded, the damaged file is a typed error.
#[test]
fn an_avro_header_claiming_a_huge_map_is_an_error_not_an_abort() {
    super::bound_avro_allocations();
    let zigzag = |n: i64, out: &mut Vec<u8>| {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    };
    for count in [400_000_000i64, 16_000_000, -400_000_000] {
        let mut bytes = b"Obj\x01".to_vec();
        zigzag(count, &mut bytes);
        if count < 0 {
            zigzag(8, &mut bytes); // a negative count is followed by the block's byte size
        }
        bytes.extend_from_slice(b"\x08avro");
        assert!(iceberg::spec::Manifest::parse_avro(&bytes).is_err(), "{count}");
        assert!(crate::spec::manifest::parse(&bytes, &listed()).is_err(), "{count}");
        assert!(iceberg::spec::ManifestList::parse_with_version(&bytes, iceberg::spec::FormatVersion::V2).is_err(), "{count}");
        assert!(crate::spec::manifest_list::parse(&bytes, iceberg::spec::FormatVersion::V2, None).is_err(), "{count}");
    }
}

/// The damaged files of the integrity peer tests: each read ends in a typed error or in rows, never a panic; the
/// one whose page checksum does not match is refused as such.
#[test]
fn the_damaged_file_corpus_is_refused_or_read_never_a_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/damaged");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let io = crate::catalog::local_file_io();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let read = rt.block_on(crate::source::reader::read_all_columns(&io, &path.to_string_lossy()));
        if name.starts_with("page_checksum") {
            let e = read.expect_err("a page whose checksum does not match is refused").to_string();
            assert!(e.contains("CRC") || e.to_lowercase().contains("checksum"), "{name}: {e}");
        }
        seen += 1;
    }
    assert!(seen >= 4, "the corpus is in fixtures/damaged");
}

/// A manifest list's entry to parse a manifest under.
fn listed() -> iceberg::spec::ManifestFile {
    iceberg::spec::ManifestFile { sequence_number: 1, added_snapshot_id: 1, ..crate::spec::manifest_list::blank("/t/metadata/m.avro".into()) }
}
