//! The SQL of sync: release-order ranges, scoped selection, fetch by hash, the fact-set
//! digest, per-peer bookmarks, the quarantine and the per-peer held bound.
//!
//! The HTTP side lives in `crate::sync`; everything that touches SQLite is here, like the
//! rest of the store's SQL.

use rusqlite::{Connection, OptionalExtension, params};

use super::Store;
use super::write::Writer;
use crate::error::{Error, Result};
use crate::hash::FactHash;

/// What this store knows of one remote node (a row of `sync_peer`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerState {
    /// The remote's base URL, the key.
    pub url: String,
    /// The remote release sequence through which every remote fact is committed here.
    pub pull_after: i64,
    /// The local release sequence through which every local fact was accepted remotely.
    pub push_after: i64,
    /// The remote's highest release sequence when last seen.
    pub remote_seq: i64,
    /// When a sync with it last finished without error, ms since the Unix epoch.
    pub last_sync_ms: Option<i64>,
    /// The last error a sync with it ended on, cleared by a sync that succeeds.
    pub last_error: Option<String>,
}

impl PeerState {
    /// Remote facts not pulled yet, as of the last contact (`remote_seq - pull_after`).
    pub fn lag(&self) -> i64 {
        (self.remote_seq - self.pull_after).max(0)
    }
}

/// A record a peer sent that failed strict decoding or hashing (a row of `sync_quarantine`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    /// Row id, for `precedent poison show`.
    pub id: i64,
    /// Who sent it: a token name, a peer URL, or `anonymous`.
    pub peer: String,
    /// When it arrived, ms since the Unix epoch.
    pub received_ms: i64,
    /// Why it was refused.
    pub reason: String,
    /// The bytes exactly as received.
    pub bytes: Vec<u8>,
}

/// An order-independent summary of the released fact set: equal sets give equal digests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetDigest {
    /// Released facts.
    pub count: u64,
    /// XOR of every released fact's 32-byte hash.
    pub xor: [u8; 32],
    /// The highest release sequence folded in (the digest covers `seq <= through`).
    pub through: i64,
}

impl SetDigest {
    /// The XOR as 64 lowercase hex digits.
    pub fn xor_hex(&self) -> String {
        hex::encode(self.xor)
    }
}

fn hash_of(bytes: Vec<u8>) -> rusqlite::Result<FactHash> {
    FactHash::from_slice(&bytes).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            bytes.len(),
            rusqlite::types::Type::Blob,
            "stored hash is not 32 bytes".into(),
        )
    })
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// This database's identity (32 lowercase hex digits), drawn at random when it was
    /// created; a sync server reports it (`docs/protocol.md`, "Store identity").
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn store_id(&self) -> Result<String> {
        Ok(self.conn.query_row(
            "SELECT lower(hex(value)) FROM store_meta WHERE name = 'id'",
            [],
            |r| r.get(0),
        )?)
    }

    /// The highest release sequence number, 0 for an empty store.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn max_seq(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT coalesce(max(seq), 0) FROM fact")?
            .query_row([], |r| r.get(0))?)
    }

    /// The number of released facts and the highest release sequence.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn count_and_max_seq(&self) -> Result<(u64, i64)> {
        Ok(self
            .conn
            .prepare_cached("SELECT count(*), coalesce(max(seq), 0) FROM fact")?
            .query_row([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))?)
    }

    /// The next page of release order after `after`: how many facts it holds (at most
    /// `limit`) and the sequence number of its last one (`after` when it is empty).
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn release_page(&self, after: i64, limit: u64) -> Result<(u64, i64)> {
        let (n, last): (i64, Option<i64>) = self
            .conn
            .prepare_cached(
                "SELECT count(*), max(seq) FROM
                   (SELECT seq FROM fact WHERE seq > ?1 ORDER BY seq LIMIT ?2)",
            )?
            .query_row(params![after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok((n as u64, last.unwrap_or(after)))
    }

    /// Calls `f` with the sequence number, hash and bytes of each released fact with
    /// `after < seq <= through`, in release order, one row in memory at a time.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Sqlite`].
    pub fn for_each_in_range(
        &self,
        after: i64,
        through: i64,
        mut f: impl FnMut(i64, FactHash, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, hash, bytes FROM fact WHERE seq > ?1 AND seq <= ?2 ORDER BY seq",
        )?;
        let mut rows = stmt.query([after, through])?;
        while let Some(row) = rows.next()? {
            let hash = hash_of(row.get(1)?)?;
            let bytes = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
            super::read::check_bytes(&hash, bytes)?;
            f(row.get(0)?, hash, bytes)?;
        }
        Ok(())
    }

    /// The next page of a *scope*: the released facts that are `roots` or descend from
    /// them, plus every ancestor of those, with `seq > after`, in release order, at most
    /// `limit` sequence numbers, none above `upto`. Costs a walk of the whole scope.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn scope_page(
        &self,
        roots: &[FactHash],
        after: i64,
        upto: i64,
        limit: u64,
    ) -> Result<Vec<i64>> {
        let mut root_seqs = Vec::with_capacity(roots.len());
        for r in roots {
            if let Some(s) = self.seq_of(r)? {
                root_seqs.push(s);
            }
        }
        if root_seqs.is_empty() {
            return Ok(Vec::new());
        }
        let roots_json = serde_json::to_string(&root_seqs).expect("integers serialise");
        let mut stmt = self.conn.prepare_cached(
            "WITH RECURSIVE
               root(seq) AS (SELECT value FROM json_each(?1)),
               down(seq) AS (SELECT seq FROM root
                   UNION SELECT e.successor FROM edge e JOIN down ON e.predecessor = down.seq),
               up(seq) AS (SELECT seq FROM down
                   UNION SELECT e.predecessor FROM edge e JOIN up ON e.successor = up.seq)
             SELECT seq FROM up WHERE seq > ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4",
        )?;
        let rows = stmt.query_map(params![roots_json, after, upto, limit as i64], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Calls `f` with the hash and bytes of the released fact at each of `seqs`.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Sqlite`].
    pub fn for_each_at(
        &self,
        seqs: &[i64],
        mut f: impl FnMut(i64, FactHash, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT hash, bytes FROM fact WHERE seq = ?1")?;
        for &seq in seqs {
            let mut rows = stmt.query([seq])?;
            if let Some(row) = rows.next()? {
                let hash = hash_of(row.get(0)?)?;
                let bytes = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                super::read::check_bytes(&hash, bytes)?;
                f(seq, hash, bytes)?;
            }
        }
        Ok(())
    }

    /// The canonical bytes of each of `hashes` that is stored, released ones first in
    /// release order, then held ones in the order asked. Absent hashes are skipped.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn fetch_bytes(&self, hashes: &[FactHash]) -> Result<Vec<(FactHash, Vec<u8>)>> {
        let mut released = Vec::new();
        let mut held = Vec::new();
        let mut by_seq = self
            .conn
            .prepare_cached("SELECT seq, bytes FROM fact WHERE hash = ?1")?;
        let mut in_held = self.conn.prepare_cached(
            "SELECT bytes FROM held WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1",
        )?;
        for h in hashes {
            let row: Option<(i64, Vec<u8>)> = by_seq
                .query_row([&h.0[..]], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            match row {
                Some((seq, bytes)) => released.push((seq, *h, bytes)),
                None => {
                    if let Some(b) = in_held.query_row([&h.0[..]], |r| r.get(0)).optional()? {
                        held.push((*h, b));
                    }
                }
            }
        }
        released.sort_by_key(|r| r.0);
        released.dedup_by_key(|r| r.0);
        let mut out: Vec<(FactHash, Vec<u8>)> =
            released.into_iter().map(|(_, h, b)| (h, b)).collect();
        out.extend(held);
        for (h, b) in &out {
            super::read::check_bytes(h, b)?;
        }
        Ok(out)
    }

    /// Folds the released facts with `seq > from.through` into `from`: a digest kept by a
    /// caller is brought up to date in time proportional to the facts released since.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn digest_since(&self, from: SetDigest) -> Result<SetDigest> {
        let mut d = from;
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, hash FROM fact WHERE seq > ?1 ORDER BY seq")?;
        let mut rows = stmt.query([from.through])?;
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let h = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
            if h.len() != 32 {
                return Err(Error::Sqlite(rusqlite::Error::FromSqlConversionFailure(
                    h.len(),
                    rusqlite::types::Type::Blob,
                    "stored hash is not 32 bytes".into(),
                )));
            }
            for (a, b) in d.xor.iter_mut().zip(h) {
                *a ^= b;
            }
            d.count += 1;
            d.through = seq;
        }
        Ok(d)
    }

    /// Hashes that held facts wait for and that are not stored at all (neither released
    /// nor held): what to ask a peer for. At most `limit`.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn absent_ancestors(&self, limit: usize) -> Result<Vec<FactHash>> {
        absent_ancestors(&self.conn, limit)
    }

    /// The sync state of the peer at `url`, if this store has synced with it.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn peer(&self, url: &str) -> Result<Option<PeerState>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT url, pull_after, push_after, remote_seq, last_sync_ms, last_error
                 FROM sync_peer WHERE url = ?1",
            )?
            .query_row([url], peer_row)
            .optional()?)
    }

    /// Every peer this store has synced with, by URL.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn peers(&self) -> Result<Vec<PeerState>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT url, pull_after, push_after, remote_seq, last_sync_ms, last_error
             FROM sync_peer ORDER BY url",
        )?;
        let rows = stmt.query_map([], peer_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Quarantined records, newest first, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn quarantine(&self, limit: usize) -> Result<Vec<Quarantined>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, peer, received_ms, reason, bytes FROM sync_quarantine
             ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit as i64], quarantine_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// One quarantined record by id.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn quarantined(&self, id: i64) -> Result<Option<Quarantined>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id, peer, received_ms, reason, bytes FROM sync_quarantine WHERE id = ?1",
            )?
            .query_row([id], quarantine_row)
            .optional()?)
    }

    /// How many records are quarantined.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn quarantine_count(&self) -> Result<u64> {
        Ok(self
            .conn
            .prepare_cached("SELECT count(*) FROM sync_quarantine")?
            .query_row([], |r| r.get::<_, i64>(0))? as u64)
    }

    /// Records a failed sync with `url` (kept until a sync succeeds). Its own transaction.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn record_peer_error(&mut self, url: &str, message: &str) -> Result<()> {
        self.write(|w| {
            w.ensure_peer(url)?;
            w.connection()
                .prepare_cached("UPDATE sync_peer SET last_error = ?2 WHERE url = ?1")?
                .execute(params![url, message])?;
            Ok(())
        })
    }
}

fn absent_ancestors(conn: &Connection, limit: usize) -> Result<Vec<FactHash>> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT w.missing FROM held_wait w
         WHERE NOT EXISTS (SELECT 1 FROM held h
           WHERE substr(h.hash, 1, 8) = substr(w.missing, 1, 8) AND h.hash = w.missing)
           AND NOT EXISTS (SELECT 1 FROM fact f WHERE f.hash = w.missing)
         LIMIT ?1",
    )?;
    let rows = stmt.query_map([limit as i64], |r| hash_of(r.get(0)?))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn peer_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PeerState> {
    Ok(PeerState {
        url: r.get(0)?,
        pull_after: r.get(1)?,
        push_after: r.get(2)?,
        remote_seq: r.get(3)?,
        last_sync_ms: r.get(4)?,
        last_error: r.get(5)?,
    })
}

fn quarantine_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Quarantined> {
    Ok(Quarantined {
        id: r.get(0)?,
        peer: r.get(1)?,
        received_ms: r.get(2)?,
        reason: r.get(3)?,
        bytes: r.get(4)?,
    })
}

impl Writer<'_> {
    /// Stores a refused record in the quarantine, in this transaction.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn quarantine(&mut self, peer: &str, reason: &str, bytes: &[u8]) -> Result<()> {
        self.connection()
            .prepare_cached(
                "INSERT INTO sync_quarantine (peer, received_ms, reason, bytes)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![peer, now_ms(), reason, bytes])?;
        Ok(())
    }

    /// Checks the identity of the database behind the peer `url`, `store` as its server
    /// reports it, against the one recorded with the peer's bookmarks. The first one is
    /// recorded. A different one means the peer's database was replaced: its bookmarks
    /// start again from 0 (everything is pulled and pushed again; duplicates collapse).
    /// Returns whether they did.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn note_peer_store(&mut self, url: &str, store: &str) -> Result<bool> {
        self.ensure_peer(url)?;
        let known: Option<String> = self
            .connection()
            .prepare_cached("SELECT remote_store FROM sync_peer WHERE url = ?1")?
            .query_row([url], |r| r.get(0))?;
        match known {
            Some(k) if k == store => Ok(false),
            None => {
                self.connection()
                    .prepare_cached("UPDATE sync_peer SET remote_store = ?2 WHERE url = ?1")?
                    .execute([url, store])?;
                Ok(false)
            }
            Some(_) => {
                self.connection()
                    .prepare_cached(
                        "UPDATE sync_peer SET remote_store = ?2, pull_after = 0, push_after = 0,
                                remote_seq = 0 WHERE url = ?1",
                    )?
                    .execute([url, store])?;
                Ok(true)
            }
        }
    }

    /// Creates the peer's row if it has none.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn ensure_peer(&mut self, url: &str) -> Result<()> {
        self.connection()
            .prepare_cached("INSERT OR IGNORE INTO sync_peer (url) VALUES (?1)")?
            .execute([url])?;
        Ok(())
    }

    /// Moves the pull bookmark for `url` (and records the remote's highest sequence).
    /// Call it in the transaction that commits the facts the bookmark covers.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn set_pull_bookmark(&mut self, url: &str, after: i64, remote_seq: i64) -> Result<()> {
        self.ensure_peer(url)?;
        self.connection()
            .prepare_cached(
                "UPDATE sync_peer SET pull_after = max(pull_after, ?2),
                        remote_seq = max(remote_seq, ?3) WHERE url = ?1",
            )?
            .execute(params![url, after, remote_seq])?;
        Ok(())
    }

    /// Moves the push bookmark for `url`: local facts through `after` are on the peer.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn set_push_bookmark(&mut self, url: &str, after: i64) -> Result<()> {
        self.ensure_peer(url)?;
        self.connection()
            .prepare_cached("UPDATE sync_peer SET push_after = max(push_after, ?2) WHERE url = ?1")?
            .execute(params![url, after])?;
        Ok(())
    }

    /// Records a sync with `url` that ended without error.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn record_peer_success(&mut self, url: &str, remote_seq: i64) -> Result<()> {
        self.ensure_peer(url)?;
        self.connection()
            .prepare_cached(
                "UPDATE sync_peer SET last_sync_ms = ?2, last_error = NULL,
                        remote_seq = max(remote_seq, ?3) WHERE url = ?1",
            )?
            .execute(params![url, now_ms(), remote_seq])?;
        Ok(())
    }

    /// The sync state of the peer at `url`, as this transaction sees it.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn peer(&self, url: &str) -> Result<Option<PeerState>> {
        Ok(self
            .connection()
            .prepare_cached(
                "SELECT url, pull_after, push_after, remote_seq, last_sync_ms, last_error
                 FROM sync_peer WHERE url = ?1",
            )?
            .query_row([url], peer_row)
            .optional()?)
    }

    /// The highest release sequence as seen by this transaction.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn max_seq(&self) -> Result<i64> {
        Ok(self
            .connection()
            .prepare_cached("SELECT coalesce(max(seq), 0) FROM fact")?
            .query_row([], |r| r.get(0))?)
    }

    /// Notes that `peer` sent these facts, of which those still held count against the
    /// peer's held bound; returns how many facts pushed by `peer` are held now.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn note_held_origin(&mut self, peer: &str, hashes: &[FactHash]) -> Result<u64> {
        let conn = self.connection();
        let mut is_held = conn.prepare_cached(
            "SELECT 1 FROM held WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1",
        )?;
        let mut note = conn.prepare_cached(
            "INSERT OR IGNORE INTO sync_held_origin (hash, peer) VALUES (?1, ?2)",
        )?;
        for h in hashes {
            if is_held.exists([&h.0[..]])? {
                note.execute(params![&h.0[..], peer])?;
            }
        }
        conn.prepare_cached(
            "DELETE FROM sync_held_origin WHERE peer = ?1
               AND NOT EXISTS (SELECT 1 FROM held h
                 WHERE substr(h.hash, 1, 8) = substr(sync_held_origin.hash, 1, 8)
                   AND h.hash = sync_held_origin.hash)",
        )?
        .execute([peer])?;
        Ok(conn
            .prepare_cached("SELECT count(*) FROM sync_held_origin WHERE peer = ?1")?
            .query_row([peer], |r| r.get::<_, i64>(0))? as u64)
    }

    /// Hashes that held facts wait for and that are not stored at all, as this
    /// transaction sees them. At most `limit`.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn absent_ancestors(&self, limit: usize) -> Result<Vec<FactHash>> {
        absent_ancestors(self.connection(), limit)
    }
}
