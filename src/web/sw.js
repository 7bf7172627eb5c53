// The LoopX chat's service worker: keeps the page's shell (its HTML, CSS,
// scripts and icons) so an installed page opens offline, and takes nothing
// else. Everything under /v1 carries a credential and live data, so it is
// never cached: those requests pass straight through. It also shows Web
// Push messages: a push names only a session and what happened there (no
// text ever crosses the push service), and a click opens that session.
//
// The broker fills in SHELL (every embedded asset's path) and VERSION (a hash
// of their bytes) when it serves this file, so a newer broker replaces the
// cache in one step.

const SHELL = __SHELL__;
const VERSION = '__VERSION__';
const CACHE = `loopx-shell-${VERSION}`;

self.addEventListener('install', (event) => {
  event.waitUntil(
    caches
      .open(CACHE)
      .then((cache) => cache.addAll(SHELL))
      .then(() => self.skipWaiting()),
  );
});

self.addEventListener('activate', (event) => {
  event.waitUntil(
    caches
      .keys()
      .then((names) => Promise.all(names.filter((name) => name !== CACHE).map((name) => caches.delete(name))))
      .then(() => self.clients.claim()),
  );
});

/** The shell's path a request asks for, or null (not ours to answer). */
function shellPath(request) {
  if (request.method !== 'GET') return null;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin) return null;
  if (request.mode === 'navigate' && url.pathname === '/') return '/';
  return SHELL.includes(url.pathname) ? url.pathname : null;
}

// The network first, so a page never runs a stale script against a newer
// broker (the assets are served no-cache); the cached shell when offline.
self.addEventListener('fetch', (event) => {
  const path = shellPath(event.request);
  if (!path) return;
  event.respondWith(
    fetch(event.request)
      .then((response) => {
        if (response.ok) {
          const copy = response.clone();
          event.waitUntil(caches.open(CACHE).then((cache) => cache.put(path, copy)));
        }
        return response;
      })
      .catch(() => caches.match(path).then((cached) => cached || Response.error())),
  );
});

// What each kind of push says (the broker sends no text of its own).
const TOLD = {
  needs_you: 'The agent needs you',
  answered: 'The agent answered',
  stalled: 'An agent seems stuck',
};

self.addEventListener('push', (event) => {
  let data = {};
  try {
    data = event.data ? event.data.json() : {};
  } catch {
    data = {};
  }
  const session = typeof data.session_id === 'string' ? data.session_id : '';
  const url = session ? `/#/s/${encodeURIComponent(session)}` : '/';
  event.waitUntil(
    self.registration.showNotification(TOLD[data.kind] || 'LoopX', {
      body: 'Open LoopX to see it.',
      tag: `${session}:${data.kind}`,
      icon: '/assets/icon-192.png',
      data: { url },
    }),
  );
});

// A click opens the session: in a LoopX window already open, or a new one.
self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const url = new URL(event.notification.data?.url || '/', self.location.origin).href;
  event.waitUntil(
    self.clients.matchAll({ type: 'window', includeUncontrolled: true }).then((windows) => {
      const open = windows.find((w) => new URL(w.url).origin === self.location.origin);
      if (!open) return self.clients.openWindow(url);
      return open.navigate(url).then((w) => (w || open).focus());
    }),
  );
});
