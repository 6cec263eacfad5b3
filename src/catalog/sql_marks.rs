//! The idle check of a sqlite catalog, without sqlx: one indexed `SELECT` of a table's metadata location on a
//! synchronous read-only connection, run on the caller's task.
//!
//! Why: a service polls thousands of caught-up tables, and each idle poll asks the catalog whether the table's
//! metadata location moved. Through sqlx every query hops to the pool's worker thread and back (two channel sends,
//! two thread wake-ups), which was most of an idle poll's CPU. The query itself takes microseconds.
//!
//! Invariants:
//! - Only answers, never decides: any failure (no database file, `SQLITE_BUSY`, a schema it cannot read) returns
//!   `None`, and the caller asks through sqlx, which reports errors properly.
//! - Never waits: the connection has no busy timeout, so a writer holding the database cannot stall a runtime
//!   thread. The catalog runs in WAL mode, where readers do not wait for writers anyway.
//! - Each query sees the latest committed state (autocommit: a new read transaction per statement).
use std::path::PathBuf;
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

const QUERY: &str = "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3";

/// A lazily opened read-only connection to a sqlite catalog's database file.
pub struct SqlMarks {
    /// The database file; `None` for what has no file (an in-memory database): never answered here.
    path: Option<PathBuf>,
    connection: Mutex<Option<Connection>>,
}

impl SqlMarks {
    /// For the database sqlx reaches at `uri` (`sqlite:PATH[?…]`, `sqlite://PATH[?…]`).
    pub(crate) fn new(uri: &str) -> SqlMarks {
        let rest = uri.strip_prefix("sqlite://").or_else(|| uri.strip_prefix("sqlite:")).unwrap_or(uri);
        let file = rest.split('?').next().unwrap_or_default();
        let path = (!file.is_empty() && !file.contains(":memory:")).then(|| PathBuf::from(file));
        SqlMarks { path, connection: Mutex::new(None) }
    }

    /// The metadata location of `namespace.table` in catalog `catalog`: `Some(None)` when there is no such table,
    /// `None` when this cannot tell (the caller asks through sqlx).
    pub(crate) fn metadata_location(&self, catalog: &str, namespace: &str, table: &str) -> Option<Option<String>> {
        let path = self.path.as_ref()?;
        let mut held = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_none() {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            *held = Some(Connection::open_with_flags(path, flags).ok()?);
        }
        let connection = held.as_ref()?;
        let found = connection
            .prepare_cached(QUERY)
            .and_then(|mut q| q.query_row((catalog, namespace, table), |row| row.get::<_, Option<String>>(0)).optional());
        match found {
            Ok(location) => Some(location.flatten()),
            Err(_) => {
                // a broken connection is opened afresh next time
                *held = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_from_the_file_and_leaves_the_rest_to_sqlx() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("catalog.db");
        let w = Connection::open(&db).unwrap();
        w.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE iceberg_tables (catalog_name TEXT, table_namespace TEXT, table_name TEXT, \
             metadata_location TEXT, previous_metadata_location TEXT);
             INSERT INTO iceberg_tables VALUES ('c', 'ns', 't', 'v1.json', NULL);",
        )
        .unwrap();
        let marks = SqlMarks::new(&format!("sqlite:{}?mode=rwc", db.display()));
        assert_eq!(marks.metadata_location("c", "ns", "t"), Some(Some("v1.json".into())));
        assert_eq!(marks.metadata_location("c", "ns", "other"), Some(None), "no such table");
        // a commit by another connection is seen by the next query
        w.execute("UPDATE iceberg_tables SET metadata_location = 'v2.json' WHERE table_name = 't'", ()).unwrap();
        assert_eq!(marks.metadata_location("c", "ns", "t"), Some(Some("v2.json".into())));
        // what it cannot read it does not answer
        assert_eq!(SqlMarks::new("sqlite::memory:").metadata_location("c", "ns", "t"), None);
        assert_eq!(SqlMarks::new(&format!("sqlite://{}/missing.db", dir.path().display())).metadata_location("c", "ns", "t"), None);
        w.execute_batch("DROP TABLE iceberg_tables").unwrap();
        assert_eq!(marks.metadata_location("c", "ns", "t"), None, "a schema it cannot read");
    }
}
