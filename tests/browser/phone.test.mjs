// The phone's screen (WEB.md "The phone's screen"), in headless Chromium at
// 390 × 844 against a real broker: the conversation takes at least 60% of
// the height with the composer in sight; the session's name and state are
// one line, the rest behind "More"; a capability the session lacks is a
// muted detail, not an error; a long conversation opens at its newest turns
// and pages back (`before_seq`) as the person scrolls up; a pending request
// is pinned between the conversation and the composer. Screenshots at
// 390 × 844 and 1280 × 900 into target/test-artifacts/browser/.
//
//   LOOPX_BIN=target/debug/loopx node tests/browser/phone.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';

import { bindSession, brokerForThisProcess, eventually, launchPage, openChat, seriousAxeProblems, stepper } from './support.mjs';

const HEIGHT = 844;
const TURNS = 120;

const broker = brokerForThisProcess();
let browser;
let page;
let session;
const pageErrors = [];
const { step, shot } = stepper(() => page);

const turnsShown = () => page.locator('#transcript > li.turn');
const box = async (selector) => page.locator(selector).boundingBox();

/** A conversation of `TURNS` answered turns, made as a host makes them. */
async function longConversation() {
  for (let n = 1; n <= TURNS; n++) {
    const sid = session.session_id;
    const turn = await broker.ok('POST', `/v1/sessions/${sid}/messages`, { origin: 'web', text: `Question ${n}` });
    const claimId = `claim-${n}`;
    await broker.ok('POST', `/v1/sessions/${sid}/claims`, { ...session.host, claim_id: claimId });
    await broker.ok('POST', `/v1/sessions/${sid}/turns/${turn.turn_id}/complete`, {
      ...session.host,
      claim_id: claimId,
      completion_id: `done-${n}`,
      response: { message: `Answer ${n}: done, with **one** detail.` },
    });
  }
}

describe('the phone screen at 390 × 844', () => {
  before(async () => {
    await broker.start();
    session = await bindSession(broker, 'host-session-phone');
    await longConversation();
    ({ browser, page } = await launchPage(pageErrors));
    await page.setViewportSize({ width: 390, height: HEIGHT });
    await openChat(page, broker, session.session_id);
    await turnsShown().last().waitFor();
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('the conversation takes at least 60% of the height, the composer in sight', async () => {
    const transcript = await box('#transcript-scroll');
    const composer = await box('#composer-text');
    const send = await box('#send');
    assert.ok(transcript.height >= 0.6 * HEIGHT, `the conversation is ${transcript.height} px of ${HEIGHT}`);
    for (const [what, b] of [['message box', composer], ['Send', send]]) {
      assert.ok(b.y >= transcript.y + transcript.height && b.y + b.height <= HEIGHT, `${what} on screen: ${JSON.stringify(b)}`);
    }
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= innerWidth), 'no sideways scroll');
    assert.ok(await page.evaluate(() => document.documentElement.scrollHeight <= innerHeight), 'the page itself does not scroll');
    await shot('phone-390x844');
  });

  step('the header is one line: the name and the state; the rest behind "More"', async () => {
    const line = await box('.chat-line');
    const heading = await box('#chat-heading');
    const state = await box('#chat-state');
    assert.ok(line.height <= 48, `one line, ${line.height} px`);
    assert.ok(Math.abs(heading.y + heading.height / 2 - (state.y + state.height / 2)) < 12, 'name and state side by side');
    const agent = page.locator('#chat-state .agent-badge');
    assert.equal(await agent.isVisible(), true, "the agent's state is on the line");
    const badge = await agent.boundingBox();
    const more = await box('#session-menu');
    assert.ok(badge.x + badge.width <= more.x, `the agent's state is not cut off: ${JSON.stringify({ badge, more })}`);
    for (const hidden of ['#session-more', '#close-session', '#capabilities', '#live-status', '.delivery']) {
      assert.equal(await page.locator(hidden).first().isVisible(), false, `${hidden} waits behind More`);
    }
    const menu = page.getByRole('button', { name: 'More' });
    assert.equal(await menu.getAttribute('aria-expanded'), 'false');
    await menu.click();
    assert.equal(await page.locator('#session-menu').getAttribute('aria-expanded'), 'true');
    for (const shown of ['#close-session', '#capabilities', '#live-status', '.delivery']) {
      assert.equal(await page.locator(shown).first().isVisible(), true, `${shown} shown under More`);
    }
    await shot('phone-more-390x844');
    await page.getByRole('button', { name: 'Less' }).click();
    assert.equal(await page.locator('#session-more').isVisible(), false);
  });

  step('"live steering: unavailable" is a muted detail, not an error', async () => {
    const cap = page.locator('#capabilities .cap[data-capability="live_steering"]');
    assert.match(await cap.textContent(), /live steering: unavailable/);
    const [capColor, mutedColor, errorColor] = await page.evaluate(() => {
      const probe = (cls) => {
        const p = document.createElement('p');
        p.className = cls;
        document.body.append(p);
        const color = getComputedStyle(p).color;
        p.remove();
        return color;
      };
      const cap = document.querySelector('#capabilities .cap-off');
      return [getComputedStyle(cap).color, probe('muted'), probe('error')];
    });
    assert.equal(capColor, mutedColor);
    assert.notEqual(capColor, errorColor);
    assert.equal(await page.locator('#page-error').isVisible(), false);
  });

  step('opens at the newest turns and pages back as the person scrolls up', async () => {
    assert.equal(await turnsShown().count(), 50);
    assert.equal(await turnsShown().last().getAttribute('data-seq'), String(TURNS));
    const atBottom = await page.locator('#transcript-scroll').evaluate((s) => s.scrollHeight - s.scrollTop - s.clientHeight);
    assert.ok(atBottom < 2, `opens scrolled to the newest (${atBottom} px from the bottom)`);
    for (const expected of [100, TURNS]) {
      await page.locator('#transcript-scroll').evaluate((s) => s.scrollBy(0, -s.scrollHeight));
      await eventually(`${expected} turns`, async () => (await turnsShown().count()) === expected);
    }
    const seqs = await turnsShown().evaluateAll((lis) => lis.map((li) => Number(li.dataset.seq)));
    assert.deepEqual(seqs, Array.from({ length: TURNS }, (_, i) => i + 1), 'in order, each once');
    assert.equal(await page.locator('#load-older').isVisible(), false, 'nothing older is left');
    const scrolled = await page.locator('#transcript-scroll').evaluate((s) => s.scrollTop);
    assert.ok(scrolled > 0, 'what the person was reading stays in place, not jumped to the top');
  });

  step('a pending request is pinned between the conversation and the composer', async () => {
    const { status } = await broker.call('POST', `/v1/sessions/${session.session_id}/permission-requests`, {
      ...session.host,
      request_id: 'phone',
      tool_name: 'Bash',
      description: 'Run the tests',
      input_preview: 'cargo test',
    });
    assert.equal(status, 201);
    const card = page.locator('#pinned li.permission-card[data-request-id="phone"]');
    await card.waitFor();
    const pinned = await box('#needs-you');
    const transcript = await box('#transcript-scroll');
    const composer = await box('#composer-text');
    assert.ok(pinned.y >= transcript.y + transcript.height - 1, 'below the conversation');
    assert.ok(pinned.y + pinned.height <= composer.y + 1, 'above the composer');
    assert.ok(composer.y + composer.height <= HEIGHT, 'the composer still in sight');
    const allow = card.getByRole('button', { name: 'Allow' });
    const allowBox = await allow.boundingBox();
    assert.ok(allowBox.y >= 0 && allowBox.y + allowBox.height <= HEIGHT, 'Allow is one tap away');
    await shot('phone-asking-390x844');
    assert.deepEqual(await seriousAxeProblems(page), []);
    await allow.click();
    await eventually('the request answered', async () => (await page.locator('#needs-you').isVisible()) === false);
  });

  step('at 1280 × 900 everything is shown without "More"', async () => {
    await page.setViewportSize({ width: 1280, height: 900 });
    await eventually('the wide layout', async () => (await page.evaluate(() => innerWidth)) === 1280);
    assert.equal(await page.locator('#session-menu').isVisible(), false);
    assert.equal(await page.locator('#close-session').isVisible(), true);
    assert.equal(await page.locator('.delivery').isVisible(), true);
    await shot('phone-desktop-1280x900');
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('no error on the page', async () => {
    assert.deepEqual(pageErrors, []);
  });
});
