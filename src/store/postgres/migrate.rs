//! The PostgreSQL schema's versions (`schema/postgres/`), with SQLite's rules: applied at
//! open, in one transaction under an advisory lock so that processes opening at once
//! migrate once; a database of a newer version is refused ([`Error::SchemaTooNew`]); a
//! read-only open of an older one is refused ([`Error::NeedsMigration`]). The table
//! `schema_version` records how many migrations ran.

use postgres::{Client, GenericClient};

use super::errors::backend;
use crate::error::{Error, Result};

/// Migrations, applied in order.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../schema/postgres/001_initial.sql"),
    include_str!("../../../schema/postgres/002_query_functions.sql"),
    include_str!("../../../schema/postgres/003_queue_controls.sql"),
    include_str!("../../../schema/postgres/004_queue_priority.sql"),
    include_str!("../../../schema/postgres/005_edge_successor_hash.sql"),
    include_str!("../../../schema/postgres/006_fact_type_unchecked.sql"),
    include_str!("../../../schema/postgres/007_first_edge_in_fact.sql"),
];

/// The schema version of the PostgreSQL backend this binary writes.
pub const PG_SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The advisory lock migrations run under ("prec" "migr").
const MIGRATE_LOCK: i64 = 0x7072_6563_6d69_6772;

/// How long an open waits for another process's migration before it fails as busy.
const MIGRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The version recorded in the database; 0 for an empty one.
fn version(client: &mut impl GenericClient) -> Result<u32> {
    let exists: bool = client
        .query_one(
            // pg_class read with the statement's snapshot, not through the catalog
            // cache: after waiting for the lock that cache may still say "absent" of a
            // table the process that held the lock created.
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.relname = 'schema_version' AND n.nspname = current_schema())",
            &[],
        )
        .map_err(backend)?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let v: i64 = client
        .query_one("SELECT coalesce(max(version), 0) FROM schema_version", &[])
        .map_err(backend)?
        .get(0);
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

/// Applies the migrations the database lacks.
pub(super) fn migrate(client: &mut Client, url: &str, read_only: bool) -> Result<()> {
    let found = version(client)?;
    if found == 0 && read_only {
        // As a read-only open of a missing SQLite file: nothing to read, nothing made.
        return Err(super::errors::open(
            url,
            "no precedent schema in this database, and a read-only open creates none \
             (create it with `precedent init`)"
                .into(),
        ));
    }
    if !crate::store::shared::needs_migration(found, PG_SCHEMA_VERSION, read_only, url.as_ref())? {
        return Ok(());
    }
    // READ COMMITTED whatever the database's default, so that the version read again
    // under the lock sees a migration another process committed while this one waited
    // (under REPEATABLE READ the snapshot would be the lock statement's, from before).
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::ReadCommitted)
        .start()
        .map_err(backend)?;
    // Another process's migration is waited for up to MIGRATION_WAIT, not the busy
    // timeout: a server started beside one that is migrating a large database starts
    // after it, where it failed as busy. Bounded still: a migrating process whose host
    // died keeps its session, and the lock, until TCP gives up on it (hours). The
    // migration's own statements keep the busy timeout, so that it does not wait long
    // behind an older server's locks.
    let bound: String = tx
        .query_one("SELECT current_setting('lock_timeout')", &[])
        .map_err(backend)?
        .get(0);
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}",
        MIGRATION_WAIT.as_millis()
    ))
    .map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .map_err(backend)?;
    tx.execute("SELECT set_config('lock_timeout', $1, true)", &[&bound])
        .map_err(backend)?;
    // Read again under the lock: another process may have migrated meanwhile.
    let now = version(&mut tx)?;
    if now > PG_SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            supported: PG_SCHEMA_VERSION,
            found: now,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(now as usize) {
        tx.batch_execute(sql).map_err(backend)?;
        tx.execute("UPDATE schema_version SET version = $1", &[&(i as i64 + 1)])
            .map_err(backend)?;
    }
    tx.commit().map_err(backend)
}
