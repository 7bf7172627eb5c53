// Signing a phone in with a link (WEB.md "Signing in a phone"), in headless
// Chromium at 390 × 844 against a real broker: the owner makes a link (as
// `loopx web link` does); opening it signs the page in with a device
// credential of its own (never the owner token), the code gone from the
// address bar; the device lists and sends like the owner; a used link is
// refused in words; revoking the device signs the page out at its next
// request. Screenshots into target/test-artifacts/browser/.
//
//   LOOPX_BIN=target/debug/loopx node tests/browser/devices.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';

import { allTurns, bindSession, brokerForThisProcess, eventually, launchPage, seriousAxeProblems, stepper } from './support.mjs';

const broker = brokerForThisProcess();
let browser;
let page;
let session;
let code;
const pageErrors = [];
const { step, shot } = stepper(() => page);

const stored = () =>
  page.evaluate(() => ({
    device: localStorage.getItem('loopx.device-token'),
    owner: sessionStorage.getItem('loopx.owner-token'),
  }));

describe('a phone signs in with a link', () => {
  before(async () => {
    await broker.start();
    session = await bindSession(broker, 'host-session-phone-link');
    ({ browser, page } = await launchPage(pageErrors));
    await page.setViewportSize({ width: 390, height: 844 });
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('opening the link signs the page in with a credential of its own', async () => {
    ({ code } = await broker.ok('POST', '/v1/devices/links'));
    await page.goto(`${broker.base}/#link=${code}`);
    await page.locator('#app-view').waitFor();
    await page.locator(`a.session-link[data-session-id="${session.session_id}"]`).waitFor();
    assert.equal(await page.evaluate(() => location.hash), '', 'the code left the address bar');
    const { device, owner } = await stored();
    assert.match(device, /^lxd_/);
    assert.notEqual(device, broker.token);
    assert.equal(owner, null, 'the owner token never reached the phone');
    const { devices } = await broker.ok('GET', '/v1/devices');
    assert.equal(devices.length, 1);
    assert.equal(devices[0].name, 'Chrome on Linux');
    await shot('devices-signed-in-390x844');
  });

  step('the device opens a session and sends, as the owner would', async () => {
    await page.click(`a.session-link[data-session-id="${session.session_id}"]`);
    await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
    await page.fill('#composer-text', 'Sent from the phone');
    await page.press('#composer-text', 'Enter');
    await eventually('the message queued', async () => (await allTurns(broker, session.session_id)).some((t) => t.text === 'Sent from the phone'));
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('the page keeps its credential over a reload (an installed page restarts)', async () => {
    await page.reload();
    await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
    assert.equal(await page.locator('#token-view').isVisible(), false);
  });

  step('a used link is refused in words, and changes nothing', async () => {
    const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
    const other = await context.newPage();
    other.on('pageerror', (error) => pageErrors.push(error));
    try {
      await other.goto(`${broker.base}/#link=${code}`);
      await other.locator('#token-error', { hasText: 'Could not sign in: This sign-in link is not valid' }).waitFor();
      assert.match(await other.locator('#token-error').innerText(), /used, it expired, or it was never made/);
      assert.equal(await other.evaluate(() => localStorage.getItem('loopx.device-token')), null);
      await other.screenshot({ path: 'target/test-artifacts/browser/devices-used-link-390x844.png' });
    } finally {
      await context.close();
    }
    assert.equal((await broker.ok('GET', '/v1/devices')).devices.length, 1);
  });

  step('the owner makes a link on the page ("Sign in another device…"); a second phone signs in with it', async () => {
    assert.equal(await page.locator('#link-device').isVisible(), false, 'a device cannot make links');
    const ownerContext = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const phoneContext = await browser.newContext({ viewport: { width: 390, height: 844 } });
    try {
      const owner = await ownerContext.newPage();
      owner.on('pageerror', (error) => pageErrors.push(error));
      await owner.goto(`${broker.base}/`);
      await owner.fill('#token-input', broker.token);
      await owner.press('#token-input', 'Enter');
      await owner.getByRole('button', { name: 'Sign in another device…' }).click();
      await owner.locator('#link-url', { hasText: '#link=' }).waitFor();
      const url = await owner.locator('#link-url').innerText();
      assert.match(url, new RegExp(`^${broker.base}/#link=[0-9A-Z]{26}$`));
      assert.match(await owner.locator('#link-expiry').innerText(), /^Good once, until /);
      assert.deepEqual(await seriousAxeProblems(owner), []);
      await owner.screenshot({ path: 'target/test-artifacts/browser/devices-owner-link-1280x900.png' });
      const phone = await phoneContext.newPage();
      phone.on('pageerror', (error) => pageErrors.push(error));
      await phone.goto(url);
      await phone.locator(`a.session-link[data-session-id="${session.session_id}"]`).waitFor();
      assert.match(await phone.evaluate(() => localStorage.getItem('loopx.device-token')), /^lxd_/);
      await owner.getByRole('button', { name: 'Done' }).click();
      assert.equal(await owner.locator('#link-panel').isVisible(), false);
    } finally {
      await ownerContext.close();
      await phoneContext.close();
    }
    assert.equal((await broker.ok('GET', '/v1/devices')).devices.length, 2);
  });

  step('revoking the device signs the page out at its next request', async () => {
    const { devices } = await broker.ok('GET', '/v1/devices');
    const { status } = await broker.call('DELETE', `/v1/devices/${devices[0].device_id}`);
    assert.equal(status, 204);
    await page.reload();
    await page.locator('#token-view').waitFor();
    assert.match(await page.locator('#token-error').innerText(), /did not accept the token/);
    assert.deepEqual(await stored(), { device: null, owner: null });
    await shot('devices-revoked-390x844');
  });

  step('no error on the page', async () => {
    assert.deepEqual(pageErrors, []);
  });
});
