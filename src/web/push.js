// Web Push for this browser (WEB.md "Installable, and it tells you"): once
// the person turned notifications on, the page subscribes through the
// service worker with the broker's VAPID key and hands the subscription to
// the broker, which then tells this browser when the agent needs the person,
// answered, or stalled, even with the page closed. Best effort: a browser
// without a push service keeps the notifications the open page shows.

import * as api from './api.js';

const SUBSCRIPTION_KEY = 'loopx.push-subscription';

function fromBase64Url(text) {
  const base64 = text.replace(/-/g, '+').replace(/_/g, '/');
  return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
}

/** Subscribes this browser; resolves to whether it is subscribed. */
export async function subscribePush() {
  if (!('serviceWorker' in navigator) || !('PushManager' in window)) return false;
  try {
    const registration = await navigator.serviceWorker.ready;
    const { data } = await api.request('GET', '/v1/push/key');
    const subscription = await registration.pushManager.subscribe({
      userVisibleOnly: true,
      applicationServerKey: fromBase64Url(data.key),
    });
    const { endpoint, keys } = subscription.toJSON();
    const made = await api.request('POST', '/v1/push/subscriptions', { endpoint, keys });
    localStorage.setItem(SUBSCRIPTION_KEY, made.data.subscription_id);
    return true;
  } catch {
    return false; // no push service here: the open page still notifies
  }
}

/** Ends this browser's subscription, here and at the broker. */
export async function unsubscribePush() {
  try {
    const id = localStorage.getItem(SUBSCRIPTION_KEY);
    localStorage.removeItem(SUBSCRIPTION_KEY);
    if (id) await api.request('DELETE', `/v1/push/subscriptions/${encodeURIComponent(id)}`).catch(() => {});
    const registration = await navigator.serviceWorker?.getRegistration();
    const subscription = await registration?.pushManager?.getSubscription();
    await subscription?.unsubscribe();
  } catch {
    // nothing to end
  }
}
