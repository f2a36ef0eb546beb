//! The store side of sync: release-order ranges, scoped selection, fetch by hash, the
//! fact-set digest, per-peer bookmarks, the quarantine and the per-peer held bound, run
//! through the store's seam ([`crate::store::Sql`]).
//!
//! The HTTP side lives in the rest of `crate::sync`; every statement sync runs is here.

use crate::args;
use crate::error::{Error, Result};
use crate::hash::FactHash;
use crate::store::{Dialect, ReadTx, Row, SqlExt, Store, ValueRef, Writer};

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

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn blob<'r>(r: &'r Row<'_>, i: usize) -> Result<&'r [u8]> {
    match r.value(i)? {
        ValueRef::Blob(b) => Ok(b),
        _ => Err(Error::Corrupt {
            hash: r.hash(0)?,
            reason: format!("stored bytes (column {i}) are not a blob"),
        }),
    }
}

impl Store {
    /// This database's identity (32 lowercase hex digits), drawn at random when it was
    /// created; a sync server reports it (`docs/protocol.md`, "Store identity").
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn store_id(&self) -> Result<String> {
        self.read(|r| {
            let id: Vec<u8> = r.query_one(
                "SELECT value FROM store_meta WHERE name = 'id'",
                args![],
                |r| r.get(0),
            )?;
            Ok(hex::encode(id))
        })
    }

    /// The highest release sequence number, 0 for an empty store.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn max_seq(&self) -> Result<i64> {
        self.read(|r| r.last_seq())
    }

    /// The number of released facts and the highest release sequence.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn count_and_max_seq(&self) -> Result<(u64, i64)> {
        self.read(|r| {
            r.query_one(
                "SELECT count(*), coalesce(max(seq), 0) FROM fact",
                args![],
                |r| Ok((r.get::<i64>(0)? as u64, r.get(1)?)),
            )
        })
    }

    /// The next page of release order after `after`: how many facts it holds (at most
    /// `limit`) and the sequence number of its last one (`after` when it is empty).
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn release_page(&self, after: i64, limit: u64) -> Result<(u64, i64)> {
        let (n, last): (i64, Option<i64>) = self.read(|r| {
            r.query_one(
                "SELECT count(*), max(seq) FROM
                   (SELECT seq FROM fact WHERE seq > ?1 ORDER BY seq LIMIT ?2) AS page",
                args![after, limit as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })?;
        Ok((n as u64, last.unwrap_or(after)))
    }

    /// Calls `f` with the sequence number, hash and bytes of each released fact with
    /// `after < seq <= through`, in release order, one row in memory at a time.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Corrupt`]; [`Error::Backend`].
    pub fn for_each_in_range(
        &self,
        after: i64,
        through: i64,
        mut f: impl FnMut(i64, FactHash, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.read(|r| r.for_each_released(after, through, &mut f))
    }

    /// The next page of a *scope*: the released facts that are `roots` or descend from
    /// them, plus every ancestor of those, with `seq > after`, in release order, at most
    /// `limit` sequence numbers, none above `upto`. Costs a walk of the whole scope.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn scope_page(
        &self,
        roots: &[FactHash],
        after: i64,
        upto: i64,
        limit: u64,
    ) -> Result<Vec<i64>> {
        self.read(|r| {
            let mut root_seqs = Vec::with_capacity(roots.len());
            for root in roots {
                if let Some(s) = r.seq_of(root)? {
                    root_seqs.push(s);
                }
            }
            if root_seqs.is_empty() {
                return Ok(Vec::new());
            }
            let roots_json = serde_json::to_string(&root_seqs).expect("integers serialise");
            // The roots go in as one JSON array, which each engine reads its own way.
            let roots = match r.dialect() {
                Dialect::Postgres => {
                    "SELECT CAST(value AS BIGINT) FROM jsonb_array_elements_text(CAST(?1 AS jsonb))"
                }
                _ => "SELECT value FROM json_each(?1)",
            };
            let walk = r.dialect().recursive_walk();
            if let Some((before, _)) = walk {
                r.batch(before)?;
            }
            let seqs = r.query_vec(
                &format!(
                    "WITH RECURSIVE
                   root(seq) AS ({roots}),
                   down(seq) AS (SELECT seq FROM root
                       UNION SELECT e.successor FROM edge e JOIN down ON e.predecessor = down.seq),
                   up(seq) AS (SELECT seq FROM down
                       UNION SELECT e.predecessor FROM edge e JOIN up ON e.successor = up.seq
                       WHERE e.predecessor IS NOT NULL)
                 SELECT seq FROM up WHERE seq > ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4"
                ),
                args![&roots_json, after, upto, limit as i64],
                |r| r.get(0),
            )?;
            if let Some((_, after)) = walk {
                r.batch(after)?;
            }
            Ok(seqs)
        })
    }

    /// Calls `f` with the hash and bytes of the released fact at each of `seqs`.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Corrupt`]; [`Error::Backend`].
    pub fn for_each_at(
        &self,
        seqs: &[i64],
        mut f: impl FnMut(i64, FactHash, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.read(|r| {
            for &seq in seqs {
                r.query(
                    "SELECT hash, bytes FROM fact WHERE seq = ?1",
                    args![seq],
                    &mut |row| {
                        let hash = row.hash(0)?;
                        let bytes = blob(row, 1)?;
                        hash.check_stored(bytes)?;
                        f(seq, hash, bytes)
                    },
                )?;
            }
            Ok(())
        })
    }

    /// The canonical bytes of each of `hashes` that is stored, released ones first in
    /// release order, then held ones in the order asked. Absent hashes are skipped.
    ///
    /// # Errors
    /// [`Error::Corrupt`]; [`Error::Backend`].
    pub fn fetch_bytes(&self, hashes: &[FactHash]) -> Result<Vec<(FactHash, Vec<u8>)>> {
        self.read(|r| {
            let mut released = Vec::new();
            let mut held = Vec::new();
            for h in hashes {
                let row: Option<(i64, Vec<u8>)> = r.query_opt(
                    "SELECT seq, bytes FROM fact WHERE hash = ?1",
                    args![h],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                match row {
                    Some((seq, bytes)) => released.push((seq, *h, bytes)),
                    None => {
                        if let Some(stored) = r.lookup(h)? {
                            held.push((*h, stored.fact.canonical_bytes().to_vec()));
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
                h.check_stored(b)?;
            }
            Ok(out)
        })
    }

    /// Folds the released facts with `seq > from.through` into `from`: a digest kept by a
    /// caller is brought up to date in time proportional to the facts released since.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a stored hash that is not 32 bytes; [`Error::Backend`].
    pub fn digest_since(&self, from: SetDigest) -> Result<SetDigest> {
        let mut d = from;
        self.read(|r| {
            r.query(
                "SELECT seq, hash FROM fact WHERE seq > ?1 ORDER BY seq",
                args![from.through],
                &mut |row| {
                    let h = row.hash(1)?;
                    for (a, b) in d.xor.iter_mut().zip(h.0) {
                        *a ^= b;
                    }
                    d.count += 1;
                    d.through = row.get(0)?;
                    Ok(())
                },
            )
        })?;
        Ok(d)
    }

    /// Hashes that held facts wait for and that are not stored at all (neither released
    /// nor held): what to ask a peer for. At most `limit`, the lowest first.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn absent_ancestors(&self, limit: usize) -> Result<Vec<FactHash>> {
        self.read(|r| absent_ancestors(r, None, limit))
    }

    /// As [`Store::absent_ancestors`], those above `after`: the next page, so that a peer
    /// is asked for every absent hash in turn, not only for the lowest ones again.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn absent_ancestors_after(&self, after: &FactHash, limit: usize) -> Result<Vec<FactHash>> {
        self.read(|r| absent_ancestors(r, Some(after), limit))
    }

    /// The sync state of the peer at `url`, if this store has synced with it.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn peer(&self, url: &str) -> Result<Option<PeerState>> {
        self.read(|r| peer(r, url))
    }

    /// Every peer this store has synced with, by URL.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn peers(&self) -> Result<Vec<PeerState>> {
        self.read(|r| {
            r.query_vec(
                "SELECT url, pull_after, push_after, remote_seq, last_sync_ms, last_error
                 FROM sync_peer ORDER BY url",
                args![],
                peer_row,
            )
        })
    }

    /// Quarantined records, newest first, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn quarantine(&self, limit: usize) -> Result<Vec<Quarantined>> {
        self.read(|r| {
            r.query_vec(
                "SELECT id, peer, received_ms, reason, bytes FROM sync_quarantine
                 ORDER BY id DESC LIMIT ?1",
                args![limit as i64],
                quarantine_row,
            )
        })
    }

    /// One quarantined record by id.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn quarantined(&self, id: i64) -> Result<Option<Quarantined>> {
        self.read(|r| {
            r.query_opt(
                "SELECT id, peer, received_ms, reason, bytes FROM sync_quarantine WHERE id = ?1",
                args![id],
                quarantine_row,
            )
        })
    }

    /// How many records are quarantined.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn quarantine_count(&self) -> Result<u64> {
        self.read(|r| {
            r.query_one("SELECT count(*) FROM sync_quarantine", args![], |r| {
                r.get::<i64>(0)
            })
        })
        .map(|n| n as u64)
    }

    /// Records a failed sync with `url` (kept until a sync succeeds). Its own transaction.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn record_peer_error(&self, url: &str, message: &str) -> Result<()> {
        self.write(|w| {
            w.ensure_peer(url)?;
            w.sql().execute(
                "UPDATE sync_peer SET last_error = ?2 WHERE url = ?1",
                args![url, message],
            )?;
            Ok(())
        })
    }

    /// Forgets the peer `url`, exactly as [`Store::peers`] lists it (a scoped sync's
    /// `URL#roots=...` is a peer of its own): its bookmarks, last sync and last error.
    /// No fact is touched; a later sync with the same URL starts from the beginning and
    /// receives what it already has as duplicates. Returns whether the peer was known.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn remove_peer(&self, url: &str) -> Result<bool> {
        self.write(|w| {
            let removed = w
                .sql()
                .execute("DELETE FROM sync_peer WHERE url = ?1", args![url])?;
            Ok(removed > 0)
        })
    }
}

fn absent_ancestors(
    r: &dyn ReadTx,
    after: Option<&FactHash>,
    limit: usize,
) -> Result<Vec<FactHash>> {
    let select = "SELECT DISTINCT w.missing FROM held_wait w
         WHERE NOT EXISTS (SELECT 1 FROM held h
           WHERE substr(h.hash, 1, 8) = substr(w.missing, 1, 8) AND h.hash = w.missing)
           AND NOT EXISTS (SELECT 1 FROM fact f WHERE f.hash = w.missing)";
    match after {
        None => r.query_vec(
            &format!("{select} ORDER BY w.missing LIMIT ?1"),
            args![limit as i64],
            |r| r.hash(0),
        ),
        Some(after) => r.query_vec(
            &format!("{select} AND w.missing > ?2 ORDER BY w.missing LIMIT ?1"),
            args![limit as i64, after],
            |r| r.hash(0),
        ),
    }
}

fn peer(r: &dyn ReadTx, url: &str) -> Result<Option<PeerState>> {
    r.query_opt(
        "SELECT url, pull_after, push_after, remote_seq, last_sync_ms, last_error
         FROM sync_peer WHERE url = ?1",
        args![url],
        peer_row,
    )
}

fn peer_row(r: &Row<'_>) -> Result<PeerState> {
    Ok(PeerState {
        url: r.get(0)?,
        pull_after: r.get(1)?,
        push_after: r.get(2)?,
        remote_seq: r.get(3)?,
        last_sync_ms: r.get(4)?,
        last_error: r.get(5)?,
    })
}

fn quarantine_row(r: &Row<'_>) -> Result<Quarantined> {
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
    /// [`Error::Backend`].
    pub fn quarantine(&mut self, peer: &str, reason: &str, bytes: &[u8]) -> Result<()> {
        self.sql().execute(
            "INSERT INTO sync_quarantine (peer, received_ms, reason, bytes)
                 VALUES (?1, ?2, ?3, ?4)",
            args![peer, now_ms(), reason, bytes],
        )?;
        Ok(())
    }

    /// Checks the identity of the database behind the peer `url`, `store` as its server
    /// reports it, against the one recorded with the peer's bookmarks. The first one is
    /// recorded. A different one means the peer's database was replaced: its bookmarks
    /// start again from 0 (everything is pulled and pushed again; duplicates collapse).
    /// Returns whether they did.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn note_peer_store(&mut self, url: &str, store: &str) -> Result<bool> {
        self.ensure_peer(url)?;
        let known: Option<String> = self.sql().query_one(
            "SELECT remote_store FROM sync_peer WHERE url = ?1",
            args![url],
            |r| r.get(0),
        )?;
        match known {
            Some(k) if k == store => Ok(false),
            None => {
                self.sql().execute(
                    "UPDATE sync_peer SET remote_store = ?2 WHERE url = ?1",
                    args![url, store],
                )?;
                Ok(false)
            }
            Some(_) => {
                self.sql().execute(
                    "UPDATE sync_peer SET remote_store = ?2, pull_after = 0, push_after = 0,
                                remote_seq = 0 WHERE url = ?1",
                    args![url, store],
                )?;
                Ok(true)
            }
        }
    }

    /// Creates the peer's row if it has none.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn ensure_peer(&mut self, url: &str) -> Result<()> {
        self.sql().execute(
            "INSERT INTO sync_peer (url) VALUES (?1) ON CONFLICT DO NOTHING",
            args![url],
        )?;
        Ok(())
    }

    /// Moves the pull bookmark for `url` (and records the remote's highest sequence).
    /// Call it in the transaction that commits the facts the bookmark covers.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn set_pull_bookmark(&mut self, url: &str, after: i64, remote_seq: i64) -> Result<()> {
        self.ensure_peer(url)?;
        self.sql().execute(
            "UPDATE sync_peer
                SET pull_after = CASE WHEN pull_after > ?2 THEN pull_after ELSE ?2 END,
                    remote_seq = CASE WHEN remote_seq > ?3 THEN remote_seq ELSE ?3 END
              WHERE url = ?1",
            args![url, after, remote_seq],
        )?;
        Ok(())
    }

    /// Moves the push bookmark for `url`: local facts through `after` are on the peer.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn set_push_bookmark(&mut self, url: &str, after: i64) -> Result<()> {
        self.ensure_peer(url)?;
        self.sql().execute(
            "UPDATE sync_peer
                SET push_after = CASE WHEN push_after > ?2 THEN push_after ELSE ?2 END
              WHERE url = ?1",
            args![url, after],
        )?;
        Ok(())
    }

    /// Records a sync with `url` that ended without error.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn record_peer_success(&mut self, url: &str, remote_seq: i64) -> Result<()> {
        self.ensure_peer(url)?;
        self.sql().execute(
            "UPDATE sync_peer SET last_sync_ms = ?2, last_error = NULL,
                    remote_seq = CASE WHEN remote_seq > ?3 THEN remote_seq ELSE ?3 END
              WHERE url = ?1",
            args![url, now_ms(), remote_seq],
        )?;
        Ok(())
    }

    /// The sync state of the peer at `url`, as this transaction sees it.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn peer(&self, url: &str) -> Result<Option<PeerState>> {
        peer(self.sql(), url)
    }

    /// The highest release sequence as seen by this transaction, read under the write
    /// lock, which the transaction holds from then on (on SQLite from its start): no
    /// other writer releases a fact before this transaction ends.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn max_seq(&self) -> Result<i64> {
        self.sql().last_seq()
    }

    /// Notes that `peer` sent these facts, of which those still held count against the
    /// peer's held bound; returns how many facts pushed by `peer` are held now.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn note_held_origin(&mut self, peer: &str, hashes: &[FactHash]) -> Result<u64> {
        let tx = self.sql();
        for h in hashes {
            // The prefix as a parameter of its own: PostgreSQL takes `substr(?1, 1, 8)`
            // for text and refuses to compare it with bytea.
            let held = tx.exists(
                "SELECT 1 FROM held WHERE substr(hash, 1, 8) = ?2 AND hash = ?1",
                args![h, &h.0[..8]],
            )?;
            if held {
                tx.execute(
                    "INSERT INTO sync_held_origin (hash, peer) VALUES (?1, ?2)
                     ON CONFLICT DO NOTHING",
                    args![h, peer],
                )?;
            }
        }
        tx.execute(
            "DELETE FROM sync_held_origin WHERE peer = ?1
               AND NOT EXISTS (SELECT 1 FROM held h
                 WHERE substr(h.hash, 1, 8) = substr(sync_held_origin.hash, 1, 8)
                   AND h.hash = sync_held_origin.hash)",
            args![peer],
        )?;
        let n: i64 = tx.query_one(
            "SELECT count(*) FROM sync_held_origin WHERE peer = ?1",
            args![peer],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// The sequence number and hash of each fact released after `after`, in release
    /// order, as this transaction sees them: what the transaction itself released, when
    /// `after` is the highest sequence it started with.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a stored hash that is not 32 bytes; [`Error::Backend`].
    pub fn released_after(&self, after: i64) -> Result<Vec<(i64, FactHash)>> {
        self.sql().query_vec(
            "SELECT seq, hash FROM fact WHERE seq > ?1 ORDER BY seq",
            args![after],
            |r| Ok((r.get(0)?, r.hash(1)?)),
        )
    }

    /// Hashes that held facts wait for and that are not stored at all, as this
    /// transaction sees them. At most `limit`.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn absent_ancestors(&self, limit: usize) -> Result<Vec<FactHash>> {
        absent_ancestors(self.sql(), None, limit)
    }
}
