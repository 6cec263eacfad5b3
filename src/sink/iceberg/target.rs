//! The target table: created from the source when missing (with the schema of the snapshot the sync starts from),
//! loaded when it exists; its columns are matched to the source by field id (see `evolve`).
use std::collections::HashMap;

use iceberg::spec::{FormatVersion, PrimitiveType, Schema, TableMetadata, Type, UnboundPartitionSpec};
use iceberg::table::Table;
use iceberg::TableCreation;

use crate::catalog::Catalog;
use crate::config::split_table_name;
use crate::error::{Error, Result};
use crate::sink::iceberg::evolve::{self, FieldMap};

/// Previous metadata files a created target keeps (`write.metadata.previous-versions-max`); older ones are deleted
/// after each commit. Enough to inspect the last commits' metadata by hand; time travel reads snapshots, not these.
const TARGET_PREVIOUS_METADATA_FILES: usize = 20;

/// Equality columns as source field ids: the configured names (resolved in `source`, the schema whose names the user
/// sees), else the source key; float/double and nested columns are refused.
pub fn equality_ids(source: &Schema, configured: Option<&[String]>, source_key: &[i32]) -> Result<Vec<i32>> {
    let ids: Vec<i32> = match configured {
        Some(c) => c
            .iter()
            .map(|n| source.field_by_name(n).map(|f| f.id).ok_or_else(|| Error::Key(format!("equality column `{n}` is not a source column"))))
            .collect::<Result<_>>()?,
        None => source_key.to_vec(),
    };
    if ids.is_empty() {
        return Err(Error::Key(
            "no equality columns: the source has no identifier fields and neither source.key_columns nor target.equality_columns is set".into(),
        ));
    }
    for id in &ids {
        let f = source.field_by_id(*id).ok_or_else(|| Error::Key(format!("equality field id {id} is not in the source schema")))?;
        match f.field_type.as_ref() {
            Type::Primitive(PrimitiveType::Float | PrimitiveType::Double) => {
                return Err(Error::Key(format!("equality column `{}` is {}; float and double cannot be matched exactly", f.name, f.field_type)))
            }
            Type::Primitive(_) => {}
            t => return Err(Error::Key(format!("equality column `{}` is {t}; only primitive columns can be equality columns", f.name))),
        }
    }
    Ok(ids)
}

/// Table property prefix naming the source schema a target was created from; the source table's uuid follows.
pub const CREATED_FROM_PREFIX: &str = "cdc.created-from-schema.";

/// The target table as a sync finds or makes it.
pub struct Target {
    pub table: Table,
    /// This run created it.
    pub created: bool,
    /// Source field id → target field id.
    pub map: FieldMap,
}

/// Loads the target, or creates it (namespace included) from `schema` — the source schema of the snapshot the
/// sync starts from — and the source's partition spec. Creation races with another applier are fine: whoever loses
/// loads what the winner created. The field mapping comes from the target's properties, else from how the table
/// was created (by position), else by name (a table that existed before its first sync).
/// `existing`: the table when the caller already loaded it (no second load).
pub async fn ensure(
    catalog: &Catalog,
    name: &str,
    existing: Option<Table>,
    source: &TableMetadata,
    schema: &Schema,
    key: &[i32],
    format_version: u8,
) -> Result<Target> {
    let source_uuid = source.uuid().to_string();
    let created_from_key = format!("{CREATED_FROM_PREFIX}{source_uuid}");
    let loaded = |t: Table, created: bool| -> Result<Target> {
        let meta = t.metadata();
        let map = match FieldMap::read(meta, &source_uuid)? {
            Some(m) => m,
            None => {
                // Created by an applier that has not committed yet: its creation schema is the source schema it
                // names, position for position, so the mapping is exact. Else (a table made by hand): by name.
                let created_from =
                    meta.properties().get(&created_from_key).and_then(|v| v.parse::<i32>().ok()).and_then(|id| source.schema_by_id(id));
                let first = meta.schemas_iter().min_by_key(|s| s.schema_id());
                match (created_from, first) {
                    (Some(src), Some(first)) => FieldMap::by_position(src, first)?,
                    _ => FieldMap::by_name(schema, meta.current_schema()),
                }
            }
        };
        Ok(Target { table: t, created, map })
    };
    let existing = match existing {
        Some(t) => Some(t),
        None => match catalog.load_table(name).await {
            Ok(t) => Some(t),
            Err(Error::TableNotFound { .. }) => None,
            Err(e) => return Err(e),
        },
    };
    if let Some(t) = existing {
        return loaded(t, false);
    }
    // Identifier fields must be required; equality deletes work either way.
    let all_required = !key.is_empty() && key.iter().all(|id| schema.field_by_id(*id).is_some_and(|f| f.required));
    let fields = schema.as_struct().fields().iter();
    let fields: Vec<_> =
        if format_version >= 3 { fields.cloned().collect() } else { fields.map(|f| std::sync::Arc::new(evolve::without_defaults(f))).collect() };
    let create_schema =
        Schema::builder().with_fields(fields).with_identifier_field_ids(if all_required { key.to_vec() } else { Vec::new() }).build()?;
    // The source's spec, when every column it partitions by exists in the starting schema.
    let src_spec = source.default_partition_spec();
    let spec: UnboundPartitionSpec = if src_spec.fields().iter().all(|f| schema.field_by_id(f.source_id).is_some()) {
        src_spec.as_ref().clone().into()
    } else {
        tracing::warn!(table = name, "the source's partition columns are not in the starting schema; the target is created unpartitioned");
        UnboundPartitionSpec::builder().build()
    };
    let (_, table) = split_table_name(name);
    let creation = TableCreation::builder()
        .name(table)
        .schema(create_schema.clone())
        .partition_spec(spec)
        .format_version(if format_version == 3 { FormatVersion::V3 } else { FormatVersion::V2 })
        .properties(HashMap::from([
            ("write.delete.mode".to_string(), "merge-on-read".to_string()),
            ("write.update.mode".to_string(), "merge-on-read".to_string()),
            ("write.merge.mode".to_string(), "merge-on-read".to_string()),
            // a commit every few seconds must not keep every metadata file it ever wrote
            (crate::catalog::METADATA_DELETE_AFTER_COMMIT.to_string(), "true".to_string()),
            (crate::catalog::METADATA_PREVIOUS_VERSIONS_MAX.to_string(), TARGET_PREVIOUS_METADATA_FILES.to_string()),
            // which source schema the columns were made from: another applier that loads this table before our
            // first commit (which records the field-id mapping) derives the same mapping from it
            (created_from_key.clone(), schema.schema_id().to_string()),
        ]))
        .build();
    match catalog.create_table(name, creation).await {
        Ok(t) => {
            let map = FieldMap::by_position(&create_schema, t.metadata().current_schema())?;
            Ok(Target { table: t, created: true, map })
        }
        // Another applier may have created it meanwhile: then it loads.
        Err(create_err) => match catalog.load_table(name).await {
            Ok(t) => {
                tracing::info!(table = name, "the target was created by another writer meanwhile; using it");
                loaded(t, false)
            }
            Err(_) => Err(create_err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::NestedField;

    fn schema(fields: Vec<NestedField>) -> Schema {
        Schema::builder().with_fields(fields.into_iter().map(Into::into).collect::<Vec<_>>()).build().unwrap()
    }

    #[test]
    fn equality_columns_need_a_key() {
        let src = schema(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)),
            NestedField::optional(2, "f", Type::Primitive(PrimitiveType::Double)),
        ]);
        assert_eq!(equality_ids(&src, None, &[1]).unwrap(), vec![1]);
        assert!(equality_ids(&src, None, &[]).unwrap_err().to_string().contains("no equality columns"));
        assert!(equality_ids(&src, Some(&["f".into()]), &[]).unwrap_err().to_string().contains("double"));
    }
}
