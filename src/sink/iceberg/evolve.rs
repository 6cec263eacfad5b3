//! Schema evolution of a target table, by Iceberg field id.
//!
//! Column identity between source and target is the field id, never the name: the target records, in a table
//! property per source table (`cdc.field-ids.<source uuid>`), which target field id holds each source field id. A
//! catalog assigns its own ids when it creates a table, so the mapping is built once (by position for a table we
//! created, by name for one that existed) and then only grows.
//!
//! Before each commit the target schema is brought to the source schema the commit's rows are read in:
//! - a source field without a target field is added (optional — older target rows have no value — with its doc and
//!   defaults), under a fresh target id; nested struct fields, list elements and map values alike;
//! - a mapped field takes the source's name (rename), position (reorder), doc, wider type (int→long, float→double,
//!   wider decimal) and optionality (required→optional);
//! - a mapped field the source no longer has is dropped, or kept and moved out of the way of a new column of the
//!   same name (`keep_dropped_columns`); a target-only column (added by hand) is kept;
//! - anything else — a type the target cannot widen to, a required target-only column, a dropped key column — is an
//!   error naming the column and the source snapshot, raised before anything is written.
//!
//! The result is a new schema (or none when nothing changed) that goes into the same atomic commit as the rows that
//! need it, so no reader sees rows of a schema the table does not have yet.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{ListType, MapType, NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, TableMetadata, Type};

use crate::error::{Error, Result};

/// Table property prefix of the field-id mapping; the source table's uuid follows.
pub const FIELD_IDS_PREFIX: &str = "cdc.field-ids.";

/// Source field id → target field id, for one source table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldMap {
    pub ids: BTreeMap<i32, i32>,
}

impl FieldMap {
    /// The property key the mapping of `source_uuid` is stored under.
    pub fn property_key(source_uuid: &str) -> String {
        format!("{FIELD_IDS_PREFIX}{source_uuid}")
    }

    /// `source:target` pairs, comma-separated.
    pub fn to_property(&self) -> String {
        self.ids.iter().map(|(s, t)| format!("{s}:{t}")).collect::<Vec<_>>().join(",")
    }

    pub fn parse(value: &str) -> Result<FieldMap> {
        let mut ids = BTreeMap::new();
        for pair in value.split(',').filter(|p| !p.trim().is_empty()) {
            let parsed = pair.split_once(':').and_then(|(s, t)| Some((s.trim().parse().ok()?, t.trim().parse().ok()?)));
            let (s, t) =
                parsed.ok_or_else(|| Error::Schema(format!("target property {FIELD_IDS_PREFIX}…: `{pair}` is not `source-id:target-id`")))?;
            ids.insert(s, t);
        }
        Ok(FieldMap { ids })
    }

    /// The mapping recorded on the target for `source_uuid`, if any.
    pub fn read(target: &TableMetadata, source_uuid: &str) -> Result<Option<FieldMap>> {
        target.properties().get(&Self::property_key(source_uuid)).map(|v| Self::parse(v)).transpose()
    }

    /// Pairs the ids of two schemas of the same shape (the schema we asked a catalog to create and the one it
    /// created with its own ids).
    pub fn by_position(source: &Schema, target: &Schema) -> Result<FieldMap> {
        fn walk(a: &Type, b: &Type, out: &mut BTreeMap<i32, i32>) -> Result<()> {
            match (a, b) {
                (Type::Struct(x), Type::Struct(y)) if x.fields().len() == y.fields().len() => {
                    for (f, g) in x.fields().iter().zip(y.fields()) {
                        if f.name != g.name {
                            return Err(Error::Schema(format!("created target column `{}` where `{}` was asked for", g.name, f.name)));
                        }
                        out.insert(f.id, g.id);
                        walk(&f.field_type, &g.field_type, out)?;
                    }
                    Ok(())
                }
                (Type::List(x), Type::List(y)) => {
                    out.insert(x.element_field.id, y.element_field.id);
                    walk(&x.element_field.field_type, &y.element_field.field_type, out)
                }
                (Type::Map(x), Type::Map(y)) => {
                    out.insert(x.key_field.id, y.key_field.id);
                    out.insert(x.value_field.id, y.value_field.id);
                    walk(&x.key_field.field_type, &y.key_field.field_type, out)?;
                    walk(&x.value_field.field_type, &y.value_field.field_type, out)
                }
                (Type::Primitive(_), Type::Primitive(_)) => Ok(()),
                _ => Err(Error::Schema("the created target schema does not have the shape that was asked for".into())),
            }
        }
        let mut ids = BTreeMap::new();
        walk(&Type::Struct(source.as_struct().clone()), &Type::Struct(target.as_struct().clone()), &mut ids)?;
        Ok(FieldMap { ids })
    }

    /// Pairs fields by name path (a target that existed before it was first synced). Unmatched fields stay out.
    pub fn by_name(source: &Schema, target: &Schema) -> FieldMap {
        fn walk(a: &Type, b: &Type, out: &mut BTreeMap<i32, i32>) {
            match (a, b) {
                (Type::Struct(x), Type::Struct(y)) => {
                    for f in x.fields() {
                        if let Some(g) = y.fields().iter().find(|g| g.name == f.name) {
                            out.insert(f.id, g.id);
                            walk(&f.field_type, &g.field_type, out);
                        }
                    }
                }
                (Type::List(x), Type::List(y)) => {
                    out.insert(x.element_field.id, y.element_field.id);
                    walk(&x.element_field.field_type, &y.element_field.field_type, out);
                }
                (Type::Map(x), Type::Map(y)) => {
                    out.insert(x.key_field.id, y.key_field.id);
                    out.insert(x.value_field.id, y.value_field.id);
                    walk(&x.key_field.field_type, &y.key_field.field_type, out);
                    walk(&x.value_field.field_type, &y.value_field.field_type, out);
                }
                _ => {}
            }
        }
        let mut ids = BTreeMap::new();
        walk(&Type::Struct(source.as_struct().clone()), &Type::Struct(target.as_struct().clone()), &mut ids);
        FieldMap { ids }
    }

    pub fn target_of(&self, source_id: i32) -> Option<i32> {
        self.ids.get(&source_id).copied()
    }

    /// Target id → source id.
    pub fn inverse(&self) -> HashMap<i32, i32> {
        self.ids.iter().map(|(s, t)| (*t, *s)).collect()
    }
}

/// How evolution treats columns the source dropped, and what the target's format allows.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvolveOptions {
    /// Keep dropped columns in the target (optional, renamed `<name>__dropped_<id>` when a new column takes the name).
    pub keep_dropped_columns: bool,
    /// Column default values (`initial-default`, `write-default`) need format v3; older targets get none.
    pub defaults_allowed: bool,
}

/// What the target needs before it can take rows of a source schema.
#[derive(Debug, Clone)]
pub struct Evolution {
    /// The target schema to write with: the current one, or the evolved one when `changed`.
    pub schema: Schema,
    /// The schema differs from the target's current one: it must be added in the commit.
    pub changed: bool,
    pub map: FieldMap,
    /// What changed, for logs and the commit report ("add column `c`", "rename `a` to `b`", ...).
    pub changes: Vec<String>,
}

struct Ctx<'a> {
    map: FieldMap,
    /// target id → source id, for the fields mapped when evolution started
    inverse: HashMap<i32, i32>,
    source_ids: HashSet<i32>,
    next_id: i32,
    opts: EvolveOptions,
    snapshot: i64,
    changes: Vec<String>,
    problems: Vec<String>,
    /// target ids that must not be dropped (partition sources)
    pinned: &'a HashSet<i32>,
}

/// Evolves `target` (whose highest assigned id is `last_column_id`) to take rows of `source`, the schema of source
/// snapshot `snapshot`. `key` are the source's key field ids (they must survive); `pinned` are target ids that
/// cannot be dropped (partition source columns): they are kept.
#[allow(clippy::too_many_arguments)]
pub fn evolve(
    target: &Schema,
    last_column_id: i32,
    map: &FieldMap,
    source: &Schema,
    key: &[i32],
    snapshot: i64,
    pinned: &HashSet<i32>,
    opts: EvolveOptions,
) -> Result<Evolution> {
    let mut source_ids = HashSet::new();
    collect_ids(&Type::Struct(source.as_struct().clone()), &mut source_ids);
    let mut cx = Ctx {
        inverse: map.inverse(),
        map: map.clone(),
        source_ids,
        next_id: last_column_id.max(target.highest_field_id()) + 1,
        opts,
        snapshot,
        changes: Vec::new(),
        problems: Vec::new(),
        pinned,
    };
    for k in key {
        if !cx.source_ids.contains(k) {
            cx.problems.push(format!("key column (source field id {k}) was dropped from the source; a replica cannot follow without its key — recreate the target with a new key"));
        }
    }
    let mut fields = evolve_struct(&mut cx, "", source.as_struct().fields(), Some(target.as_struct().fields()));
    if !opts.defaults_allowed {
        fields = fields.iter().map(|f| Arc::new(without_defaults(f))).collect();
    }
    if !cx.problems.is_empty() {
        return Err(Error::Schema(format!(
            "the target cannot follow the schema of source snapshot {snapshot}; nothing was written:\n  - {}",
            cx.problems.join("\n  - ")
        )));
    }
    // Identifier fields follow the key when every key column is required in the target (the spec's rule).
    let key_targets: Vec<i32> = key.iter().filter_map(|k| cx.map.target_of(*k)).collect();
    let probe = Schema::builder().with_fields(fields.clone()).build()?;
    let required = |id: &i32| probe.field_by_id(*id).is_some_and(|f| f.required);
    let identifiers: Vec<i32> = if !key_targets.is_empty() && key_targets.iter().all(required) {
        key_targets
    } else {
        target.identifier_field_ids().filter(required).collect()
    };
    let builder = Schema::builder().with_schema_id(target.schema_id()).with_fields(fields).with_identifier_field_ids(identifiers);
    let schema = builder.build()?;
    let old_ids: HashSet<i32> = target.identifier_field_ids().collect();
    let new_ids: HashSet<i32> = schema.identifier_field_ids().collect();
    if old_ids != new_ids {
        cx.changes.push("identifier fields follow the source key".to_string());
    }
    let changed = schema.as_struct() != target.as_struct() || old_ids != new_ids;
    Ok(Evolution { schema, changed, map: cx.map, changes: cx.changes })
}

fn collect_ids(t: &Type, out: &mut HashSet<i32>) {
    match t {
        Type::Struct(s) => {
            for f in s.fields() {
                out.insert(f.id);
                collect_ids(&f.field_type, out);
            }
        }
        Type::List(l) => {
            out.insert(l.element_field.id);
            collect_ids(&l.element_field.field_type, out);
        }
        Type::Map(m) => {
            out.insert(m.key_field.id);
            out.insert(m.value_field.id);
            collect_ids(&m.key_field.field_type, out);
            collect_ids(&m.value_field.field_type, out);
        }
        Type::Primitive(_) => {}
    }
}

fn path(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn evolve_struct(cx: &mut Ctx, prefix: &str, source: &[NestedFieldRef], target: Option<&[NestedFieldRef]>) -> Vec<NestedFieldRef> {
    let target = target.unwrap_or(&[]);
    let mut out: Vec<NestedFieldRef> = Vec::new();
    let mut used: HashSet<i32> = HashSet::new();
    for sf in source {
        let existing = cx.map.target_of(sf.id).and_then(|tid| target.iter().find(|t| t.id == tid));
        let nf = match existing {
            Some(tf) => {
                used.insert(tf.id);
                evolve_field(cx, prefix, sf, tf)
            }
            None => {
                if let Some(tid) = cx.map.target_of(sf.id) {
                    if !target.is_empty() && !target.iter().any(|t| t.id == tid) {
                        // mapped, but the target no longer has it here (dropped or moved by hand): add it afresh
                        cx.changes.push(format!("re-add column `{}` (its target column {tid} is gone)", path(prefix, &sf.name)));
                    }
                }
                cx.changes.push(format!("add column `{}` {}", path(prefix, &sf.name), sf.field_type));
                let mut f = new_field(cx, sf);
                // Rows already in the target have no value for a new column.
                f.required = false;
                f
            }
        };
        out.push(Arc::new(nf));
    }
    let names: HashSet<String> = out.iter().map(|f| f.name.clone()).collect();
    for tf in target {
        if used.contains(&tf.id) {
            continue;
        }
        let from_source = cx.inverse.get(&tf.id).copied();
        match from_source {
            Some(sid) if !cx.source_ids.contains(&sid) || cx.map.target_of(sid) != Some(tf.id) => {
                // the source dropped it (or it now lives elsewhere)
                let keep = cx.opts.keep_dropped_columns || cx.pinned.contains(&tf.id);
                if keep {
                    let mut f = tf.as_ref().clone();
                    f.required = false;
                    if names.contains(&f.name) {
                        f.name = format!("{}__dropped_{}", f.name, f.id);
                        cx.changes.push(format!("keep dropped column `{}` as `{}`", path(prefix, &tf.name), f.name));
                    }
                    out.push(Arc::new(f));
                } else {
                    cx.changes.push(format!("drop column `{}`", path(prefix, &tf.name)));
                    if cx.map.target_of(sid) == Some(tf.id) {
                        cx.map.ids.remove(&sid);
                    }
                }
            }
            Some(_) => out.push(tf.clone()),
            None => {
                // a target-only column someone added: kept, and it must not need values
                if tf.required {
                    cx.problems.push(format!(
                        "target column `{}` is required but the source has no such column; make it optional (ALTER TABLE … ALTER COLUMN {} DROP NOT NULL)",
                        path(prefix, &tf.name),
                        path(prefix, &tf.name)
                    ));
                }
                if names.contains(&tf.name) {
                    cx.problems.push(format!(
                        "target column `{}` is not the source column of that name (source snapshot {}); rename or drop it in the target",
                        path(prefix, &tf.name),
                        cx.snapshot
                    ));
                }
                out.push(tf.clone());
            }
        }
    }
    out
}

fn evolve_field(cx: &mut Ctx, prefix: &str, sf: &NestedField, tf: &NestedField) -> NestedField {
    let here = path(prefix, &sf.name);
    if sf.name != tf.name {
        cx.changes.push(format!("rename `{}` to `{}`", path(prefix, &tf.name), sf.name));
    }
    let field_type = evolve_type(cx, &here, &sf.field_type, &tf.field_type);
    // required only while both sides say so (a target column never becomes required again)
    let required = sf.required && tf.required;
    if tf.required && !required {
        cx.changes.push(format!("make `{here}` optional"));
    }
    NestedField {
        id: tf.id,
        name: sf.name.clone(),
        required,
        field_type: Box::new(field_type),
        doc: sf.doc.clone().or_else(|| tf.doc.clone()),
        initial_default: tf.initial_default.clone(),
        write_default: sf.write_default.clone().or_else(|| tf.write_default.clone()),
    }
}

fn evolve_type(cx: &mut Ctx, here: &str, st: &Type, tt: &Type) -> Type {
    match (st, tt) {
        (Type::Primitive(s), Type::Primitive(t)) => {
            if s == t || promotable(s, t) {
                // same, or the target is already wider: rows are cast on write
                tt.clone()
            } else if promotable(t, s) {
                cx.changes.push(format!("widen `{here}` from {t} to {s}"));
                st.clone()
            } else {
                cx.problems.push(format!(
                    "column `{here}` is {s} in source snapshot {} but {t} in the target, and {t} cannot become {s}; recreate the target or change the column there",
                    cx.snapshot
                ));
                tt.clone()
            }
        }
        (Type::Struct(s), Type::Struct(t)) => Type::Struct(StructType::new(evolve_struct(cx, here, s.fields(), Some(t.fields())))),
        (Type::List(s), Type::List(t)) => {
            let se = &s.element_field;
            let te = &t.element_field;
            cx.map.ids.insert(se.id, te.id);
            let e = evolve_field(cx, here, &NestedField { name: te.name.clone(), ..se.as_ref().clone() }, te);
            Type::List(ListType::new(Arc::new(e)))
        }
        (Type::Map(s), Type::Map(t)) => {
            cx.map.ids.insert(s.key_field.id, t.key_field.id);
            cx.map.ids.insert(s.value_field.id, t.value_field.id);
            let k = evolve_field(cx, here, &NestedField { name: t.key_field.name.clone(), ..s.key_field.as_ref().clone() }, &t.key_field);
            let v = evolve_field(cx, here, &NestedField { name: t.value_field.name.clone(), ..s.value_field.as_ref().clone() }, &t.value_field);
            Type::Map(MapType::new(Arc::new(k), Arc::new(v)))
        }
        _ => {
            cx.problems.push(format!("column `{here}` is {st} in source snapshot {} but {tt} in the target; recreate the target", cx.snapshot));
            tt.clone()
        }
    }
}

/// A source field (and everything nested in it) under fresh target ids.
fn new_field(cx: &mut Ctx, sf: &NestedField) -> NestedField {
    let id = cx.next_id;
    cx.next_id += 1;
    cx.map.ids.insert(sf.id, id);
    let field_type = new_type(cx, &sf.field_type);
    NestedField { id, field_type: Box::new(field_type), ..sf.clone() }
}

fn new_type(cx: &mut Ctx, t: &Type) -> Type {
    match t {
        Type::Primitive(_) => t.clone(),
        Type::Struct(s) => Type::Struct(StructType::new(s.fields().iter().map(|f| Arc::new(new_field(cx, f))).collect())),
        Type::List(l) => Type::List(ListType::new(Arc::new(new_field(cx, &l.element_field)))),
        Type::Map(m) => {
            let k = new_field(cx, &m.key_field);
            let v = new_field(cx, &m.value_field);
            Type::Map(MapType::new(Arc::new(k), Arc::new(v)))
        }
    }
}

/// A field and everything nested in it without default values (format v2 has none).
pub fn without_defaults(f: &NestedField) -> NestedField {
    let field_type = match f.field_type.as_ref() {
        Type::Primitive(_) => f.field_type.as_ref().clone(),
        Type::Struct(s) => Type::Struct(StructType::new(s.fields().iter().map(|c| Arc::new(without_defaults(c))).collect())),
        Type::List(l) => Type::List(ListType::new(Arc::new(without_defaults(&l.element_field)))),
        Type::Map(m) => Type::Map(MapType::new(Arc::new(without_defaults(&m.key_field)), Arc::new(without_defaults(&m.value_field)))),
    };
    NestedField { field_type: Box::new(field_type), initial_default: None, write_default: None, ..f.clone() }
}

/// The spec's type promotions: `from` can be read as `to`.
pub fn promotable(from: &PrimitiveType, to: &PrimitiveType) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (a, b) if a == b => true,
        (P::Int, P::Long) | (P::Float, P::Double) | (P::Date, P::Timestamp) | (P::Date, P::TimestampNs) => true,
        (P::Decimal { precision: p1, scale: s1 }, P::Decimal { precision: p2, scale: s2 }) => s1 == s2 && p2 >= p1,
        _ => false,
    }
}

/// The schema id a catalog gives `schema` when it is added to `meta`: an identical existing schema is reused.
pub fn added_schema_id(meta: &TableMetadata, schema: &Schema) -> i32 {
    let ids: HashSet<i32> = schema.identifier_field_ids().collect();
    meta.schemas_iter()
        .find(|s| s.as_struct() == schema.as_struct() && s.identifier_field_ids().collect::<HashSet<_>>() == ids)
        .map(|s| s.schema_id())
        .unwrap_or_else(|| meta.schemas_iter().map(|s| s.schema_id()).max().unwrap_or(0) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int() -> Type {
        Type::Primitive(PrimitiveType::Int)
    }
    fn string() -> Type {
        Type::Primitive(PrimitiveType::String)
    }
    fn schema(fields: Vec<NestedField>, ids: Vec<i32>) -> Schema {
        Schema::builder().with_fields(fields.into_iter().map(Arc::new).collect::<Vec<_>>()).with_identifier_field_ids(ids).build().unwrap()
    }

    #[test]
    fn rename_widen_add_drop_reorder_by_id() {
        // target ids differ from source ids: source 1,2,3 → target 10,11,12
        let target = schema(
            vec![NestedField::required(10, "id", int()), NestedField::optional(11, "name", string()), NestedField::optional(12, "gone", string())],
            vec![10],
        );
        let map = FieldMap { ids: BTreeMap::from([(1, 10), (2, 11), (3, 12)]) };
        // source: rename name→full_name, widen id? (key stays int), drop `gone`, re-add `gone` under a new id 4, move it first
        let source = schema(
            vec![
                NestedField::optional(4, "gone", Type::Primitive(PrimitiveType::Long)),
                NestedField::required(1, "id", int()),
                NestedField::optional(2, "full_name", string()),
            ],
            vec![1],
        );
        let e = evolve(&target, 12, &map, &source, &[1], 7, &HashSet::new(), EvolveOptions::default()).unwrap();
        assert!(e.changed);
        let names: Vec<_> = e.schema.as_struct().fields().iter().map(|f| (f.name.clone(), f.id)).collect();
        assert_eq!(names, vec![("gone".into(), 13), ("id".into(), 10), ("full_name".into(), 11)]);
        assert_eq!(e.map.ids, BTreeMap::from([(1, 10), (2, 11), (4, 13)]));
        assert_eq!(e.schema.identifier_field_ids().collect::<Vec<_>>(), vec![10]);
        // keeping dropped columns moves the old one out of the way
        let e = evolve(&target, 12, &map, &source, &[1], 7, &HashSet::new(), EvolveOptions { keep_dropped_columns: true, defaults_allowed: true })
            .unwrap();
        assert!(e.schema.field_by_name("gone__dropped_12").is_some());
        assert_eq!(e.schema.field_by_name("gone").unwrap().id, 13);
        // the same schema again: nothing to do
        let again =
            evolve(&e.schema, 13, &e.map, &source, &[1], 8, &HashSet::new(), EvolveOptions { keep_dropped_columns: true, defaults_allowed: true })
                .unwrap();
        assert!(!again.changed, "{:?}", again.changes);
    }

    #[test]
    fn widening_and_refusals() {
        let target = schema(vec![NestedField::required(1, "id", int()), NestedField::optional(2, "v", int())], vec![1]);
        let map = FieldMap { ids: BTreeMap::from([(1, 1), (2, 2)]) };
        let wider = schema(vec![NestedField::required(1, "id", int()), NestedField::optional(2, "v", Type::Primitive(PrimitiveType::Long))], vec![1]);
        let e = evolve(&target, 2, &map, &wider, &[1], 3, &HashSet::new(), EvolveOptions::default()).unwrap();
        assert_eq!(*e.schema.field_by_id(2).unwrap().field_type, Type::Primitive(PrimitiveType::Long));
        let incompatible = schema(vec![NestedField::required(1, "id", int()), NestedField::optional(2, "v", string())], vec![1]);
        let err = evolve(&target, 2, &map, &incompatible, &[1], 3, &HashSet::new(), EvolveOptions::default()).unwrap_err().to_string();
        assert!(err.contains("`v` is string in source snapshot 3"), "{err}");
        let no_key = schema(vec![NestedField::optional(2, "v", int())], vec![]);
        let err = evolve(&target, 2, &map, &no_key, &[1], 3, &HashSet::new(), EvolveOptions::default()).unwrap_err().to_string();
        assert!(err.contains("key column"), "{err}");
    }

    #[test]
    fn nested_fields_get_fresh_ids() {
        let target = schema(vec![NestedField::required(1, "id", int())], vec![1]);
        let map = FieldMap { ids: BTreeMap::from([(1, 1)]) };
        let source = schema(
            vec![
                NestedField::required(1, "id", int()),
                NestedField::optional(
                    5,
                    "m",
                    Type::Map(MapType::new(Arc::new(NestedField::required(6, "key", string())), Arc::new(NestedField::optional(7, "value", int())))),
                ),
            ],
            vec![1],
        );
        let e = evolve(&target, 1, &map, &source, &[1], 3, &HashSet::new(), EvolveOptions::default()).unwrap();
        assert_eq!(e.map.ids, BTreeMap::from([(1, 1), (5, 2), (6, 3), (7, 4)]));
        let rt = FieldMap::parse(&e.map.to_property()).unwrap();
        assert_eq!(rt, e.map);
    }
}
