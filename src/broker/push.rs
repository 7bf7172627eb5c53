//! Push subscriptions ([`crate::push`]): each tied to its caller, the owner
//! or one device, and gone with the device.

use super::Broker;
use crate::devices::Caller;
use crate::error::{Error, Result};
use crate::model::{NewPushSubscription, PushSubscription, PushSubscriptionList};
use crate::push::{self, PushSubscriptionRow};
use crate::time::rfc3339;

/// The device a caller's subscriptions belong to; `None`: the owner's.
fn device_of(caller: &Caller) -> Option<String> {
    match caller {
        Caller::Owner => None,
        Caller::Device(id) => Some(id.clone()),
    }
}

impl Broker {
    pub async fn subscribe(
        &self,
        caller: &Caller,
        subscription: NewPushSubscription,
    ) -> Result<PushSubscription> {
        push::check(&subscription)?;
        let row = self
            .store
            .subscribe(device_of(caller), subscription)
            .await?;
        self.push_wanted
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(shown(row))
    }

    pub async fn push_subscriptions(&self, caller: &Caller) -> Result<PushSubscriptionList> {
        let device = device_of(caller);
        let rows = self.store.push_subscriptions(device.as_deref()).await?;
        Ok(PushSubscriptionList {
            subscriptions: rows.into_iter().map(shown).collect(),
        })
    }

    /// Removes one of the caller's subscriptions; 404 for another's or none.
    pub async fn unsubscribe(&self, caller: &Caller, subscription_id: &str) -> Result<()> {
        let gone = self
            .store
            .unsubscribe(subscription_id.to_owned(), device_of(caller))
            .await?;
        if gone {
            Ok(())
        } else {
            Err(Error::not_found("push subscription"))
        }
    }
}

fn shown(row: PushSubscriptionRow) -> PushSubscription {
    PushSubscription {
        subscription_id: row.subscription_id,
        endpoint: row.endpoint,
        created_at: rfc3339(row.created_at),
    }
}
