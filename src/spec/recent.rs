//! A table's metadata with only its recent snapshots: what following a table needs, parsed at a cost that does not
//! grow with the table's history.
//!
//! A metadata file lists every snapshot the table keeps (and a log entry for each), so a table with a long history
//! has a large file, and iceberg-rust parses all of it: each snapshot with its summary map, through serde's buffered
//! untagged enum. A loop that follows the table needs the snapshots from the one its sinks recorded on. So
//! [`parse_recent`] first walks the document's structure only (brackets and strings, no values decoded, no
//! allocation per snapshot), drops the snapshots older than a sequence number and their log entries, and hands the
//! rest — the same document, shorter — to iceberg-rust's parser, which validates what is kept as usual.
//!
//! Invariants: every member other than `snapshots` and `snapshot-log` is passed on byte for byte; a kept snapshot or
//! log entry is passed on byte for byte; kept are the snapshots with a sequence number at or above `since`, the
//! current one and every one a ref names (iceberg-rust checks refs). Anything the walk does not understand (not an
//! object, a key with an escape, a number that does not parse, gzip) means no trimming: the whole file is parsed as
//! before, and its errors are the parser's. Dropping snapshots changes what lineage walks see: they stop at the
//! oldest kept snapshot, as at an expired one — callers check that what they need is kept
//! ([`holds_lineage`]).
use std::collections::HashSet;
use std::ops::Range;

use iceberg::spec::TableMetadata;

/// Parses metadata file `bytes`, keeping the snapshots with a sequence number of at least `since` (and those the
/// table names: current, refs); also returns how many were dropped (0: the whole file was parsed). See the module
/// header.
pub(crate) fn parse_recent(bytes: &[u8], since: i64) -> serde_json::Result<(TableMetadata, usize)> {
    match trimmed(bytes, since) {
        Some((doc, dropped)) if dropped > 0 => Ok((serde_json::from_slice(&doc)?, dropped)),
        _ => Ok((serde_json::from_slice(bytes)?, 0)),
    }
}

/// Whether every one of `recorded` (snapshot ids) is an ancestor of the current snapshot in `meta` (metadata with
/// snapshots dropped): then every range from one of them to a later snapshot of the main branch is there in full.
pub(crate) fn holds_lineage(meta: &TableMetadata, recorded: &[Option<i64>]) -> bool {
    recorded.iter().all(|r| match (r, meta.current_snapshot_id()) {
        (Some(r), Some(head)) => super::lineage::is_ancestor(meta, *r, head),
        _ => false,
    })
}

/// The document without the snapshots older than `since` and their log entries, and how many were dropped; `None`
/// when the walk does not understand the document.
fn trimmed(b: &[u8], since: i64) -> Option<(Vec<u8>, usize)> {
    let members = object_members(b, 0)?;
    let member = |name: &str| members.iter().find(|(k, _)| &b[k.clone()] == name.as_bytes()).map(|(_, v)| v.clone());
    let snapshots = array_elements(b, member("snapshots")?.start)?;
    // the snapshots the table names must stay (iceberg-rust checks them)
    let mut named: HashSet<i64> = member("current-snapshot-id").and_then(|v| number(b, v)).into_iter().collect();
    if let Some(refs) = member("refs") {
        for (_, r) in object_members(b, refs.start)? {
            let [id] = fields(b, r, ["snapshot-id"])?;
            named.insert(number(b, id?)?);
        }
    }
    let mut kept_ids = HashSet::new();
    let mut kept = Vec::new();
    for s in &snapshots {
        let [id, seq] = fields(b, s.clone(), ["snapshot-id", "sequence-number"])?;
        let id = number(b, id?)?;
        // v1: no sequence numbers, nothing to trim by
        let seq = match seq {
            Some(v) => number(b, v)?,
            None => 0,
        };
        if seq >= since || named.contains(&id) {
            kept_ids.insert(id);
            kept.push(s.clone());
        }
    }
    let dropped = snapshots.len() - kept.len();
    if dropped == 0 {
        return Some((Vec::new(), 0));
    }
    let log = match member("snapshot-log") {
        Some(v) => {
            let mut entries = Vec::new();
            for e in array_elements(b, v.start)? {
                let [id] = fields(b, e.clone(), ["snapshot-id"])?;
                if kept_ids.contains(&number(b, id?)?) {
                    entries.push(e);
                }
            }
            Some(entries)
        }
        None => None,
    };
    let mut out = Vec::with_capacity(b.len() / 2);
    out.push(b'{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(&b[k.clone()]);
        out.extend_from_slice(b"\":");
        match &b[k.clone()] {
            b"snapshots" => join(&mut out, b, &kept),
            b"snapshot-log" => join(&mut out, b, log.as_deref().unwrap_or_default()),
            _ => out.extend_from_slice(&b[v.clone()]),
        }
    }
    out.push(b'}');
    Some((out, dropped))
}

/// Appends `[e1,e2,…]` of `elements` (ranges of `b`) to `out`.
fn join(out: &mut Vec<u8>, b: &[u8], elements: &[Range<usize>]) {
    out.push(b'[');
    for (i, e) in elements.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&b[e.clone()]);
    }
    out.push(b']');
}

/// The values of members `names` of the object at `value` (`None` inside: no such member), in one walk; `None`
/// when it is not an object the walk understands.
fn fields<const N: usize>(b: &[u8], value: Range<usize>, names: [&str; N]) -> Option<[Option<Range<usize>>; N]> {
    let mut out = [const { None }; N];
    let mut found = 0;
    // stops at the last name found: the rest of a snapshot (its summary) is not walked again — the array's walk
    // already found where it ends (writers put the ids first)
    members(b, value.start, |k, v| {
        if let Some(i) = names.iter().position(|n| n.as_bytes() == &b[k.clone()]) {
            found += usize::from(out[i].is_none());
            out[i] = Some(v);
        }
        if found == N {
            Walk::Stop
        } else {
            Walk::On
        }
    })?;
    Some(out)
}

/// The integer at `value`.
fn number(b: &[u8], value: Range<usize>) -> Option<i64> {
    std::str::from_utf8(&b[value]).ok()?.parse().ok()
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string whose opening quote is at `i`.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[i] == b'"' {
            return Some(i + 1);
        }
        i += 2;
    }
}

/// Bytes that matter to [`value`]'s bracket walk: quotes and brackets.
const STRUCTURAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'"' as usize] = true;
    t[b'{' as usize] = true;
    t[b'[' as usize] = true;
    t[b'}' as usize] = true;
    t[b']' as usize] = true;
    t
};

/// The range of the value starting at or after `i` (whitespace skipped): brackets and strings are followed, scalars
/// run to the next delimiter. Nothing is decoded.
fn value(b: &[u8], i: usize) -> Option<Range<usize>> {
    let start = skip_ws(b, i);
    match *b.get(start)? {
        b'"' => Some(start..string_end(b, start)?),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, start);
            loop {
                j += b.get(j..)?.iter().position(|c| STRUCTURAL[*c as usize])?;
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(start..j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let end = b[start..].iter().position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')).map_or(b.len(), |n| start + n);
            (end > start).then_some(start..end)
        }
    }
}

/// The members of the object starting at or after `i`: each key's range (inside the quotes) and its value's.
/// `None` when it is not an object or a key has an escape.
fn object_members(b: &[u8], i: usize) -> Option<Vec<(Range<usize>, Range<usize>)>> {
    let mut out = Vec::new();
    members(b, i, |k, v| {
        out.push((k, v));
        Walk::On
    })?;
    Some(out)
}

/// Whether [`members`] goes on to the next member.
#[derive(PartialEq)]
enum Walk {
    On,
    Stop,
}

/// Calls `each` with every member (key range, value range) of the object starting at or after `i`, in order, until
/// it says stop; see [`object_members`].
fn members(b: &[u8], i: usize, mut each: impl FnMut(Range<usize>, Range<usize>) -> Walk) -> Option<()> {
    let mut j = skip_ws(b, i);
    if b.get(j) != Some(&b'{') {
        return None;
    }
    j = skip_ws(b, j + 1);
    if b.get(j) == Some(&b'}') {
        return Some(());
    }
    loop {
        if b.get(j) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(b, j)?;
        let key = j + 1..key_end - 1;
        if b[key.clone()].contains(&b'\\') {
            return None;
        }
        j = skip_ws(b, key_end);
        if b.get(j) != Some(&b':') {
            return None;
        }
        let v = value(b, j + 1)?;
        j = skip_ws(b, v.end);
        if each(key, v) == Walk::Stop {
            return Some(());
        }
        match b.get(j)? {
            b',' => j = skip_ws(b, j + 1),
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

/// The elements of the array starting at or after `i`.
fn array_elements(b: &[u8], i: usize) -> Option<Vec<Range<usize>>> {
    let mut j = skip_ws(b, i);
    if b.get(j) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    j = skip_ws(b, j + 1);
    if b.get(j) == Some(&b']') {
        return Some(out);
    }
    loop {
        let v = value(b, j)?;
        j = skip_ws(b, v.end);
        out.push(v);
        match b.get(j)? {
            b',' => j = skip_ws(b, j + 1),
            b']' => return Some(out),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 metadata document of `n` snapshots (sequence numbers 1..=n, each the parent of the next), a tag on the
    /// first, `main` at the last.
    pub(crate) fn history(n: i64) -> String {
        let snaps: Vec<String> = (1..=n)
            .map(|i| {
                let parent = if i > 1 { format!("\"parent-snapshot-id\": {},", 1000 + i - 1) } else { String::new() };
                format!(
                    r#"{{"snapshot-id": {id}, {parent} "sequence-number": {i}, "timestamp-ms": {ts}, "manifest-list": "s3://b/t/metadata/snap-{id}.avro", "summary": {{"operation": "append", "added-data-files": "1", "note": "has \"quotes\", ] and }} in it"}}, "schema-id": 0}}"#,
                    id = 1000 + i,
                    ts = 1_700_000_000_000 + i * 1000
                )
            })
            .collect();
        let log: Vec<String> =
            (1..=n).map(|i| format!(r#"{{"snapshot-id": {}, "timestamp-ms": {}}}"#, 1000 + i, 1_700_000_000_000 + i * 1000)).collect();
        format!(
            r#"{{
  "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1", "location": "s3://b/t",
  "last-sequence-number": {n}, "last-updated-ms": {last}, "last-column-id": 1,
  "current-schema-id": 0, "schemas": [{{"type": "struct", "schema-id": 0, "fields": [{{"id": 1, "name": "id", "required": true, "type": "long"}}]}}],
  "default-spec-id": 0, "partition-specs": [{{"spec-id": 0, "fields": []}}], "last-partition-id": 999,
  "default-sort-order-id": 0, "sort-orders": [{{"order-id": 0, "fields": []}}],
  "properties": {{"owner": "x"}},
  "current-snapshot-id": {cur},
  "refs": {{"main": {{"snapshot-id": {cur}, "type": "branch"}}, "first": {{"snapshot-id": 1001, "type": "tag"}}}},
  "snapshots": [{snaps}],
  "snapshot-log": [{log}],
  "metadata-log": []
}}"#,
            last = 1_700_000_000_000 + n * 1000 + 1,
            cur = 1000 + n,
            snaps = snaps.join(",\n"),
            log = log.join(", ")
        )
    }

    #[test]
    fn keeps_the_recent_snapshots_and_those_the_table_names_and_nothing_else_changes() {
        let doc = history(50);
        let full: TableMetadata = serde_json::from_str(&doc).unwrap();
        let (meta, dropped) = parse_recent(doc.as_bytes(), 45).unwrap();
        let ids = |m: &TableMetadata| {
            let mut v: Vec<i64> = m.snapshots().map(|s| s.snapshot_id()).collect();
            v.sort();
            v
        };
        assert_eq!(ids(&meta), vec![1001, 1045, 1046, 1047, 1048, 1049, 1050], "seq ≥ 45, plus the tagged first");
        assert_eq!(dropped, 43);
        for id in ids(&meta) {
            assert_eq!(meta.snapshot_by_id(id), full.snapshot_by_id(id), "a kept snapshot is as the full parse has it");
        }
        assert_eq!(meta.history().iter().map(|e| e.snapshot_id).collect::<Vec<_>>(), ids(&meta));
        assert_eq!(
            (meta.uuid(), meta.current_snapshot_id(), meta.last_sequence_number(), meta.properties()),
            (full.uuid(), full.current_snapshot_id(), full.last_sequence_number(), full.properties())
        );
        assert_eq!(meta.current_schema(), full.current_schema());
        // lineage from a kept snapshot is whole; from a dropped one it is not there to judge
        assert!(holds_lineage(&meta, &[Some(1045), Some(1050)]));
        assert!(!holds_lineage(&meta, &[Some(1044)]), "dropped");
        assert!(!holds_lineage(&meta, &[Some(1001)]), "kept, but its lineage to the head is not");
        assert!(!holds_lineage(&meta, &[None]));
    }

    #[test]
    fn parses_everything_when_nothing_is_old_enough_or_the_walk_does_not_understand() {
        let doc = history(5);
        assert_eq!(parse_recent(doc.as_bytes(), 1).unwrap().1, 0);
        assert_eq!(parse_recent(doc.as_bytes(), 1).unwrap().0.snapshots().count(), 5);
        // an escaped key: no trimming, the parser decides
        let escaped = doc.replacen("\"properties\"", "\"prop\\u0065rties\"", 1);
        assert_eq!(parse_recent(escaped.as_bytes(), 4).unwrap().1, 0);
        // a damaged file is the parser's error, as before
        assert!(parse_recent(&doc.as_bytes()[..doc.len() / 2], 4).is_err());
        assert!(parse_recent(b"[1, 2]", 4).is_err());
    }

    #[test]
    fn the_walk_follows_strings_and_nesting() {
        let b = br#" { "a" : [1, {"x": "]}\"\\"}], "b":-3.5e2 , "c": {} ,"d":[] } "#;
        let m = object_members(b, 0).unwrap();
        let keys: Vec<&[u8]> = m.iter().map(|(k, _)| &b[k.clone()]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b", b"c", b"d"]);
        assert_eq!(&b[m[0].1.clone()], br#"[1, {"x": "]}\"\\"}]"#);
        assert_eq!(&b[m[1].1.clone()], b"-3.5e2");
        assert_eq!(array_elements(b, m[0].1.start).unwrap().len(), 2);
        assert_eq!(array_elements(b, m[3].1.start).unwrap().len(), 0);
        assert!(object_members(br#"{"a": [1, 2}"#, 0).is_none(), "unbalanced");
        assert!(object_members(br#"{"a": "open}"#, 0).is_none(), "unterminated string");
    }

    /// Not a test of behaviour: prints what the full and the recent parse of a long history cost here.
    #[test]
    #[ignore]
    fn cost_of_a_long_history() {
        for n in [10, 3000, 10_000] {
            let doc = history(n);
            let t = std::time::Instant::now();
            for _ in 0..5 {
                let _: TableMetadata = serde_json::from_str(&doc).unwrap();
            }
            let full = t.elapsed() / 5;
            let t = std::time::Instant::now();
            for _ in 0..5 {
                parse_recent(doc.as_bytes(), n - 1).unwrap();
            }
            println!("{n} snapshots, {} KB: full {full:?}, recent {:?}", doc.len() / 1024, t.elapsed() / 5);
        }
    }
}
