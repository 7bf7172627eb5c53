// One conversation everywhere (issue 37), on the Web chat page in headless
// Chromium against a real broker (`LOOPX_STALL_AFTER=3s`): a prompt typed at
// the agent's terminal (its UserPromptSubmit hook reports it) shows in the
// transcript marked "At the terminal", in its place before a Web message
// sent after it, and its answer when the agent's Stop reports it; a working
// agent with no hook event for 3 s shows "agent stalled", live, until its
// next event.
//
//   node tests/browser/terminal.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, allTurns, bindSession, brokerForThisProcess, eventually, launchPage, openChat, stepper } from './support.mjs';

process.env.LOOPX_STALL_AFTER = '3s';
const broker = brokerForThisProcess();
let browser;
let page;
let session;
const pageErrors = [];
const { step, shot } = stepper(() => page);

const badge = () => page.locator('#chat-state .agent-badge');
const report = (body) => broker.ok('POST', `/v1/sessions/${session.session_id}/agent-state`, { ...session.host, ...body });
const whoSaid = () => page.locator('.bubble-user .who').allTextContents();

describe('terminal turns and a stalled agent, on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-terminal');
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('a prompt typed at the terminal shows, marked, while the agent works on it', async () => {
    await report({ state: 'working', prompt: 'Run the test suite and fix what fails.' });
    await eventually('the terminal turn to show', async () => (await whoSaid()).includes('At the terminal'));
    assert.match(await page.locator('.bubble-user .bubble-text').first().textContent(), /Run the test suite/);
    assert.match(await page.locator('.state-words').first().textContent(), /the agent is working on it/);
  });

  step('a Web message sent meanwhile comes after it, and the answer lands on the terminal turn', async () => {
    await broker.ok('POST', `/v1/sessions/${session.session_id}/messages`, { origin: 'web', text: 'Also bump the version.' });
    await report({ state: 'working', answer: 'Two tests were stale; both fixed.' });
    // Each turn's event refreshes that turn on its own, so the answer may
    // show before the Web message does: wait for both, then check the order.
    await eventually('the answer and the Web message to show', async () =>
      (await page.locator('.response-message').count()) === 1 && (await whoSaid()).length === 2);
    assert.deepEqual(await whoSaid(), ['At the terminal', 'You, from the Web chat']);
    assert.match(await page.locator('.response-message').first().textContent(), /Two tests were stale/);
    const turns = await allTurns(broker, session.session_id);
    assert.deepEqual(turns.map((t) => [t.seq, t.origin, t.state]), [[1, 'terminal', 'completed'], [2, 'web', 'queued']]);
    await shot('terminal-turn');
  });

  step('a working agent silent for 3 s shows stalled, live, until its next event', async () => {
    await eventually('the badge to say stalled', async () => (await badge().getAttribute('data-agent-state')) === 'stalled', { timeout: 20000 });
    assert.match(await badge().textContent(), /^agent stalled · for \d/);
    await shot('stalled');
    await report({ state: 'working', tool: 'Bash' });
    await eventually('the badge to say working again', async () => (await badge().getAttribute('data-agent-state')) === 'working');
  });

  step('threw nothing', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
