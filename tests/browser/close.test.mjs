// Closing a session from the Web chat page, in headless Chromium against a
// real broker (issue 28): Close asks first; a session whose agent holds an
// unanswered message is refused with `claim_active`, which the page explains
// and offers to release the message and close in one step; the page is then
// read-only, the message cancelled, and the agent's late answer refused.
//
//   node tests/browser/close.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, bindSession, brokerForThisProcess, eventually, launchPage, openChat, seriousAxeProblems, stepper } from './support.mjs';

const broker = brokerForThisProcess();
let browser;
let page;
let session;
let held;
const pageErrors = [];
const { step, shot } = stepper(() => page);

describe('closing a session from the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-close');
    held = await broker.ok('POST', `/v1/sessions/${session.session_id}/messages`, { origin: 'web', text: 'Are you there?' });
    // The agent takes the message and then goes silent.
    const claimed = await broker.ok('POST', `/v1/sessions/${session.session_id}/claims`, { ...session.host, claim_id: 'claim-gone' });
    assert.equal(claimed.turn.turn_id, held.turn_id);
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('Close asks first, and Keep open changes nothing', async () => {
    await page.getByRole('button', { name: 'Close session…' }).click();
    assert.match(await page.locator('#close-question').innerText(), /cancelled/);
    await page.getByRole('button', { name: 'Keep open' }).click();
    assert.equal(await page.locator('#close-panel').isHidden(), true);
    assert.equal((await broker.ok('GET', `/v1/sessions/${session.session_id}`)).state, 'open');
  });

  step('a claim_active refusal is explained, with the release offered', async () => {
    await page.getByRole('button', { name: 'Close session…' }).click();
    await page.getByRole('button', { name: 'Close', exact: true }).click();
    const problem = page.locator('#close-problem');
    await problem.waitFor();
    assert.match(await problem.innerText(), /has not answered yet/);
    assert.match(await problem.innerText(), /release that message and close/);
    assert.equal(await page.getByRole('button', { name: 'Close', exact: true }).isHidden(), true);
    assert.equal((await broker.ok('GET', `/v1/sessions/${session.session_id}`)).state, 'open');
    await shot('close-claim-active');
  });

  step('axe-core finds no serious or critical accessibility violation with the explanation shown', async () => {
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('Release and close closes the session in one step', async () => {
    await page.getByRole('button', { name: 'Release the message and close' }).click();
    await page.locator('#closed-note').waitFor();
    assert.equal(await page.locator('#composer-text').isDisabled(), true);
    assert.equal(await page.locator('#close-session').isHidden(), true);
    const closed = await broker.ok('GET', `/v1/sessions/${session.session_id}`);
    assert.equal(closed.state, 'closed');
    const turn = await broker.ok('GET', `/v1/sessions/${session.session_id}/turns/${held.turn_id}`);
    assert.equal(turn.state, 'cancelled');
    await eventually('the message to show cancelled', async () =>
      (await page.locator(`#transcript li[data-turn-id="${held.turn_id}"]`).getAttribute('data-state')) === 'cancelled',
    );
    await shot('close-released');
  });

  step("the agent's late answer is refused", async () => {
    const { status, data } = await broker.call('POST', `/v1/sessions/${session.session_id}/turns/${held.turn_id}/complete`, {
      ...session.host,
      claim_id: 'claim-gone',
      completion_id: 'late',
      response: { message: 'I was away' },
    });
    assert.equal(status, 409);
    assert.equal(data.error.code, 'not_claimed');
  });

  step('the session list shows open conversations first, each group newest first', async () => {
    // A newer session, open, and the one just closed: the open one on top,
    // then the closed one, though a newer closed one would come first by age.
    const older = await bindSession(broker, 'host-session-close-older');
    const newest = await bindSession(broker, 'host-session-close-newest');
    await broker.ok('POST', `/v1/sessions/${newest.session_id}/close`, {});
    await page.goto(`${broker.base}/#`);
    await page.locator(`a.session-link[data-session-id="${newest.session_id}"]`).waitFor();
    const order = await page.locator('a.session-link').evaluateAll((links) => links.map((a) => a.dataset.sessionId));
    const at = (s) => order.indexOf(s.session_id);
    assert.ok(at(older) < at(newest), `the open one first: ${order}`);
    assert.ok(at(older) < at(session), `open before closed: ${order}`);
    assert.ok(at(newest) < at(session), `closed ones newest first: ${order}`);
    assert.match(await page.locator('#sessions-note').innerText(), /open first, newest first/);
  });

  step('threw nothing', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
