// Permission requests on the Web chat page, in headless Chromium against a
// real broker: a request the host records appears as a card without a
// reload, its preview shown as text (never HTML); Allow answers it and the
// card shows "allowed"; an answer given elsewhere (the API, as Lark would)
// updates a card live; the agent's presence shows beside the session and
// changes live; a reload shows the same cards; axe-core.
//
//   node tests/browser/permissions.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, bindSession, brokerForThisProcess, eventually, launchPage, openChat, seriousAxeProblems, stepper } from './support.mjs';

const HOSTILE_PREVIEW = '<img src=x onerror="window.__pwned=1"><b>bold?</b>\nrm -rf build';

const broker = brokerForThisProcess();
let browser;
let page;
let session;
const pageErrors = [];
const { step, shot } = stepper(() => page);

// Pending cards are pinned above the composer, settled ones in the transcript.
const card = (requestId) => page.locator(`li.permission-card[data-request-id="${requestId}"]`);

async function requestPermission(requestId, toolName, description, preview) {
  const { status } = await broker.call('POST', `/v1/sessions/${session.session_id}/permission-requests`, {
    ...session.host,
    request_id: requestId,
    tool_name: toolName,
    description,
    input_preview: preview,
  });
  assert.equal(status, 201);
}

const requestState = async (requestId) =>
  (await broker.ok('GET', `/v1/sessions/${session.session_id}/permission-requests/${requestId}`)).state;

describe('permission requests on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-permissions');
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('a request appears as a card without a reload, its preview as plain text', async () => {
    await requestPermission('abcde', 'Bash', 'Remove the build directory', HOSTILE_PREVIEW);
    const shown = card('abcde');
    await shown.waitFor();
    assert.equal(await shown.getAttribute('data-state'), 'pending');
    assert.match(await shown.locator('.permission-title').innerText(), /Bash/);
    assert.equal(await shown.locator('.permission-description').innerText(), 'Remove the build directory');
    assert.equal(await shown.locator('pre.permission-preview').textContent(), HOSTILE_PREVIEW);
    assert.equal(await shown.locator('img, b').count(), 0, 'the preview is never HTML');
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
    await shot('permission-pending');
  });

  step('Allow answers it and the card shows "allowed"', async () => {
    await card('abcde').getByRole('button', { name: 'Allow' }).click();
    await eventually('the card to show allowed', async () => (await card('abcde').getAttribute('data-state')) === 'allowed');
    assert.equal(await card('abcde').locator('[data-permission-state]').textContent(), 'allowed');
    assert.match(await card('abcde').locator('.permission-outcome').innerText(), /by the owner/);
    assert.equal(await card('abcde').getByRole('button').count(), 0, 'an answered card has no buttons');
    assert.equal(await requestState('abcde'), 'allowed');
    await shot('permission-allowed');
  });

  step('an answer given elsewhere updates the card live', async () => {
    await requestPermission('fghij', 'Write', 'Write src/main.rs', 'fn main() {}');
    await card('fghij').waitFor();
    // Answered through the API (as Lark would) while the page still shows the buttons.
    await broker.ok('POST', `/v1/sessions/${session.session_id}/permission-requests/fghij/answer`, { behavior: 'deny' });
    await eventually('the card to show denied', async () => (await card('fghij').getAttribute('data-state')) === 'denied');
    assert.match(await card('fghij').locator('.permission-outcome').innerText(), /by the owner/);
  });

  step("the agent's presence shows beside the session and changes live", async () => {
    const badge = page.locator('#chat-state .agent-badge');
    assert.equal(await badge.getAttribute('data-agent-state'), 'away');
    for (const state of ['waiting', 'working']) {
      await broker.ok('POST', `/v1/sessions/${session.session_id}/agent-state`, { ...session.host, state });
      await eventually(`the badge to show ${state}`, async () => (await badge.getAttribute('data-agent-state')) === state);
    }
    assert.equal(await badge.textContent(), 'agent working');
  });

  step('a reload shows the same cards', async () => {
    await page.reload();
    await card('fghij').waitFor();
    const states = await page.locator('#transcript > li.permission-card').evaluateAll((cards) => cards.map((c) => `${c.dataset.requestId}:${c.dataset.state}`));
    assert.deepEqual(states, ['abcde:allowed', 'fghij:denied']);
  });

  step('axe-core finds no serious or critical accessibility violation with a pending card', async () => {
    await requestPermission('pqrst', 'Bash', 'Run the tests', 'cargo test');
    await card('pqrst').waitFor();
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('threw nothing', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
