//! Iceberg's name mapping (`schema.name-mapping.default`): field ids for data files written without them — the
//! files of a table migrated from Hive (`migrate`, `snapshot`, `add_files`), which were written by Hive or plain
//! Spark before the table was Iceberg.
//!
//! The mapping is a JSON list of `{"field-id": N, "names": [...], "fields": [...]}`; a file column whose name is
//! one of `names` is field N, at every nesting level (a list's element is the nested entry named `element`, a map's
//! `key` and `value`). Iceberg updates the mapping on renames (the old name stays as an alias), so old files keep
//! resolving. Invariant: a file that carries ids anywhere at the top level is never re-mapped — its own ids win, as
//! the spec says; columns the mapping does not name get no id (and then nothing matches them: the projection reads
//! null, like a column added after the file was written).
//!
//! How the mapping reaches the reader: the scan puts its JSON in the target schema's metadata ([`attach`], key
//! [`META_KEY`]), and the reader maps each file's schema ([`map_schema`]) before projecting by id.
use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use serde::Deserialize;

use super::projection::{field_id, with_id};

/// The table property that holds the default name mapping.
pub const PROPERTY: &str = "schema.name-mapping.default";
/// Key of an Arrow schema's metadata that carries the mapping's JSON to the reader.
pub const META_KEY: &str = "iceberg.name-mapping.default";

#[derive(Debug, Deserialize)]
struct Mapped {
    #[serde(rename = "field-id")]
    field_id: Option<i32>,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    fields: Vec<Mapped>,
}

/// `schema` with the table's name mapping attached when `properties` hold one.
pub fn attach(schema: SchemaRef, properties: &HashMap<String, String>) -> SchemaRef {
    match properties.get(PROPERTY) {
        Some(json) => {
            let mut meta = schema.metadata().clone();
            meta.insert(META_KEY.into(), json.clone());
            Arc::new(Schema::new_with_metadata(schema.fields().clone(), meta))
        }
        None => schema,
    }
}

/// `file` with field ids from the mapping attached to `target`; `None` when there is nothing to do (no mapping, a
/// file with ids, or a mapping that cannot be parsed — the reader then matches by name, as before).
pub fn map_schema(file: &Schema, target: &Schema) -> Option<SchemaRef> {
    let json = target.metadata().get(META_KEY)?;
    if file.fields().iter().any(|f| field_id(f).is_some()) {
        return None;
    }
    let mapping: Vec<Mapped> = match serde_json::from_str(json) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "the table's {PROPERTY} cannot be parsed; files without field ids are matched by column name");
            return None;
        }
    };
    Some(Arc::new(Schema::new_with_metadata(map_fields(file.fields(), &mapping), file.metadata().clone())))
}

fn map_fields(fields: &Fields, mapping: &[Mapped]) -> Fields {
    fields.iter().map(|f| Arc::new(map_field(f, find(mapping, f.name())))).collect()
}

fn find<'a>(mapping: &'a [Mapped], name: &str) -> Option<&'a Mapped> {
    mapping.iter().find(|m| m.names.iter().any(|n| n == name))
}

/// The one nested entry of a list (`element`) or the named one of a map, tolerating writers' own child names.
fn child<'a>(m: Option<&'a Mapped>, name: &str) -> Option<&'a Mapped> {
    let fields = &m?.fields;
    find(fields, name).or(if fields.len() == 1 { fields.first() } else { None })
}

fn map_field(f: &Field, m: Option<&Mapped>) -> Field {
    let dt = match f.data_type() {
        DataType::Struct(children) => DataType::Struct(map_fields(children, m.map(|m| m.fields.as_slice()).unwrap_or_default())),
        DataType::List(e) => DataType::List(Arc::new(map_field(e, child(m, "element")))),
        DataType::LargeList(e) => DataType::LargeList(Arc::new(map_field(e, child(m, "element")))),
        DataType::Map(entries, sorted) => {
            let DataType::Struct(kv) = entries.data_type() else { return with_id(f.clone(), m.and_then(|m| m.field_id)) };
            let kv: Fields = kv
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let name = if i == 0 { "key" } else { "value" };
                    Arc::new(map_field(c, m.and_then(|m| find(&m.fields, name))))
                })
                .collect();
            DataType::Map(Arc::new(entries.as_ref().clone().with_data_type(DataType::Struct(kv))), *sorted)
        }
        other => other.clone(),
    };
    with_id(f.clone().with_data_type(dt), m.and_then(|m| m.field_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPPING: &str = r#"[
        {"field-id": 1, "names": ["id"]},
        {"field-id": 2, "names": ["customer", "name"]},
        {"field-id": 3, "names": ["address"], "fields": [{"field-id": 4, "names": ["city"]}]},
        {"field-id": 5, "names": ["tags"], "fields": [{"field-id": 6, "names": ["element"]}]},
        {"field-id": 7, "names": ["attrs"], "fields": [{"field-id": 8, "names": ["key"]}, {"field-id": 9, "names": ["value"]}]}
    ]"#;

    fn target() -> Schema {
        let props = HashMap::from([(PROPERTY.to_string(), MAPPING.to_string())]);
        attach(Arc::new(Schema::empty()), &props).as_ref().clone()
    }

    #[test]
    fn names_and_aliases_get_their_ids_at_every_level() {
        let city = Field::new("city", DataType::Utf8, true);
        let entries = Field::new(
            "key_value",
            DataType::Struct(Fields::from(vec![Field::new("key", DataType::Utf8, false), Field::new("value", DataType::Int32, true)])),
            false,
        );
        let file = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true), // the old name of `customer`
            Field::new("address", DataType::Struct(Fields::from(vec![city])), true),
            Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
            Field::new("attrs", DataType::Map(Arc::new(entries), false), true),
            Field::new("unmapped", DataType::Utf8, true),
        ]);
        let got = map_schema(&file, &target()).unwrap();
        let ids: Vec<_> = got.fields().iter().map(|f| field_id(f)).collect();
        assert_eq!(ids, vec![Some(1), Some(2), Some(3), Some(5), Some(7), None]);
        let DataType::Struct(a) = got.field(2).data_type() else { panic!() };
        assert_eq!(field_id(&a[0]), Some(4));
        let DataType::List(e) = got.field(3).data_type() else { panic!() };
        assert_eq!(field_id(e), Some(6), "a writer's own element name still maps");
        let DataType::Map(kv, _) = got.field(4).data_type() else { panic!() };
        let DataType::Struct(kv) = kv.data_type() else { panic!() };
        assert_eq!((field_id(&kv[0]), field_id(&kv[1])), (Some(8), Some(9)));
    }

    #[test]
    fn files_with_ids_and_tables_without_a_mapping_are_left_alone() {
        let with_ids = Schema::new(vec![with_id(Field::new("id", DataType::Int64, false), Some(10))]);
        assert!(map_schema(&with_ids, &target()).is_none());
        let plain = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        assert!(map_schema(&plain, &Schema::empty()).is_none());
        let broken = attach(Arc::new(Schema::empty()), &HashMap::from([(PROPERTY.to_string(), "{".to_string())]));
        assert!(map_schema(&plain, &broken).is_none());
    }
}
