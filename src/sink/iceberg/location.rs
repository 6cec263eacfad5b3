//! Where the applier puts the files it writes: `<data dir>/<partition path>/<name>`, named the way Iceberg Java names
//! them, so that every engine can address them.
//!
//! The data directory is the table's `write.data.path`, else its `write.folder-storage.path`, else
//! `<location>/data` (as every Iceberg implementation resolves it). The partition path is `name=value` per partition
//! field, joined by `/`, with both sides escaped as Iceberg Java's `PartitionSpec.partitionToPath` escapes them
//! (`java.net.URLEncoder`, UTF-8): ASCII letters, digits and `.-*_` stay, a space becomes `+`, every other byte is
//! `%XX`; year, month and hour values read `2024`, `2024-01`, `2024-01-01-10` as in Java (iceberg-rust prints
//! their ordinals). iceberg-rust's own generator does not escape, so a string partition value holding `/`, `?`, `#` or `%`
//! would make a path that object stores and URI parsers read differently from the manifest (a `/` even adds a
//! directory level). Escaped, a path is plain ASCII without those characters, and the object's name is exactly the
//! path the metadata holds.
use iceberg::spec::{Literal, PartitionKey, PrimitiveLiteral, TableMetadata, Transform};

const WRITE_DATA_PATH: &str = "write.data.path";
const FOLDER_STORAGE_PATH: &str = "write.folder-storage.path";

/// File locations of one target table.
#[derive(Debug, Clone)]
pub(crate) struct Locations {
    data_dir: String,
}

impl Locations {
    /// The locations of `meta`'s table.
    pub(crate) fn new(meta: &TableMetadata) -> Locations {
        let props = meta.properties();
        let dir = match props.get(WRITE_DATA_PATH).or_else(|| props.get(FOLDER_STORAGE_PATH)) {
            Some(d) => d.clone(),
            None => format!("{}/data", meta.location()),
        };
        Locations { data_dir: dir.trim_end_matches('/').to_string() }
    }

    /// Where a file named `name` of partition `key` goes (`None` or an unpartitioned key: the data directory).
    pub(crate) fn file(&self, key: Option<&PartitionKey>, name: &str) -> String {
        match key.filter(|k| !k.spec().is_unpartitioned()) {
            None => format!("{}/{name}", self.data_dir),
            Some(k) => format!("{}/{}/{name}", self.data_dir, partition_path(k)),
        }
    }
}

/// `field=value/…` of a partition, escaped as Iceberg Java escapes it.
fn partition_path(key: &PartitionKey) -> String {
    let spec = key.spec();
    let types = spec.partition_type(key.schema()).map(|t| t.fields().to_vec()).unwrap_or_default();
    spec.fields()
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let value = key.data()[i].as_ref();
            let human = match (time_human(field.transform, value), types.get(i)) {
                (Some(h), _) => h,
                (None, Some(t)) => field.transform.to_human_string(&t.field_type, value),
                (None, None) => "null".to_string(),
            };
            format!("{}={}", url_encode(&field.name), url_encode(&human))
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Iceberg Java's human form of a year, month or hour transform's value (`2024`, `2024-01`, `2024-01-01-10`), where
/// iceberg-rust prints the ordinal (years, months, hours since 1970). Days are dates in both.
fn time_human(transform: Transform, value: Option<&Literal>) -> Option<String> {
    let Some(Literal::Primitive(PrimitiveLiteral::Int(v))) = value else { return None };
    let v = i64::from(*v);
    match transform {
        Transform::Year => Some(format!("{:04}", 1970 + v)),
        Transform::Month => Some(format!("{:04}-{:02}", 1970 + v.div_euclid(12), v.rem_euclid(12) + 1)),
        Transform::Hour => {
            let t = chrono::DateTime::from_timestamp(v.checked_mul(3600)?, 0)?;
            Some(t.format("%Y-%m-%d-%H").to_string())
        }
        _ => None,
    }
}

/// `application/x-www-form-urlencoded` encoding of UTF-8 text, as `java.net.URLEncoder.encode(s, UTF_8)`.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PartitionSpec, PrimitiveType, Schema, Struct, Type};

    use super::*;

    #[test]
    fn escapes_as_java_url_encoder() {
        assert_eq!(url_encode("abc-XYZ_0.9*"), "abc-XYZ_0.9*");
        assert_eq!(url_encode("a=b/c d+e%f#g?h&i"), "a%3Db%2Fc+d%2Be%25f%23g%3Fh%26i");
        assert_eq!(url_encode("ü€"), "%C3%BC%E2%82%AC");
        assert_eq!(url_encode("~'!()"), "%7E%27%21%28%29");
    }

    #[test]
    fn time_transforms_are_named_as_java_names_them() {
        let h = |t, v| time_human(t, Some(&Literal::int(v)));
        assert_eq!(h(Transform::Year, 54).as_deref(), Some("2024"));
        assert_eq!(h(Transform::Month, 648).as_deref(), Some("2024-01"));
        assert_eq!(h(Transform::Month, -1).as_deref(), Some("1969-12"));
        assert_eq!(h(Transform::Hour, 473_832).as_deref(), Some("2024-01-21-00"));
        assert_eq!(h(Transform::Hour, -1).as_deref(), Some("1969-12-31-23"));
        assert_eq!(h(Transform::Day, 19_723), None, "days are dates already");
        assert_eq!(time_human(Transform::Hour, None), None);
    }

    fn key(values: Vec<Option<Literal>>) -> PartitionKey {
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                    NestedField::optional(2, "cat egory", Type::Primitive(PrimitiveType::String)).into(),
                ])
                .build()
                .unwrap(),
        );
        let spec = PartitionSpec::builder(schema.clone())
            .with_spec_id(0)
            .add_partition_field("cat egory", "cat egory", Transform::Identity)
            .unwrap()
            .add_partition_field("id", "id_bucket", Transform::Bucket(8))
            .unwrap()
            .build()
            .unwrap();
        PartitionKey::new(spec, schema, Struct::from_iter(values))
    }

    #[test]
    fn partition_directories_are_escaped_and_nulls_named() {
        let loc = Locations { data_dir: "gs://b/wh/t/data".into() };
        let k = key(vec![Some(Literal::string("a=b/c d?#%ü")), Some(Literal::int(6))]);
        assert_eq!(loc.file(Some(&k), "f.parquet"), "gs://b/wh/t/data/cat+egory=a%3Db%2Fc+d%3F%23%25%C3%BC/id_bucket=6/f.parquet");
        let k = key(vec![None, Some(Literal::int(0))]);
        assert_eq!(loc.file(Some(&k), "f.parquet"), "gs://b/wh/t/data/cat+egory=null/id_bucket=0/f.parquet");
        assert_eq!(loc.file(None, "f.parquet"), "gs://b/wh/t/data/f.parquet");
    }
}
