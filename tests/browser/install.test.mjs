// The page installs (WEB.md "Installable, and it tells you"), in headless
// Chromium against a real broker: the manifest is served as such, is valid
// (name, standalone, start URL inside its scope, 192 and 512 px PNG icons
// that load as PNGs of that size), and the page links it; the service worker
// registers, controls the page, and keeps the shell, so the page opens with
// the network gone; nothing under /v1 is ever cached; the strict CSP holds;
// a push message (delivered through DevTools) is shown as the service worker
// says, without any text of the message.
//
//   LOOPX_BIN=target/debug/loopx node tests/browser/install.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';

import { brokerForThisProcess, eventually, launchPage, stepper } from './support.mjs';

const broker = brokerForThisProcess();
let browser;
let page;
const pageErrors = [];
const { step, shot } = stepper(() => page);

describe('the page installs and opens offline', () => {
  before(async () => {
    await broker.start();
    ({ browser, page } = await launchPage(pageErrors));
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('the manifest is served as a manifest, is valid, and the page links it', async () => {
    const response = await fetch(`${broker.base}/manifest.webmanifest`);
    assert.equal(response.status, 200);
    assert.equal(response.headers.get('content-type'), 'application/manifest+json');
    const manifest = await response.json();
    assert.equal(manifest.name, 'LoopX chat');
    assert.ok(manifest.short_name && manifest.short_name.length <= 12, 'a short name fits under an icon');
    assert.equal(manifest.display, 'standalone');
    const start = new URL(manifest.start_url, broker.base);
    const scope = new URL(manifest.scope, broker.base);
    assert.ok(start.href.startsWith(scope.href), 'the start URL is inside the scope');
    assert.match(manifest.theme_color, /^#[0-9a-f]{6}$/i);
    assert.match(manifest.background_color, /^#[0-9a-f]{6}$/i);
    const pngs = manifest.icons.filter((icon) => icon.type === 'image/png');
    assert.deepEqual(pngs.map((icon) => icon.sizes).sort(), ['192x192', '512x512']);

    await page.goto(`${broker.base}/`);
    const linked = await page.evaluate(() => document.querySelector('link[rel="manifest"]').href);
    assert.equal(linked, `${broker.base}/manifest.webmanifest`);
    // The icons load in the page (under its CSP) as PNGs of the size they say.
    for (const icon of pngs) {
      const size = await page.evaluate(async (src) => {
        const image = new Image();
        image.src = src;
        await image.decode();
        return `${image.naturalWidth}x${image.naturalHeight}`;
      }, icon.src);
      assert.equal(size, icon.sizes, icon.src);
      const fetched = await fetch(new URL(icon.src, broker.base));
      assert.equal(fetched.headers.get('content-type'), 'image/png');
    }
  });

  step('Chromium reads the manifest without errors', async () => {
    const cdp = await page.context().newCDPSession(page);
    const { url, errors, data } = await cdp.send('Page.getAppManifest');
    assert.equal(url, `${broker.base}/manifest.webmanifest`);
    assert.deepEqual(errors, []);
    assert.equal(JSON.parse(data).start_url, '/');
  });

  step('the service worker registers and controls the page', async () => {
    await page.evaluate(() => navigator.serviceWorker.ready);
    await page.reload();
    await eventually('the page controlled', () => page.evaluate(() => navigator.serviceWorker.controller !== null));
    const worker = await page.evaluate(async () => {
      const registration = await navigator.serviceWorker.getRegistration();
      return { scope: registration.scope, script: registration.active.scriptURL };
    });
    assert.deepEqual(worker, { scope: `${broker.base}/`, script: `${broker.base}/sw.js` });
    const sw = await fetch(`${broker.base}/sw.js`);
    assert.equal(sw.headers.get('content-type'), 'text/javascript; charset=utf-8');
    assert.match(sw.headers.get('content-security-policy'), /worker-src 'self'/);
  });

  step('the shell is cached, nothing under /v1 is', async () => {
    await page.fill('#token-input', broker.token);
    await page.press('#token-input', 'Enter');
    await page.locator('#app-view').waitFor();
    await page.locator('#sessions-note').filter({ hasText: /session/ }).waitFor();
    const cached = await page.evaluate(async () => {
      const urls = [];
      for (const name of await caches.keys()) {
        for (const request of await (await caches.open(name)).keys()) urls.push(new URL(request.url).pathname);
      }
      return urls;
    });
    for (const path of ['/', '/assets/app.js', '/assets/app.css', '/manifest.webmanifest', '/assets/icon-192.png']) {
      assert.ok(cached.includes(path), `${path} cached (${cached.join(', ')})`);
    }
    assert.deepEqual(
      cached.filter((path) => path.startsWith('/v1')),
      [],
      'no credential-bearing answer is kept',
    );
  });

  step('a push names a session and its kind; the worker shows it without any text, linked to the session', async () => {
    await page.context().grantPermissions(['notifications'], { origin: broker.base });
    const cdp = await page.context().newCDPSession(page);
    const registered = new Promise((resolve) =>
      cdp.on('ServiceWorker.workerRegistrationUpdated', ({ registrations }) => {
        const ours = registrations.find((r) => r.scopeURL === `${broker.base}/` && !r.isDeleted);
        if (ours) resolve(ours.registrationId);
      }),
    );
    await cdp.send('ServiceWorker.enable');
    const registrationId = await registered;
    const data = JSON.stringify({ session_id: 'ses_01PUSHED', kind: 'needs_you' });
    await cdp.send('ServiceWorker.deliverPushMessage', { origin: broker.base, registrationId, data });
    const shown = await eventually('the notification', () =>
      page.evaluate(async () => {
        const registration = await navigator.serviceWorker.ready;
        const [note] = await registration.getNotifications();
        return note && { title: note.title, body: note.body, url: note.data.url, tag: note.tag };
      }),
    );
    assert.deepEqual(shown, {
      title: 'The agent needs you',
      body: 'Open LoopX to see it.',
      url: '/#/s/ses_01PUSHED',
      tag: 'ses_01PUSHED:needs_you',
    });
    await cdp.send('ServiceWorker.disable');
  });

  step('with the network gone the page still opens, from its shell', async () => {
    await page.context().setOffline(true);
    try {
      await page.reload();
      await page.locator('h1.brand').waitFor();
      assert.equal(await page.title(), 'LoopX chat');
      const brand = await page.locator('h1.brand').evaluate((h) => getComputedStyle(h).display);
      assert.equal(brand, 'flex', 'the stylesheet came from the cache');
      await page.locator('#page-error', { hasText: 'Could not reach the broker' }).waitFor();
      await shot('install-offline');
    } finally {
      await page.context().setOffline(false);
    }
  });

  step('no error on the page', async () => {
    assert.deepEqual(pageErrors, []);
  });
});
