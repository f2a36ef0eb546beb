//! Paged, index-backed reads of a queue for the console's JSON endpoints
//! (`docs/ui.md`): one state's items after a cursor, and the per-minute rates.

use super::work::item_info;
use super::{ItemInfo, ItemState};
use crate::args;
use crate::error::Result;
use crate::store::{SqlExt, Store};

/// Which items of a queue a page lists. Ready and backing-off inputs share a state and
/// differ by whether their `claimable_at` has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ItemFilter {
    /// Claimable now.
    Ready,
    /// Waiting out a backoff after a failure.
    Backoff,
    /// Any other state, whole.
    State(ItemState),
}

/// One minute of a queue's completions and failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Minute {
    /// Minutes since the Unix epoch.
    pub(crate) minute: i64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
}

impl Store {
    /// Up to `limit` items of `queue` that `filter` selects, with input seq above `after`,
    /// by input seq, each with its seq (the next page's cursor). Reads the index
    /// `queue_item_state (queue_id, state)`, whose rows end in the key `input`, from the
    /// cursor on.
    ///
    /// # Errors
    /// [`crate::Error::UnknownQueue`], [`crate::Error::Backend`].
    pub(crate) fn queue_items_page(
        &self,
        queue: &str,
        filter: ItemFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, ItemInfo)>> {
        let (id, _) = self.def(queue)?;
        let now = self.options().clock.now_ms();
        // Ready and backing-off inputs share a state, and a lease that has ended is shown
        // as ready (as `queue items` and `queue stats` show it): the time decides which.
        let ready = ItemState::Ready.code();
        let leased = ItemState::Leased.code();
        let (states, due): (Vec<i64>, Option<&str>) = match filter {
            ItemFilter::Ready => (vec![ready, leased], Some("<=")),
            ItemFilter::Backoff => (vec![ready], Some(">")),
            ItemFilter::State(ItemState::Leased) => (vec![leased], Some(">")),
            ItemFilter::State(s) => (vec![s.code()], None),
        };
        let (first, second) = (states[0], *states.last().expect("one state at least"));
        let base = "SELECT input FROM queue_item
                    WHERE queue_id = ?1 AND state IN (?2, ?3) AND input > ?4";
        self.read(|r| {
            let n = limit as i64;
            let seqs: Vec<i64> = match due {
                Some(op) => r.query_vec(
                    &format!("{base} AND claimable_at {op} ?5 ORDER BY input LIMIT ?6"),
                    args![id, first, second, after, now, n],
                    |r| r.get(0),
                )?,
                None => r.query_vec(
                    &format!("{base} ORDER BY input LIMIT ?5"),
                    args![id, first, second, after, n],
                    |r| r.get(0),
                )?,
            };
            seqs.into_iter()
                .map(|s| Ok((s, item_info(r, id, s, now)?)))
                .collect()
        })
    }

    /// The completions and failures of `queue` per minute since `since_ms`, oldest
    /// first; minutes with neither are absent.
    ///
    /// # Errors
    /// [`crate::Error::UnknownQueue`], [`crate::Error::Backend`].
    pub(crate) fn queue_minutes(&self, queue: &str, since_ms: i64) -> Result<Vec<Minute>> {
        let (id, _) = self.def(queue)?;
        self.read(|r| {
            r.query_vec(
                "SELECT minute, completed, failed FROM queue_rate
                 WHERE queue_id = ?1 AND minute >= ?2 ORDER BY minute",
                args![id, since_ms.div_euclid(60_000)],
                |r| {
                    Ok(Minute {
                        minute: r.get(0)?,
                        completed: r.get::<i64>(1)? as u64,
                        failed: r.get::<i64>(2)? as u64,
                    })
                },
            )
        })
    }
}
