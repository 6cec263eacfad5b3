//! The target table: created from the source when missing, validated when it exists.
use std::collections::HashMap;

use iceberg::spec::{FormatVersion, PrimitiveType, Schema, TableMetadata, Type, UnboundPartitionSpec};
use iceberg::table::Table;
use iceberg::TableCreation;

use crate::catalog::Catalog;
use crate::config::split_table_name;
use crate::error::{Error, Result};

/// Equality columns: configured, else the source key; float/double and nested columns are refused.
pub fn equality_columns(source: &Schema, configured: Option<&[String]>, source_key: &[i32]) -> Result<Vec<String>> {
    let names: Vec<String> = match configured {
        Some(c) => c.to_vec(),
        None => source_key.iter().filter_map(|id| source.field_by_id(*id).map(|f| f.name.clone())).collect(),
    };
    if names.is_empty() {
        return Err(Error::Key(
            "no equality columns: the source has no identifier fields and neither source.key_columns nor target.equality_columns is set".into(),
        ));
    }
    for n in &names {
        let f = source.field_by_name(n).ok_or_else(|| Error::Key(format!("equality column `{n}` is not a source column")))?;
        match f.field_type.as_ref() {
            Type::Primitive(PrimitiveType::Float | PrimitiveType::Double) => {
                return Err(Error::Key(format!("equality column `{n}` is {}; float and double cannot be matched exactly", f.field_type)))
            }
            Type::Primitive(_) => {}
            t => return Err(Error::Key(format!("equality column `{n}` is {t}; only primitive columns can be equality columns"))),
        }
    }
    Ok(names)
}

/// Loads the target, or creates it (namespace included) from the source's schema and partition spec.
pub async fn ensure(catalog: &Catalog, name: &str, source: &TableMetadata, eq_cols: &[String], format_version: u8) -> Result<(Table, bool)> {
    match catalog.load_table(name).await {
        Ok(t) => {
            validate(source.current_schema(), t.metadata().current_schema(), eq_cols)?;
            Ok((t, false))
        }
        Err(Error::TableNotFound { .. }) => {
            let src = source.current_schema();
            let ids: Vec<i32> = eq_cols.iter().filter_map(|n| src.field_by_name(n).map(|f| f.id)).collect();
            // Identifier fields must be required; equality deletes work either way.
            let all_required = ids.iter().all(|id| src.field_by_id(*id).is_some_and(|f| f.required));
            let fields: Vec<_> = src.as_struct().fields().to_vec();
            let mut b = Schema::builder().with_fields(fields);
            if all_required {
                b = b.with_identifier_field_ids(ids);
            }
            let schema = b.build()?;
            let spec: UnboundPartitionSpec = source.default_partition_spec().as_ref().clone().into();
            let (_, table) = split_table_name(name);
            let creation = TableCreation::builder()
                .name(table)
                .schema(schema)
                .partition_spec(spec)
                .format_version(if format_version == 3 { FormatVersion::V3 } else { FormatVersion::V2 })
                .properties(HashMap::from([
                    ("write.delete.mode".to_string(), "merge-on-read".to_string()),
                    ("write.update.mode".to_string(), "merge-on-read".to_string()),
                    ("write.merge.mode".to_string(), "merge-on-read".to_string()),
                ]))
                .build();
            Ok((catalog.create_table(name, creation).await?, true))
        }
        Err(e) => Err(e),
    }
}

fn promotable(from: &Type, to: &Type) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (a, b) if a == b => true,
        (Type::Primitive(P::Int), Type::Primitive(P::Long)) => true,
        (Type::Primitive(P::Float), Type::Primitive(P::Double)) => true,
        (Type::Primitive(P::Decimal { precision: p1, scale: s1 }), Type::Primitive(P::Decimal { precision: p2, scale: s2 })) => s1 == s2 && p2 >= p1,
        _ => false,
    }
}

/// Every source column must exist in the target (by name) with the same or a wider type; target-only columns must
/// be optional; equality columns must exist. All problems are reported together.
pub fn validate(source: &Schema, target: &Schema, eq_cols: &[String]) -> Result<()> {
    let mut problems = Vec::new();
    for f in source.as_struct().fields() {
        match target.field_by_name(&f.name) {
            None => problems.push(format!("target has no column `{}` ({}); add it: ALTER TABLE … ADD COLUMN {} {}", f.name, f.field_type, f.name, f.field_type)),
            Some(t) if !promotable(&f.field_type, &t.field_type) => {
                problems.push(format!("column `{}` is {} in the source but {} in the target", f.name, f.field_type, t.field_type))
            }
            Some(t) if t.required && !f.required => problems.push(format!("column `{}` is required in the target but optional in the source", f.name)),
            _ => {}
        }
    }
    for t in target.as_struct().fields() {
        if t.required && source.field_by_name(&t.name).is_none() {
            problems.push(format!("target column `{}` is required but the source has no such column", t.name));
        }
    }
    for n in eq_cols {
        if target.field_by_name(n).is_none() {
            problems.push(format!("equality column `{n}` is not a target column"));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(Error::Schema(format!("the target cannot take the source rows:\n  - {}", problems.join("\n  - ")))) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::NestedField;

    fn schema(fields: Vec<NestedField>) -> Schema {
        Schema::builder().with_fields(fields.into_iter().map(Into::into).collect::<Vec<_>>()).build().unwrap()
    }

    #[test]
    fn validation_reports_every_mismatch() {
        let src = schema(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Int)),
            NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)),
            NestedField::optional(3, "amount", Type::Primitive(PrimitiveType::Decimal { precision: 10, scale: 2 })),
        ]);
        let ok = schema(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)),
            NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)),
            NestedField::optional(3, "amount", Type::Primitive(PrimitiveType::Decimal { precision: 12, scale: 2 })),
            NestedField::optional(4, "extra", Type::Primitive(PrimitiveType::String)),
        ]);
        validate(&src, &ok, &["id".into()]).unwrap();
        let bad = schema(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::String)),
            NestedField::required(5, "must", Type::Primitive(PrimitiveType::String)),
        ]);
        let err = validate(&src, &bad, &["id".into(), "zz".into()]).unwrap_err().to_string();
        for needle in ["`id` is int in the source but string", "no column `name`", "no column `amount`", "`must` is required", "`zz`"] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn equality_columns_need_a_key() {
        let src = schema(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)),
            NestedField::optional(2, "f", Type::Primitive(PrimitiveType::Double)),
        ]);
        assert_eq!(equality_columns(&src, None, &[1]).unwrap(), vec!["id"]);
        assert!(equality_columns(&src, None, &[]).unwrap_err().to_string().contains("no equality columns"));
        assert!(equality_columns(&src, Some(&["f".into()]), &[]).unwrap_err().to_string().contains("double"));
    }
}
