// One conversation per terminal on the Web chat page, in headless Chromium
// against a real broker (issue 55): the page open on a session whose agent's
// terminal goes on in a new host session (`/clear`, a restart) follows it,
// the person's draft with it; the new session's waiting message is there,
// and each side links the other.
//
//   node tests/browser/continued.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, brokerForThisProcess, eventually, launchPage, openChat, seriousAxeProblems, stepper } from './support.mjs';

const broker = brokerForThisProcess();
let browser;
let page;
let old;
let waiting;
const pageErrors = [];
const { step, shot } = stepper(() => page);

/** Registers and binds a host session from the terminal `term-pane-1`. */
async function boundFromTheTerminal(hostSessionId) {
  const identity = { goal_id: 'goal-browser', agent_id: 'agent-web', host_surface: 'claude-code', host_session_id: hostSessionId };
  await broker.ok('POST', '/v1/agent-threads', identity);
  return broker.ok('POST', '/v1/sessions', { ...identity, executor_endpoint_id: 'exec-browser', terminal: 'term-pane-1' });
}

describe('a conversation continued after /clear', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    old = await boundFromTheTerminal('host-before-clear');
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, old.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('a message sent before /clear, and a draft being typed', async () => {
    await page.fill('#composer-text', 'Still waiting for the deploy?');
    await page.press('#composer-text', 'Enter');
    await eventually('the message to be sent', async () => (await broker.ok('GET', `/v1/sessions/${old.session_id}/turns`)).turns.length === 1);
    waiting = (await broker.ok('GET', `/v1/sessions/${old.session_id}/turns`)).turns[0];
    await page.fill('#composer-text', 'a half-written follow-up');
  });

  step('after /clear the page follows the conversation, the draft and the message with it', async () => {
    const next = await boundFromTheTerminal('host-after-clear');
    assert.equal(next.continued_from, old.session_id);
    await page.waitForURL(`**/#/s/${next.session_id}`);
    await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
    await page.locator('#continued-note', { hasText: 'earlier messages' }).waitFor();
    assert.equal(await page.locator('#composer-text').inputValue(), 'a half-written follow-up');
    assert.equal(await page.locator('#composer-text').isDisabled(), false);
    await page.locator(`#transcript li[data-turn-id="${waiting.turn_id}"]`).waitFor();
    assert.equal((await broker.ok('GET', `/v1/sessions/${old.session_id}`)).continued_in, next.session_id);
    await shot('continued-followed');
  });

  step('the old session, opened, names where the conversation went on', async () => {
    await page.goto(`${broker.base}/#/s/${old.session_id}`);
    const note = page.locator('#continued-note', { hasText: 'the conversation goes on here' });
    await note.waitFor();
    assert.equal(await page.locator('#closed-note').isHidden(), true);
    assert.deepEqual(await seriousAxeProblems(page), []);
    await note.getByRole('link').click();
    await page.locator('#continued-note', { hasText: 'earlier messages' }).waitFor();
  });

  step('an agent away says how to bring it back, its waiting messages kept', async () => {
    const state = page.locator('#chat-state');
    await state.filter({ hasText: 'claude --resume' }).waitFor();
    assert.match(await state.innerText(), /messages wait for the agent/);
    await shot('continued-away');
  });

  step('no error on the page', async () => {
    assert.deepEqual(pageErrors, []);
  });
});
