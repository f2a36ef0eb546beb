//! Typed queues: a queue declared from two [`FactType`]s, whose leases carry the decoded
//! input and whose handlers return the completion as a value.
//!
//! A [`QueueHandle<T, C>`] stands for a queue of `T` inputs completed by `C` facts that name
//! their input through one of `C`'s roles. Claiming through it decodes each input once; the
//! handler of [`QueueHandle::complete`] gets the decoded input and returns the `C`, which
//! the handle stores in the same transaction as the handler's own writes. Everything else
//! (fail, extend, release, stats) is the untyped API: a [`TypedLease`] derefs to its
//! [`Lease`].
//!
//! Why an input that does not decode as `T` is poisoned at claim, rather than returned or
//! raised, is told on [`QueueHandle`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use super::{Completion, Failure, Lease, QueueSpec};
use crate::error::{Error, Result};
use crate::query::typed::{FactType, Ref, from_fact};
use crate::store::{Store, Writer};

/// A queue of `T` inputs, each completed by a `C` that names it through the handle's role.
///
/// Made by [`Store::declare_typed_queue`] or [`Store::declare_typed`], which check the
/// declaration against both types. It holds no connection: pass the store to each call.
///
/// An input that does not decode as `T` (a fact of the right type name written by another
/// program, or by an older version of this one) is never handed to the application: the
/// claim fails it as poison ([`Failure::Poison`], the decode error as the reason) in the
/// claim's own transaction and claims another in its place. No retry could make it decode,
/// and returning an error would stop a worker at the first bad input with it still leased.
/// On an at-most-once queue it is dropped like any failed input.
///
/// ```
/// use precedent::Store;
/// use precedent::query::{FactType, Ref};
/// use precedent::queue::QueueHandle;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
/// #[fact(type = "Shop.Order")]
/// struct Order { id: u64 }
///
/// #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
/// #[fact(type = "Shop.Shipment")]
/// struct Shipment { order: Ref<Order>, carrier: String }
///
/// let store = Store::open_in_memory()?;
/// let ship: QueueHandle<Order, Shipment> = store.declare_typed_queue("ship", "order")?;
/// let order = store.save(&Order { id: 7 })?;
///
/// let leases = ship.claim(&store, 10)?;
/// assert_eq!(leases.len(), 1);
/// assert_eq!(leases[0].input(), &Order { id: 7 });
/// let shipment = ship.complete(&store, &leases[0], |_w, order| {
///     assert_eq!(order.id, 7);
///     Ok(Shipment { order: leases[0].input_ref(), carrier: "post".into() })
/// })?;
/// assert_eq!(store.load(shipment)?.order, order);
/// assert!(ship.claim(&store, 10)?.is_empty());
/// # Ok::<(), precedent::Error>(())
/// ```
pub struct QueueHandle<T, C> {
    name: String,
    role: String,
    _types: PhantomData<fn() -> (T, C)>,
}

impl<T: FactType, C: FactType> QueueHandle<T, C> {
    /// The declaration a typed queue starts from: `T` inputs, completed by a `C` naming
    /// the input through `role`, with [`QueueSpec::new`]'s defaults. Change its policy
    /// (lease, retries, ordering) and declare it with [`Store::declare_typed`].
    pub fn spec(name: &str, role: &str) -> QueueSpec {
        QueueSpec::new(
            name,
            T::TYPE,
            vec![Completion {
                type_name: C::TYPE.to_string(),
                role: role.to_string(),
            }],
        )
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The role of `C` through which a completion names its input.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// Claims up to `n` ready inputs, as [`Store::claim`] does, each decoded as a `T`. An
    /// input that does not decode is failed as poison in the same transaction and another
    /// is claimed in its place (see [`QueueHandle`] for why).
    ///
    /// # Errors
    /// As [`Store::claim`]: [`Error::UnknownQueue`] if the queue was dropped,
    /// [`Error::Backend`].
    pub fn claim(&self, store: &Store, n: usize) -> Result<Vec<TypedLease<T, C>>> {
        store.write(|w| self.claim_in(w, n))
    }

    /// [`QueueHandle::claim`] inside a write transaction.
    ///
    /// # Errors
    /// As [`QueueHandle::claim`].
    pub fn claim_in(&self, w: &mut Writer<'_>, n: usize) -> Result<Vec<TypedLease<T, C>>> {
        let mut out = Vec::with_capacity(n);
        // A poisoned input leaves the ready set at once, so each round claims only inputs
        // not seen before, and the loop ends when the queue has no more to give.
        while out.len() < n {
            let leases = w.claim(&self.name, n - out.len())?;
            if leases.is_empty() {
                break;
            }
            for lease in leases {
                match from_fact::<T>(&lease.input) {
                    Ok(input) => out.push(TypedLease {
                        lease,
                        input,
                        _completion: PhantomData,
                    }),
                    Err(e) => {
                        w.fail(&lease, &Failure::Poison(e.to_string()))?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Completes a leased input: `handler` receives the write transaction and the decoded
    /// input, writes the application's own rows and returns the completion, which is
    /// stored in the same transaction. Everything commits together or not at all.
    /// Returns the stored completion.
    ///
    /// ```
    /// use precedent::{Error, Store};
    /// use precedent::query::{FactType, Ref};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, FactType)]
    /// #[fact(type = "Shop.Order")]
    /// struct Order { id: u64 }
    ///
    /// #[derive(Serialize, Deserialize, FactType)]
    /// #[fact(type = "Shop.Shipment")]
    /// struct Shipment { order: Ref<Order> }
    ///
    /// let store = Store::open_in_memory()?;
    /// let ship = store.declare_typed_queue::<Order, Shipment>("ship", "order")?;
    /// store.save(&Order { id: 7 })?;
    /// let lease = ship.claim(&store, 1)?.pop().unwrap();
    ///
    /// // A handler that fails leaves nothing behind; the lease stays held.
    /// let refused = ship.complete(&store, &lease, |_w, _order| {
    ///     Err(Error::InvalidFact { reason: "carrier down".into() })
    /// });
    /// assert!(matches!(refused, Err(Error::InvalidFact { .. })));
    /// assert_eq!(store.queue_stats("ship")?.leased, 1);
    ///
    /// ship.complete(&store, &lease, |_w, _order| Ok(Shipment { order: lease.input_ref() }))?;
    /// assert_eq!(store.queue_stats("ship")?.completed, 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease expired and another worker claimed the input;
    /// [`Error::NotCompleted`] if the returned `C` does not name this input through the
    /// handle's role; [`Error::InvalidFact`] if it does not make a valid fact; whatever the
    /// handler returns. In every error case nothing is written.
    pub fn complete(
        &self,
        store: &Store,
        lease: &TypedLease<T, C>,
        handler: impl FnOnce(&mut Writer<'_>, &T) -> Result<C>,
    ) -> Result<Ref<C>> {
        store.write(|w| self.complete_in(w, lease, handler))
    }

    /// [`QueueHandle::complete`] inside a write transaction, in a savepoint: on any error
    /// what the handler wrote is undone and the rest of the transaction is kept.
    ///
    /// # Errors
    /// As [`QueueHandle::complete`].
    pub fn complete_in(
        &self,
        w: &mut Writer<'_>,
        lease: &TypedLease<T, C>,
        handler: impl FnOnce(&mut Writer<'_>, &T) -> Result<C>,
    ) -> Result<Ref<C>> {
        w.complete(&lease.lease, |w| {
            let completion = handler(w, &lease.input)?;
            w.save(&completion)
        })
    }
}

impl<T, C> Clone for QueueHandle<T, C> {
    fn clone(&self) -> Self {
        QueueHandle {
            name: self.name.clone(),
            role: self.role.clone(),
            _types: PhantomData,
        }
    }
}

impl<T: FactType, C: FactType> fmt::Debug for QueueHandle<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "QueueHandle({}: {} done by {}.{})",
            self.name,
            T::TYPE,
            C::TYPE,
            self.role
        )
    }
}

/// A claimed input of a typed queue, decoded. It derefs to its [`Lease`], which is what
/// [`Store::fail`], [`Store::extend`] and [`Store::release`] take.
#[must_use = "a lease must be completed, failed or released"]
pub struct TypedLease<T, C> {
    lease: Lease,
    input: T,
    _completion: PhantomData<fn() -> C>,
}

impl<T, C> TypedLease<T, C> {
    /// The input, decoded when it was claimed.
    pub fn input(&self) -> &T {
        &self.input
    }

    /// A reference to the input, for the completion's role.
    pub fn input_ref(&self) -> Ref<T> {
        Ref::new(self.lease.input.hash())
    }

    /// The untyped lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The untyped lease and the decoded input, for [`Store::release`] (which takes the
    /// lease by value) or code that keeps the input past the lease.
    pub fn into_parts(self) -> (Lease, T) {
        (self.lease, self.input)
    }
}

impl<T, C> Deref for TypedLease<T, C> {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl<T: Clone, C> Clone for TypedLease<T, C> {
    fn clone(&self) -> Self {
        TypedLease {
            lease: self.lease.clone(),
            input: self.input.clone(),
            _completion: PhantomData,
        }
    }
}

impl<T: fmt::Debug, C> fmt::Debug for TypedLease<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedLease")
            .field("lease", &self.lease)
            .field("input", &self.input)
            .finish()
    }
}

impl Store {
    /// Declares a queue of `T` inputs completed by a `C` naming the input through `role`,
    /// with the default policy ([`QueueHandle::spec`]), and returns its typed handle.
    ///
    /// ```
    /// use precedent::{Error, Store};
    /// use precedent::query::{FactType, Ref};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, FactType)]
    /// #[fact(type = "Shop.Order")]
    /// struct Order { id: u64 }
    ///
    /// #[derive(Serialize, Deserialize, FactType)]
    /// #[fact(type = "Shop.Shipment")]
    /// struct Shipment { order: Ref<Order> }
    ///
    /// let store = Store::open_in_memory()?;
    /// let ship = store.declare_typed_queue::<Order, Shipment>("ship", "order")?;
    /// assert_eq!(store.queue("ship")?.completions[0].type_name, "Shop.Shipment");
    /// assert_eq!(ship.role(), "order");
    /// // A Shipment has no role `input`: no completion could ever name an order by it.
    /// let wrong = store.declare_typed_queue::<Order, Shipment>("ship2", "input");
    /// assert!(matches!(wrong, Err(Error::Queue { .. })));
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Queue`] if `role` is not a role of `C`, or the declaration is invalid;
    /// [`Error::Backend`].
    pub fn declare_typed_queue<T: FactType, C: FactType>(
        &self,
        name: &str,
        role: &str,
    ) -> Result<QueueHandle<T, C>> {
        self.declare_typed(&QueueHandle::<T, C>::spec(name, role))
    }

    /// Declares `spec` as a typed queue, as [`Store::declare_queue`] does, after checking
    /// it against the types: its input type is `T`'s and a completion rule of type `C`
    /// names the input through a role of `C` (the first such rule is the handle's).
    ///
    /// ```
    /// use precedent::Store;
    /// use precedent::query::{FactType, Ref};
    /// use precedent::queue::QueueHandle;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, FactType)]
    /// #[fact(type = "Shop.Order")]
    /// struct Order { id: u64 }
    ///
    /// #[derive(Serialize, Deserialize, FactType)]
    /// #[fact(type = "Shop.Shipment")]
    /// struct Shipment { order: Ref<Order> }
    ///
    /// let store = Store::open_in_memory()?;
    /// let mut spec = QueueHandle::<Order, Shipment>::spec("ship", "order");
    /// spec.lease_ms = 120_000;
    /// let ship = store.declare_typed::<Order, Shipment>(&spec)?;
    /// assert_eq!(store.queue(ship.name())?.lease_ms, 120_000);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Queue`] if the spec's input type is not `T::TYPE`, no completion rule is of
    /// type `C::TYPE`, its role is not one of `C::PREDECESSORS`, or the spec is invalid;
    /// [`Error::Backend`].
    pub fn declare_typed<T: FactType, C: FactType>(
        &self,
        spec: &QueueSpec,
    ) -> Result<QueueHandle<T, C>> {
        let role = typed_role::<T, C>(spec).map_err(|reason| Error::Queue {
            queue: spec.name.clone(),
            reason,
        })?;
        self.declare_queue(spec)?;
        Ok(QueueHandle {
            name: spec.name.clone(),
            role,
            _types: PhantomData,
        })
    }
}

/// The role through which `spec`'s completion of type `C` names a `T` input, or why the
/// spec does not fit the types.
fn typed_role<T: FactType, C: FactType>(spec: &QueueSpec) -> std::result::Result<String, String> {
    if spec.input_type != T::TYPE {
        return Err(format!(
            "input type {} is not {}, the type of the handle's inputs",
            spec.input_type,
            T::TYPE
        ));
    }
    let rule = spec
        .completions
        .iter()
        .find(|c| c.type_name == C::TYPE)
        .ok_or_else(|| format!("no completion rule is of type {}", C::TYPE))?;
    if !C::PREDECESSORS.iter().any(|(r, _)| *r == rule.role) {
        let roles: Vec<&str> = C::PREDECESSORS.iter().map(|(r, _)| *r).collect();
        return Err(format!(
            "{} has no role {:?} to name its input by (its roles: {})",
            C::TYPE,
            rule.role,
            if roles.is_empty() {
                "none".to_string()
            } else {
                roles.join(", ")
            }
        ));
    }
    Ok(rule.role.clone())
}
