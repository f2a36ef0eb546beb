//! Dropping held facts that will never be released (`precedent held drop`, `precedent held
//! expire`): the store's side; the rule is in `docs/semantics.md`, "Dropping held facts".

use std::time::Duration;

use super::Store;
use crate::error::Result;
use crate::hash::FactHash;

impl Store {
    /// Drops held facts, in one transaction: each of `hashes`, and every held fact that
    /// waits for one of them, directly or through other held facts (it could be released
    /// only after the dropped fact, which is no longer stored). Returns the hashes
    /// dropped, `hashes` first. A dropped fact that arrives again is stored anew.
    ///
    /// This is for facts that will never be released, such as one held behind a
    /// mistyped hash; released facts are immutable and are never dropped.
    ///
    /// ```
    /// # use precedent::{Fact, FactHash, Store};
    /// let store = Store::open_in_memory()?;
    /// let typo = FactHash([7; 32]); // no such fact
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", typo).build()?;
    /// let line = Fact::builder("Shop.Line").field("n", 1).predecessor("order", order.hash()).build()?;
    /// store.insert_batch(vec![order.clone(), line.clone()])?;
    /// assert_eq!(store.held_count()?, 2);
    /// // The line waits for the order: it goes with it.
    /// assert_eq!(store.drop_held(&[order.hash()])?, vec![order.hash(), line.hash()]);
    /// assert_eq!(store.held_count()?, 0);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::NotHeld`] if one of `hashes` is released, [`crate::Error::NotFound`] if one is
    /// not stored; nothing is dropped then. [`crate::Error::Backend`].
    pub fn drop_held(&self, hashes: &[FactHash]) -> Result<Vec<FactHash>> {
        self.write(|w| w.tx.drop_held(hashes))
    }

    /// Drops, in one transaction, every held fact first held at least `older_than` ago
    /// (by the store's clock), with what waits for them, as [`Store::drop_held`] does.
    /// Returns the hashes dropped.
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    pub fn expire_held(&self, older_than: Duration) -> Result<Vec<FactHash>> {
        let ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.options.clock.now_ms().saturating_sub(ms);
        self.write(|w| w.tx.drop_held_before(cutoff))
    }
}
