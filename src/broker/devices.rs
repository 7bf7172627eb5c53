//! Devices signed in with a one-time link ([`crate::devices`]): the link
//! minted, traded for a device credential (behind the wrong-code throttle),
//! the devices listed and revoked, and a request's credential checked.

use super::Broker;
use crate::devices::{self, DeviceRow, NewDevice};
use crate::error::Result;
use crate::model::{Device, DeviceLink, DeviceList, SignIn, SignedIn};
use crate::time::{now_ms, rfc3339};

impl Broker {
    /// A new one-time sign-in code; only its hash is stored.
    pub async fn mint_device_link(&self) -> Result<DeviceLink> {
        let code = devices::new_code()?;
        let expires_at = self.store.mint_device_link(devices::hash(&code)).await?;
        Ok(DeviceLink {
            code,
            expires_at: rfc3339(expires_at),
        })
    }

    /// Trades a sign-in code for a device credential, shown this once. A
    /// wrong, used or expired code is one refusal (401) and counts towards
    /// the throttle, which refuses every sign-in while it is shut (429).
    pub async fn sign_in_device(&self, sign_in: SignIn) -> Result<SignedIn> {
        let name = devices::checked_name(&sign_in.name)?;
        self.sign_ins.check(now_ms())?;
        let token = devices::new_token()?;
        let code = sign_in.code.trim().to_ascii_uppercase();
        let device = NewDevice {
            name,
            token_hash: devices::hash(&token),
        };
        let signed_in = self
            .store
            .sign_in_device(devices::hash(&code), device)
            .await
            .inspect_err(|e| {
                if e.code == crate::error::ErrorCode::Unauthorized {
                    self.sign_ins.wrong(now_ms());
                }
            })?;
        Ok(SignedIn {
            device_id: signed_in.device_id,
            name: signed_in.name,
            token,
        })
    }

    pub async fn devices(&self) -> Result<DeviceList> {
        let rows = self.store.devices().await?;
        Ok(DeviceList {
            devices: rows.into_iter().map(device).collect(),
        })
    }

    /// Revokes a device: its next request is 401. 404 when there is none.
    pub async fn revoke_device(&self, device_id: &str) -> Result<()> {
        if !self.store.revoke_device(device_id.to_owned()).await? {
            return Err(crate::error::Error::not_found("device"));
        }
        self.seen_lock().remove(device_id);
        Ok(())
    }

    /// The device a presented device credential belongs to, if one is
    /// signed in with it; its last sighting written at most once a minute.
    pub async fn device_for(&self, token: &str) -> Result<Option<DeviceRow>> {
        let Some(device) = self.store.device_by_token(&devices::hash(token)).await? else {
            return Ok(None);
        };
        let now = now_ms();
        let due = {
            let mut seen = self.seen_lock();
            let due = seen
                .get(&device.device_id)
                .is_none_or(|at| now - at >= devices::SEEN_EVERY_MS);
            if due {
                seen.insert(device.device_id.clone(), now);
            }
            due
        };
        if due {
            self.store
                .device_seen(device.device_id.clone(), now)
                .await?;
        }
        Ok(Some(device))
    }

    fn seen_lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, i64>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn device(row: DeviceRow) -> Device {
    Device {
        device_id: row.device_id,
        name: row.name,
        created_at: rfc3339(row.created_at),
        last_seen_at: row.last_seen_at.map(rfc3339),
    }
}
