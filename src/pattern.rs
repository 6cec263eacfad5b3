//! Table patterns and name templates: how one pipeline of a service file stands for every table of a lake that
//! matches it.
//!
//! A pattern is matched against `namespace.table` (nested namespaces joined by dots): `*` is any run of characters
//! within one part (never a dot), `**` any run including dots, `?` one character other than a dot; everything else
//! stands for itself. A table is matched when some pattern of `tables` matches it and none of `exclude` does.
//!
//! A template names what a matched table replicates to: `{namespace}` is the table's namespace (dotted), `{table}` its
//! name. A template without `{table}` would send every matched table to one place, so it is refused.
use std::collections::BTreeSet;

/// The placeholder of a matched table's name in a template.
pub const TABLE: &str = "{table}";
/// The placeholder of a matched table's namespace (dotted) in a template.
pub const NAMESPACE: &str = "{namespace}";
/// The table name a pipeline of patterns is validated with (its sinks' templates filled with it).
pub(crate) const SAMPLE_TABLE: &str = "namespace.table";

/// The tables a pipeline stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TablePatterns<'a> {
    pub(crate) tables: &'a [String],
    pub(crate) exclude: &'a [String],
}

impl TablePatterns<'_> {
    /// Whether `name` (`namespace.table`) is one of them.
    pub(crate) fn matches(&self, name: &str) -> bool {
        self.tables.iter().any(|p| glob(p, name)) && !self.exclude.iter().any(|p| glob(p, name))
    }

    /// Those of `names` that match, in order.
    pub(crate) fn select<'n>(&self, names: &'n [String]) -> Vec<&'n String> {
        names.iter().filter(|n| self.matches(n)).collect()
    }

    /// The problems of the patterns (named `at.tables` / `at.exclude`) of a source whose `table` is given too (`""`:
    /// not given, as it must be).
    pub(crate) fn validate(&self, at: &str, table: &str, p: &mut Vec<String>) {
        if !table.is_empty() {
            p.push(format!("{at}: give `table` (one table) or `tables` (patterns), not both"));
        }
        if self.tables.is_empty() {
            p.push(format!("{at}.tables: no pattern; give e.g. [\"sales.*\"]"));
        }
        for (field, list) in [("tables", self.tables), ("exclude", self.exclude)] {
            let mut seen = BTreeSet::new();
            for pat in list {
                if pat.trim().is_empty() || pat.starts_with('.') || pat.ends_with('.') || pat.contains("..") {
                    p.push(format!("{at}.{field}: `{pat}` is not a pattern of `namespace.table` names (e.g. \"sales.*\")"));
                } else if !pat.contains('.') && !pat.contains("**") {
                    p.push(format!("{at}.{field}: `{pat}` has no namespace part; match `namespace.table`, e.g. \"*.{pat}\" or \"**\""));
                } else if !seen.insert(pat) {
                    p.push(format!("{at}.{field}: `{pat}` is listed twice"));
                }
            }
        }
    }
}

/// Whether glob `pattern` matches `name` (see the module header).
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    fn at(p: &[u8], n: &[u8]) -> bool {
        match p {
            [] => n.is_empty(),
            [b'*', b'*', rest @ ..] => (0..=n.len()).any(|i| at(rest, &n[i..])),
            [b'*', rest @ ..] => {
                let part = n.iter().position(|c| *c == b'.').unwrap_or(n.len());
                (0..=part).any(|i| at(rest, &n[i..]))
            }
            [b'?', rest @ ..] => n.first().is_some_and(|c| *c != b'.') && at(rest, &n[1..]),
            [c, rest @ ..] => n.first() == Some(c) && at(rest, &n[1..]),
        }
    }
    at(pattern.as_bytes(), name.as_bytes())
}

/// `template` for table `name` (`namespace.table`): its placeholders filled.
pub(crate) fn fill(template: &str, name: &str) -> String {
    let (ns, table) = name.rsplit_once('.').unwrap_or(("", name));
    template.replace(NAMESPACE, ns).replace(TABLE, table)
}

/// A table name `template` gives `filled` for (`fill(template, name) == filled`) that `accept` takes, when the
/// template names both the namespace and the table; `None` when there is none, or the template cannot tell (no
/// `{namespace}`). Finds which source table a destination was named for. Pure.
pub(crate) fn unfill(template: &str, filled: &str, accept: impl Fn(&str) -> bool) -> Option<String> {
    if !template.contains(NAMESPACE) || !template.contains(TABLE) {
        return None;
    }
    /// Matches `t` (a template's rest) against `s`, the placeholders bound so far in `ns` and `table`.
    fn at<'s>(t: &str, s: &'s str, ns: Option<&'s str>, table: Option<&'s str>, accept: &dyn Fn(&str) -> bool) -> Option<String> {
        if t.is_empty() {
            let name = format!("{}.{}", ns?, table?);
            return (s.is_empty() && accept(&name)).then_some(name);
        }
        let (placeholder, rest) = match (t.strip_prefix(NAMESPACE), t.strip_prefix(TABLE)) {
            (Some(rest), _) => (NAMESPACE, rest),
            (_, Some(rest)) => (TABLE, rest),
            _ => {
                let c = t.chars().next()?;
                return s.strip_prefix(c).and_then(|s| at(&t[c.len_utf8()..], s, ns, table, accept));
            }
        };
        let bound = if placeholder == NAMESPACE { ns } else { table };
        if let Some(v) = bound {
            return s.strip_prefix(v).and_then(|s| at(rest, s, ns, table, accept));
        }
        // every non-empty prefix of `s` (a table name holds no dot; a namespace may)
        s.char_indices().skip(1).map(|(i, _)| i).chain([s.len()]).find_map(|end| {
            let v = &s[..end];
            if placeholder == TABLE && v.contains('.') {
                return None;
            }
            let (ns, table) = if placeholder == NAMESPACE { (Some(v), table) } else { (ns, Some(v)) };
            at(rest, &s[end..], ns, table, accept)
        })
    }
    at(template, filled, None, None, &accept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_name_tells_the_table_it_was_filled_for() {
        let any = |_: &str| true;
        assert_eq!(unfill("replica_{namespace}.{table}", "replica_sales.orders", any).as_deref(), Some("sales.orders"));
        assert_eq!(unfill("replica_{namespace}.{table}", "replica_sales.eu.orders", any).as_deref(), Some("sales.eu.orders"), "nested");
        assert_eq!(unfill("dr.{namespace}_{table}_v1", "dr.ops_events_v1", any).as_deref(), Some("ops.events"));
        assert_eq!(unfill("replica_{namespace}.{table}", "other.orders", any), None, "not one of its fillings");
        assert_eq!(unfill("dr.{table}", "dr.orders", any), None, "the namespace cannot be told");
        // ambiguous fillings: the one `accept` takes
        let found = unfill("dr.{namespace}_{table}", "dr.a_b_c", |n| n == "a_b.c");
        assert_eq!(found.as_deref(), Some("a_b.c"));
        for (t, name) in [("replica_{namespace}.{table}", "a.b.c"), ("dr.{namespace}_{table}_v1", "ops.events")] {
            assert_eq!(unfill(t, &fill(t, name), any).as_deref(), Some(name), "{t}");
        }
    }

    #[test]
    fn stars_stay_within_a_part_and_double_stars_cross_dots() {
        assert!(glob("sales.*", "sales.orders"));
        assert!(!glob("sales.*", "sales.eu.orders"), "one part only");
        assert!(glob("sales.**", "sales.eu.orders"));
        assert!(glob("**", "a.b.c"));
        assert!(glob("ops.events_*", "ops.events_eu"));
        assert!(!glob("ops.events_*", "ops.event"));
        assert!(glob("*.t?", "x.t1") && !glob("*.t?", "x.t12"));
        assert!(!glob("sales?orders", "sales.orders"), "? is never a dot");
        assert!(glob("a.*.c", "a.b.c") && !glob("a.*.c", "a.b.x.c"));
        assert!(glob("sales.orders", "sales.orders") && !glob("sales.orders", "sales.orders2"));
    }

    #[test]
    fn exclusions_win_and_bad_patterns_are_named() {
        let (tables, exclude) = (vec!["sales.*".to_string(), "ops.events_*".into()], vec!["sales.tmp_*".to_string()]);
        let p = TablePatterns { tables: &tables, exclude: &exclude };
        let names: Vec<String> = ["sales.orders", "sales.tmp_x", "ops.events_a", "ops.audit", "hr.people"].map(String::from).into();
        assert_eq!(p.select(&names), vec!["sales.orders", "ops.events_a"]);
        let mut problems = Vec::new();
        let bad = vec!["orders".to_string(), "sales.".into(), "a.*".into(), "a.*".into(), "**".into()];
        TablePatterns { tables: &bad, exclude: &[] }.validate("pipelines[0].source", "", &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("no namespace part"), "{problems:?}");
        assert!(problems[2].contains("twice"), "{problems:?}");
        let mut problems = Vec::new();
        TablePatterns { tables: &[], exclude: &[] }.validate("x", "", &mut problems);
        assert_eq!(problems, vec!["x.tables: no pattern; give e.g. [\"sales.*\"]"]);
    }

    #[test]
    fn templates_take_the_namespace_and_the_name() {
        assert_eq!(fill("replica_{namespace}.{table}", "sales.orders"), "replica_sales.orders");
        assert_eq!(fill("dr.{namespace}_{table}", "a.b.c"), "dr.a.b_c");
        assert_eq!(fill("cdc.{namespace}.{table}", "ops.events"), "cdc.ops.events");
    }
}
