//! What the backends share beyond the seam: the rules they apply to what their SQL read
//! (a prefix's matches, a schema version, `verify`'s checks), and the forwarding of a
//! write transaction's reads to its read side. Each backend reads rows its own way and
//! hands them here, so the rules are written once.

use std::collections::BTreeSet;
use std::path::Path;

use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};

use super::VerifyReport;

/// The answer to a prefix from the stored hashes it matched (released and held, at most
/// 11 of each): the one, none, or ambiguous with up to ten.
pub(crate) fn resolved(prefix: &HashPrefix, mut found: Vec<FactHash>) -> Result<FactHash> {
    found.sort();
    found.dedup();
    match found.len() {
        0 => Err(Error::UnknownPrefix {
            prefix: prefix.text(),
        }),
        1 => Ok(found[0]),
        _ => {
            found.truncate(10);
            Err(Error::AmbiguousPrefix {
                prefix: prefix.text(),
                candidates: found,
            })
        }
    }
}

/// Whether a database at schema version `found` must be migrated to `supported`:
/// refuses a newer one, and, when `read_only`, one that needs migrating.
pub(crate) fn needs_migration(
    found: u32,
    supported: u32,
    read_only: bool,
    path: &Path,
) -> Result<bool> {
    if found > supported {
        return Err(Error::SchemaTooNew { supported, found });
    }
    if found == supported {
        return Ok(false);
    }
    if read_only {
        return Err(Error::NeedsMigration {
            path: path.to_path_buf(),
            found,
            supported,
        });
    }
    Ok(true)
}

/// An edge of a released fact as `verify` reads it.
pub(crate) struct EdgeRow {
    pub(crate) role: String,
    pub(crate) predecessor: Vec<u8>,
    pub(crate) predecessor_seq: i64,
    /// The edge's `predecessor_type`, the predecessor's `type_id`, the edge's
    /// `successor_type`.
    pub(crate) types: [i64; 3],
}

/// Checks a released fact's edges against its bytes, the release order and the types.
pub(crate) fn check_edges(
    report: &mut VerifyReport,
    hash: FactHash,
    fact: &Fact,
    (seq, type_id): (i64, i64),
    edges: Vec<EdgeRow>,
) {
    let mut seen = BTreeSet::new();
    for e in edges {
        let pseq = e.predecessor_seq;
        if pseq >= seq {
            report.problem(
                Some(hash),
                format!("predecessor seq {pseq} is not below its own seq {seq}"),
            );
        }
        let [edge_pred, pred, edge_succ] = e.types;
        if edge_pred != pred || edge_succ != type_id {
            report.problem(
                Some(hash),
                format!(
                    "edge to {} (role {}) gives types {edge_pred} -> {edge_succ}, \
                     the facts have {pred} -> {type_id}",
                    hex::encode(&e.predecessor),
                    e.role
                ),
            );
        }
        seen.insert((e.role, e.predecessor));
    }
    let expected: BTreeSet<(String, Vec<u8>)> = fact
        .predecessors()
        .iter()
        .flat_map(|(role, set)| set.iter().map(move |h| (role.clone(), h.0.to_vec())))
        .collect();
    for (role, p) in expected.difference(&seen) {
        report.problem(
            Some(hash),
            format!(
                "predecessor {} (role {role}) is not released before it",
                hex::encode(p)
            ),
        );
    }
    for (role, p) in seen.difference(&expected) {
        report.problem(
            Some(hash),
            format!(
                "edge to {} (role {role}) that its bytes do not name",
                hex::encode(p)
            ),
        );
    }
}

/// `verify`'s problem for `count` edge rows whose successor is no released fact, the
/// lowest such successor `first`.
pub(crate) fn orphan_edges(count: i64, first: Option<i64>) -> String {
    format!(
        "{count} edge row(s) name a successor that is no released fact (the first: seq {})",
        first.unwrap_or_default()
    )
}

/// Checks a released fact's type name against its bytes.
pub(crate) fn check_type(
    report: &mut VerifyReport,
    hash: FactHash,
    fact: &Fact,
    type_name: Option<&str>,
) {
    if type_name != Some(fact.type_name()) {
        report.problem(
            Some(hash),
            format!(
                "type column says {type_name:?}, bytes say {:?}",
                fact.type_name()
            ),
        );
    }
}

/// Checks a held fact: not released, some predecessor absent, a wait recorded for each
/// absent one, and its `missing` count. `released` tells whether a hash is released;
/// `waits_for` whether the held row waits for a hash. Returns its `missing` count.
pub(crate) fn check_held(
    report: &mut VerifyReport,
    hash: FactHash,
    fact: &Fact,
    missing: i64,
    released: &mut dyn FnMut(&FactHash) -> Result<bool>,
    waits_for: &mut dyn FnMut(&FactHash) -> Result<bool>,
) -> Result<i64> {
    if released(&hash)? {
        report.problem(Some(hash), "both held and released");
    }
    let mut absent = BTreeSet::new();
    for p in fact.predecessor_hashes() {
        if !released(&p)? {
            absent.insert(p);
        }
    }
    if absent.is_empty() {
        report.problem(Some(hash), "held although every predecessor is released");
    }
    for p in &absent {
        if !waits_for(p)? {
            report.problem(
                Some(hash),
                format!("does not wait for absent predecessor {p}"),
            );
        }
    }
    if missing != absent.len() as i64 {
        report.problem(
            Some(hash),
            format!(
                "missing count {missing} but {} predecessors are absent",
                absent.len()
            ),
        );
    }
    Ok(missing)
}

/// What `verify` counted over the whole held set.
pub(crate) struct HeldTotals {
    /// The `held` counter.
    pub(crate) counter: i64,
    /// Hashes held more than once.
    pub(crate) twice: i64,
    /// Wait rows (`held_wait` and `held_child`).
    pub(crate) rows: i64,
    /// Wait rows naming no held row.
    pub(crate) orphans: i64,
    /// The held rows' `missing` counts, added up.
    pub(crate) missing: i64,
}

/// Checks the held set's totals against the rows `verify` read.
pub(crate) fn check_held_totals(report: &mut VerifyReport, t: HeldTotals) {
    if t.counter != report.held as i64 {
        report.problem(
            None,
            format!("held counter says {}, table has {}", t.counter, report.held),
        );
    }
    if t.twice > 0 {
        report.problem(None, format!("{} hashes are held more than once", t.twice));
    }
    if t.orphans > 0 {
        report.problem(None, format!("{} wait rows name no held fact", t.orphans));
    }
    if t.rows != t.missing {
        report.problem(
            None,
            format!(
                "{} wait rows, but held facts miss {} predecessors",
                t.rows, t.missing
            ),
        );
    }
}

/// Implements [`super::Sql`] and the reads of [`super::ReadTx`] other than `held_count`
/// for a write transaction, by forwarding to its read side in field `tx`. Used as
/// `forward_to_tx!(sql Type)` for the `Sql` impl and `forward_to_tx!(reads)` inside the
/// `ReadTx` impl.
macro_rules! forward_to_tx {
    (sql $t:ty) => {
        impl $crate::store::Sql for $t {
            fn dialect(&self) -> $crate::store::Dialect {
                $crate::store::Sql::dialect(&self.tx)
            }
            fn execute(
                &self,
                sql: &str,
                args: &[$crate::store::Arg<'_>],
            ) -> $crate::Result<u64> {
                $crate::store::Sql::execute(&self.tx, sql, args)
            }
            fn query(
                &self,
                sql: &str,
                args: &[$crate::store::Arg<'_>],
                f: &mut dyn FnMut(&$crate::store::Row<'_>) -> $crate::Result<()>,
            ) -> $crate::Result<()> {
                $crate::store::Sql::query(&self.tx, sql, args, f)
            }

            fn query_streamed(
                &self,
                sql: &str,
                args: &[$crate::store::Arg<'_>],
                f: &mut dyn FnMut(&$crate::store::Row<'_>) -> $crate::Result<()>,
            ) -> $crate::Result<()> {
                $crate::store::Sql::query_streamed(&self.tx, sql, args, f)
            }

            fn batch(&self, sql: &str) -> $crate::Result<()> {
                $crate::store::Sql::batch(&self.tx, sql)
            }
        }
    };
    (reads) => {
        $crate::store::shared::forward_to_tx! {@each
            get(hash: &$crate::FactHash) -> Option<$crate::Fact>;
            lookup(hash: &$crate::FactHash) -> Option<$crate::store::StoredFact>;
            fact_at(seq: i64) -> Option<$crate::Fact>;
            seq_of(hash: &$crate::FactHash) -> Option<i64>;
            resolve_prefix(prefix: &$crate::HashPrefix) -> $crate::FactHash;
            name_id(role: bool, name: &str) -> Option<i64>;
            names(role: bool) -> Vec<String>;
            successors(seq: i64, role: Option<i64>, type_id: Option<i64>) -> Vec<$crate::Fact>;
            walk(seq: i64, up: bool) -> Vec<$crate::FactHash>;
            for_each_of_type(
                type_id: i64,
                f: &mut dyn FnMut($crate::Fact) -> $crate::Result<()>
            ) -> ();
            held(limit: usize) -> Vec<$crate::store::HeldFact>;
            for_each_released(
                after: i64,
                upto: i64,
                f: &mut $crate::store::EachReleased<'_>
            ) -> ();
            released_types(after: i64) -> Vec<(i64, i64)>;
            plan(sql: &str, args: &[$crate::store::Arg<'_>]) -> Vec<String>;
            stats() -> $crate::store::Stats;
            verify(progress: &mut dyn FnMut(u64)) -> $crate::store::VerifyReport;
        }
    };
    (@each $($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $name(&self, $($arg: $ty),*) -> $crate::Result<$ret> {
            $crate::store::ReadTx::$name(&self.tx, $($arg),*)
        })*
    };
}
pub(crate) use forward_to_tx;
