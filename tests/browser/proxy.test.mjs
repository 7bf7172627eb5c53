// The page through an HTTPS reverse proxy (WEB.md "Reaching the broker from
// a phone"; docs/phone.md), in headless Chromium at 390 × 844: a local TLS
// proxy (a throwaway self-signed certificate) in front of the broker on
// loopback, as a person would put Caddy or nginx there. A sign-in link made
// for the proxy's address signs the phone in through it, the service worker
// registers on the HTTPS origin, the session's event stream stays live
// through the proxy, and a message sent there reaches the broker.
//
//   LOOPX_BIN=target/debug/loopx node tests/browser/proxy.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium
// and openssl.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe } from 'node:test';

import { chromium } from 'playwright-core';

import { CHROMIUM, CHROMIUM_ARGS, allTurns, bindSession, brokerForThisProcess, eventually, freePort, stepper } from './support.mjs';

const broker = brokerForThisProcess();
let browser;
let page;
let proxy;
let base;
let session;
let certDir;
const pageErrors = [];
const { step, shot } = stepper(() => page);

/** A TLS reverse proxy to the broker, streaming both ways (event streams too). */
async function startProxy() {
  certDir = await fs.mkdtemp(path.join(os.tmpdir(), 'loopx-proxy-'));
  const [key, cert] = [path.join(certDir, 'key.pem'), path.join(certDir, 'cert.pem')];
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1', '-days', '1',
    '-keyout', key, '-out', cert,
  ], { stdio: 'ignore' });
  const target = new URL(broker.base);
  const server = https.createServer({ key: await fs.readFile(key), cert: await fs.readFile(cert) }, (req, res) => {
    const upstream = http.request(
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: { ...req.headers, host: target.host } },
      (answer) => {
        res.writeHead(answer.statusCode, answer.headers);
        res.flushHeaders(); // unbuffered, as docs/phone.md sets Caddy and nginx
        answer.pipe(res);
      },
    );
    upstream.on('error', () => res.destroy());
    req.pipe(upstream);
  });
  const port = await freePort();
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
  return { server, base: `https://127.0.0.1:${port}` };
}

describe('the page through an HTTPS reverse proxy', () => {
  before(async () => {
    await broker.start();
    session = await bindSession(broker, 'host-session-proxy');
    ({ server: proxy, base } = await startProxy());
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: [...CHROMIUM_ARGS, '--ignore-certificate-errors'] });
    const context = await browser.newContext({ viewport: { width: 390, height: 844 }, ignoreHTTPSErrors: true });
    page = await context.newPage();
    page.setDefaultTimeout(15000);
    page.on('pageerror', (error) => pageErrors.push(error));
  });

  after(async () => {
    await browser?.close();
    proxy?.closeAllConnections();
    proxy?.close();
    await broker.stop();
    if (certDir) await fs.rm(certDir, { recursive: true, force: true });
  });

  step('a link made for the proxy address signs the phone in through it', async () => {
    const { code } = await broker.ok('POST', '/v1/devices/links');
    await page.goto(`${base}/#link=${code}`);
    await page.locator(`a.session-link[data-session-id="${session.session_id}"]`).waitFor();
    assert.equal(await page.evaluate(() => window.isSecureContext && location.protocol), 'https:');
    assert.match(await page.evaluate(() => localStorage.getItem('loopx.device-token')), /^lxd_/);
  });

  step('the service worker registers and controls the page on the HTTPS origin', async () => {
    await page.evaluate(() => navigator.serviceWorker.ready);
    await page.reload();
    await eventually('the page controlled', () => page.evaluate(() => navigator.serviceWorker.controller !== null));
  });

  step('the event stream stays live through the proxy, and a message reaches the broker', async () => {
    await page.click(`a.session-link[data-session-id="${session.session_id}"]`);
    await eventually('the event stream', async () => (await page.locator('#live-status').getAttribute('data-live')) === 'live');
    await page.fill('#composer-text', 'Through the proxy');
    await page.press('#composer-text', 'Enter');
    await eventually('the message queued', async () => (await allTurns(broker, session.session_id)).some((t) => t.text === 'Through the proxy'));
    // An answer arrives live, over the proxied stream.
    const [turn] = await allTurns(broker, session.session_id);
    await broker.ok('POST', `/v1/sessions/${session.session_id}/claims`, { ...session.host, claim_id: 'proxy-claim' });
    await broker.ok('POST', `/v1/sessions/${session.session_id}/turns/${turn.turn_id}/complete`, {
      ...session.host,
      claim_id: 'proxy-claim',
      completion_id: 'proxy-done',
      response: { message: 'Answered through the proxy.' },
    });
    await page.locator('.response-message', { hasText: 'Answered through the proxy.' }).waitFor();
    await shot('proxy-phone-390x844');
  });

  step('no error on the page', async () => {
    assert.deepEqual(pageErrors, []);
  });
});
