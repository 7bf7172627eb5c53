//! Per-session wake-up signals, for parked claims and event streams. A signal
//! exists only while someone waits on it; waking a session nobody waits on
//! costs one map lookup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

#[derive(Default)]
pub struct Wakeups {
    signals: Mutex<HashMap<String, Weak<Notify>>>,
}

/// A waiter's hold on its session's signal; the last one out removes it.
pub struct Subscription {
    registry: Arc<Wakeups>,
    session_id: String,
    signal: Arc<Notify>,
}

impl Wakeups {
    fn signals(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Notify>>> {
        self.signals.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribe(self: &Arc<Self>, session_id: &str) -> Subscription {
        let mut signals = self.signals();
        let signal = match signals.get(session_id).and_then(Weak::upgrade) {
            Some(signal) => signal,
            None => {
                let signal = Arc::new(Notify::new());
                signals.insert(session_id.to_owned(), Arc::downgrade(&signal));
                signal
            }
        };
        Subscription {
            registry: self.clone(),
            session_id: session_id.to_owned(),
            signal,
        }
    }

    /// Wakes every claim parked on the session; each re-checks the store.
    pub fn wake(&self, session_id: &str) {
        let signal = self.signals().get(session_id).and_then(Weak::upgrade);
        if let Some(signal) = signal {
            signal.notify_waiters();
        }
    }

    /// Wakes every waiter, of every session.
    pub fn wake_all(&self) {
        let signals: Vec<_> = self.signals().values().filter_map(Weak::upgrade).collect();
        signals.iter().for_each(|signal| signal.notify_waiters());
    }

    /// How many sessions have a parked claim: for the test that a session's
    /// signal goes with its last waiter (`/metrics` counts parked claims).
    #[cfg(test)]
    fn sessions_waited_on(&self) -> usize {
        self.signals().len()
    }
}

impl Subscription {
    pub fn signal(&self) -> &Notify {
        &self.signal
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut signals = self.registry.signals();
        // Strong references are only cloned under this lock, so the count is exact.
        if Arc::strong_count(&self.signal) == 1 {
            signals.remove(&self.session_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_reaches_an_enabled_waiter_and_the_signal_goes_with_the_last_waiter() {
        let wakeups = Arc::new(Wakeups::default());
        let a = wakeups.subscribe("s");
        let b = wakeups.subscribe("s");
        assert_eq!(wakeups.sessions_waited_on(), 1);
        {
            let notified = a.signal().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            wakeups.wake("s");
            notified.await;
        }
        drop(a);
        assert_eq!(wakeups.sessions_waited_on(), 1);
        drop(b);
        assert_eq!(wakeups.sessions_waited_on(), 0);
    }
}
