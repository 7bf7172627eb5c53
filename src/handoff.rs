//! Parked claims waiting to be handed a turn. An enqueue that finds a claim
//! parked on its session takes the oldest one, has the store claim the new
//! turn for it in the enqueue's own transaction
//! (the broker composes the enqueue and the claim,
//! [`crate::store::Store::together`]) and hands it the outcome: the
//! parked host gets its turn one commit after the enqueue began, not two.
//!
//! A parked claim is in the registry only while it sleeps. It leaves by being
//! taken (its outcome is then on its way: it must wait for it) or by
//! withdrawing itself (on a wake-up, its deadline, shutdown, or when its
//! request is dropped).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::decide::turn::ClaimOutcome;
use crate::error::Result;
use crate::model::HostIdentity;

/// What a handed-off claim receives: when the enqueue that served it began,
/// and what its claim found.
pub type Delivery = (Instant, Result<ClaimOutcome>);

struct Slot {
    id: u64,
    host: HostIdentity,
    claim_id: String,
    deliver: oneshot::Sender<Delivery>,
}

#[derive(Default)]
pub struct Handoffs {
    parked: Mutex<HashMap<String, VecDeque<Slot>>>,
    next_id: AtomicU64,
}

impl Handoffs {
    fn parked(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Slot>>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a claim parked on `session_id`, behind any parked earlier.
    pub fn park(
        self: &Arc<Self>,
        session_id: &str,
        host: HostIdentity,
        claim_id: String,
    ) -> Parked {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (deliver, delivery) = oneshot::channel();
        self.parked()
            .entry(session_id.to_owned())
            .or_default()
            .push_back(Slot {
                id,
                host,
                claim_id,
                deliver,
            });
        Parked {
            registry: self.clone(),
            session_id: session_id.to_owned(),
            id,
            delivery: Some(delivery),
        }
    }

    /// Takes the session's oldest parked claim; `started` is when the
    /// enqueue that serves it began.
    pub fn take(&self, session_id: &str, started: Instant) -> Option<Taken> {
        let slot = {
            let mut parked = self.parked();
            let queue = parked.get_mut(session_id)?;
            let slot = queue.pop_front();
            if queue.is_empty() {
                parked.remove(session_id);
            }
            slot?
        };
        Some(Taken {
            host: slot.host,
            claim_id: slot.claim_id,
            started,
            deliver: slot.deliver,
        })
    }

    /// Removes the slot; false when an enqueue has taken it already.
    fn withdraw(&self, session_id: &str, id: u64) -> bool {
        let mut parked = self.parked();
        let Some(queue) = parked.get_mut(session_id) else {
            return false;
        };
        let Some(at) = queue.iter().position(|slot| slot.id == id) else {
            return false;
        };
        queue.remove(at);
        if queue.is_empty() {
            parked.remove(session_id);
        }
        true
    }
}

/// A parked claim an enqueue has taken: the enqueue claims for it and
/// delivers the outcome. Dropped undelivered (the enqueue failed), the parked
/// claim re-checks the store.
pub struct Taken {
    pub host: HostIdentity,
    pub claim_id: String,
    started: Instant,
    deliver: oneshot::Sender<Delivery>,
}

impl Taken {
    pub fn deliver(self, outcome: Result<ClaimOutcome>) {
        let _ = self.deliver.send((self.started, outcome));
    }
}

/// A parked claim's place in the registry; dropping it withdraws it.
pub struct Parked {
    registry: Arc<Handoffs>,
    session_id: String,
    id: u64,
    /// `None` once it has answered (a receiver may be awaited only once).
    delivery: Option<oneshot::Receiver<Delivery>>,
}

impl Parked {
    /// Resolves when an enqueue has handed this claim its outcome; `None` if
    /// the enqueue failed before claiming (re-check the store).
    pub async fn delivered(&mut self) -> Option<Delivery> {
        let delivery = self.delivery.as_mut()?.await.ok();
        self.delivery = None;
        delivery
    }

    /// Leaves the registry. When an enqueue took this claim first, waits for
    /// the outcome it is about to deliver instead.
    pub async fn leave(mut self) -> Option<Delivery> {
        if self.registry.withdraw(&self.session_id, self.id) {
            return None;
        }
        self.delivered().await
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.registry.withdraw(&self.session_id, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostIdentity {
        HostIdentity {
            host_surface: "s".into(),
            host_session_id: "h".into(),
        }
    }

    #[tokio::test]
    async fn the_oldest_parked_claim_is_taken_first_and_a_withdrawn_one_never() {
        let registry: Arc<Handoffs> = Default::default();
        let first = registry.park("ses", host(), "c1".into());
        let second = registry.park("ses", host(), "c2".into());
        let third = registry.park("ses", host(), "c3".into());
        drop(second);
        let taken = registry.take("ses", Instant::now()).unwrap();
        assert_eq!(taken.claim_id, "c1");
        taken.deliver(Ok(ClaimOutcome::Empty));
        let (_, outcome) = first.leave().await.expect("taken: the outcome arrives");
        assert!(matches!(outcome, Ok(ClaimOutcome::Empty)));
        assert!(third.leave().await.is_none(), "not taken: it withdraws");
        assert!(registry.take("ses", Instant::now()).is_none());
        assert!(registry.parked().is_empty());
    }

    #[tokio::test]
    async fn a_taken_claim_whose_enqueue_failed_hears_none() {
        let registry: Arc<Handoffs> = Default::default();
        let parked = registry.park("ses", host(), "c1".into());
        drop(registry.take("ses", Instant::now()));
        assert!(parked.leave().await.is_none());
    }
}
