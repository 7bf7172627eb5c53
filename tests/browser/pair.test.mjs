// Pairing a Lark chat from the Web chat page, in headless Chromium against a
// real broker (issue 38): the pair button asks the broker's pairing route for
// a one-time code and shows the `/link <code>` line to send the bot; a new
// code can be asked for; a closed session offers no pairing.
//
//   node tests/browser/pair.test.mjs
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
const pageErrors = [];
const { step, shot } = stepper(() => page);
// Ten characters of Crockford's base 32.
const LINE = /^\/link [0-9A-HJKMNP-TV-Z]{10}$/;

describe('pairing a Lark chat from the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-pair');
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('the pair button shows a code and the /link line to send', async () => {
    await page.getByRole('button', { name: 'Pair a Lark chat…' }).click();
    const line = page.locator('#pair-command');
    await eventually('the /link line', async () => LINE.test(await line.innerText()));
    assert.match(await page.locator('#pair-expiry').innerText(), /Good for one link until/);
    assert.equal(await page.getByRole('button', { name: 'Pair a Lark chat…' }).isHidden(), true);
    await shot('pair-code');
  });

  step('axe-core finds no serious or critical accessibility violation with the code shown', async () => {
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('New code shows another code; Done puts the button back', async () => {
    const line = page.locator('#pair-command');
    const first = await line.innerText();
    await page.getByRole('button', { name: 'New code' }).click();
    await eventually('another code', async () => {
      const now = await line.innerText();
      return LINE.test(now) && now !== first;
    });
    await page.getByRole('button', { name: 'Done' }).click();
    assert.equal(await page.locator('#pair-panel').isHidden(), true);
    assert.equal(await page.getByRole('button', { name: 'Pair a Lark chat…' }).isVisible(), true);
  });

  step('a linked chat shows its approvers; removing one and asking for terminal turns relink it', async () => {
    const sid = session.session_id;
    await broker.ok('PUT', `/v1/sessions/${sid}/lark-link`, {
      chat_id: 'oc_team',
      approvers: ['ou_ann', 'ou_bob'],
    });
    // Done re-reads the link (a code may have been used meanwhile).
    await page.getByRole('button', { name: 'Pair a Lark chat…' }).click();
    await page.getByRole('button', { name: 'Done' }).click();
    const panel = page.locator('#lark-link');
    await eventually('the linked chat', async () => (await panel.isVisible()) && /oc_team/.test(await panel.innerText()));
    assert.deepEqual(await page.locator('#lark-approvers code').allInnerTexts(), ['ou_ann', 'ou_bob']);
    await page.getByRole('button', { name: 'Remove approver ou_ann' }).click();
    await eventually('ou_ann removed', async () => {
      const link = await broker.ok('GET', `/v1/sessions/${sid}/lark-link`);
      return JSON.stringify(link.approvers) === '["ou_bob"]';
    });
    await eventually('the list redrawn', async () =>
      (await page.locator('#lark-approvers code').allInnerTexts()).join() === 'ou_bob');
    await page.getByLabel("Also send it the turns typed at the agent's terminal").check();
    await eventually('terminal turns on, approvers kept', async () => {
      const link = await broker.ok('GET', `/v1/sessions/${sid}/lark-link`);
      return link.terminal_turns === true && JSON.stringify(link.approvers) === '["ou_bob"]';
    });
    assert.deepEqual(await seriousAxeProblems(page), []);
    await shot('lark-link');
  });

  step('a closed session offers no pairing', async () => {
    await broker.ok('POST', `/v1/sessions/${session.session_id}/close`, {});
    await eventually('the page to show the session closed', async () => !(await page.locator('#closed-note').isHidden()));
    assert.equal(await page.locator('#lark-pair').isHidden(), true);
    assert.equal(await page.locator('#lark-link').isHidden(), true);
  });

  step('no page errors', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
