// The Web chat page (GET /) in headless Chromium, against a real broker.
//
//   node tests/browser/chat.test.mjs
//
// Builds nothing: the broker binary comes from LOOPX_BIN (default
// target/debug/loopx). Chromium is Debian's (/usr/bin/chromium, or
// CHROMIUM_PATH), driven by playwright-core; no browser is downloaded.
// Screenshots go to target/test-artifacts/browser/. The broker and the
// browser are always stopped, whatever fails.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe } from 'node:test';

import { chromium } from 'playwright-core';

import {
  ARTIFACTS,
  CHROMIUM,
  CHROMIUM_ARGS,
  allTurns,
  bindSession,
  brokerForThisProcess,
  eventually,
  sleep,
  stepper,
} from './support.mjs';

// --- the run ---

const broker = brokerForThisProcess();

let browser;
let context;
let page;
const requests = []; // every request the page made
const pageErrors = []; // uncaught exceptions in the page
const sentBodies = []; // bodies of POST .../messages, in order

const { step, shot } = stepper(() => page);

const turnsIn = () => page.locator('#transcript > li');
const turnWithText = (text) => page.locator('#transcript > li', { has: page.locator('.bubble-user .bubble-text', { hasText: text }) });

async function stateOf(text) {
  return turnWithText(text).first().getAttribute('data-state');
}

async function noHorizontalScroll() {
  return page.evaluate(() => {
    const doc = document.documentElement;
    const wide = [...document.querySelectorAll('body *')]
      .filter((e) => e.getClientRects().length && e.getBoundingClientRect().right > window.innerWidth + 1)
      .map((e) => `${e.tagName.toLowerCase()}#${e.id}.${e.className}`);
    return { scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, bodyScroll: document.body.scrollWidth, wide };
  });
}

let streamAvailable = false;
let sessionA;
let sessionB;
let sessionC;
let sessionD;

describe('the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    for (const file of await fs.readdir(ARTIFACTS)) {
      if (file.endsWith('.png')) await fs.rm(path.join(ARTIFACTS, file)); // no stale pictures
    }
    await broker.start();
    sessionA = await bindSession(broker, 'host-session-a');
    // Is the session event stream there yet? (200 text/event-stream)
    const probe = new AbortController();
    try {
      const response = await fetch(`${broker.base}/v1/sessions/${sessionA.session_id}/events`, {
        headers: { Authorization: `Bearer ${broker.token}`, Accept: 'text/event-stream' },
        signal: probe.signal,
      });
      streamAvailable =
        response.status === 200 && (response.headers.get('content-type') || '').startsWith('text/event-stream');
    } finally {
      probe.abort();
    }
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
    context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
    page = await context.newPage();
    page.setDefaultTimeout(15000);
    page.on('pageerror', (error) => pageErrors.push(error));
    page.on('request', (request) => {
      requests.push({ url: request.url(), method: request.method(), headers: request.headers() });
      if (request.method() === 'POST' && request.url().endsWith('/messages')) {
        sentBodies.push(JSON.parse(request.postData() || 'null'));
      }
    });
  });

  after(async () => {
    await context?.close().catch(() => {});
    await browser?.close().catch(() => {});
    await broker.stop();
  });

  step('asks for the token, explains a refused one in words, then lists sessions', async () => {
    await page.goto(`${broker.base}/`);
    await page.locator('#token-input').waitFor();
    assert.equal(await page.locator('#app-view').isVisible(), false);
    assert.equal(await page.getByLabel('Owner token').count(), 1, 'the token input has a label');

    await page.fill('#token-input', 'not-the-token');
    await page.press('#token-input', 'Enter');
    const error = page.locator('#token-error');
    await error.waitFor();
    assert.match(await error.innerText(), /did not accept the token: A valid owner token is required/);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('loopx.owner-token')), null);

    await page.fill('#token-input', broker.token);
    await page.click('#token-submit');
    const link = page.locator(`a.session-link[data-session-id="${sessionA.session_id}"]`);
    await link.waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('loopx.owner-token')), broker.token);
    const listed = await link.innerText();
    assert.match(listed, /goal-browser/);
    assert.match(listed, /live steering: unavailable/);
    assert.match(listed, /open/i);
    assert.ok(!listed.includes('host-session-a'), 'the host session id is never shown');
    // Its host surface and presence; no message and no agent yet: shown as empty.
    assert.match(listed, /codex-cli/);
    assert.match(listed, /agent away/i);
    await link.locator('.badge-empty').waitFor();
    assert.match(await link.innerText(), /empty/i);
  });

  step('opens a session, shows its capabilities, and sends with Enter (Shift+Enter is a newline)', async (t) => {
    await page.click(`a.session-link[data-session-id="${sessionA.session_id}"]`);
    await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
    assert.match(await page.locator('#capabilities').innerText(), /live steering: unavailable/);
    assert.match(await page.locator('#session-facts').textContent(), /session queue: available/);
    assert.match(await page.locator('#session-facts').textContent(), new RegExp(sessionA.session_id));
    assert.equal(await page.getByLabel('Message', { exact: true }).count(), 1, 'the composer has a label');
    assert.ok(page.url().endsWith(`#/s/${sessionA.session_id}`));
    t.diagnostic(`the broker's event stream answers 200 text/event-stream: ${streamAvailable}`);
    assert.ok(streamAvailable, 'GET /v1/sessions/{id}/events answers 200 text/event-stream');
    await eventually('the event stream to be connected', async () =>
      (await page.locator('#live-status').getAttribute('data-live')) === 'live',
    );
    assert.match(await page.locator('#live-status').innerText(), /Live updates: connected/);

    await page.focus('#composer-text');
    await page.keyboard.type('Hello from the browser');
    await page.keyboard.press('Shift+Enter');
    await page.keyboard.type('second line');
    assert.equal(await page.inputValue('#composer-text'), 'Hello from the browser\nsecond line');
    assert.equal((await allTurns(broker, sessionA.session_id)).length, 0, 'Shift+Enter sent nothing');
    await page.keyboard.press('Enter');

    const turn = turnWithText('Hello from the browser');
    await turn.waitFor();
    assert.equal(await page.inputValue('#composer-text'), '', 'the composer is cleared after sending');
    assert.equal(await turn.getAttribute('data-state'), 'queued');
    const turns = await allTurns(broker, sessionA.session_id);
    assert.equal(turns.length, 1);
    assert.equal(turns[0].text, 'Hello from the browser\nsecond line');
    assert.equal(turns[0].origin, 'web');
    assert.match(sentBodies[0].client_message_id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.deepEqual(Object.keys(sentBodies[0]).sort(), ['client_message_id', 'origin', 'text']);
  });

  step('shows the claim and the answer live, without a reload', async () => {
    await page.evaluate(() => {
      window.__noReload = true;
    });
    const claim = await broker.ok('POST', `/v1/sessions/${sessionA.session_id}/claims`, {
      ...sessionA.host,
      claim_id: 'claim-browser-1',
      wait_seconds: 5,
    });
    assert.equal(claim.claimed, true);
    assert.equal(claim.turn.text, 'Hello from the browser\nsecond line');
    await eventually('the turn to show as claimed', async () => (await stateOf('Hello from the browser')) === 'claimed');

    await broker.ok('POST', `/v1/sessions/${sessionA.session_id}/turns/${claim.turn.turn_id}/complete`, {
      ...sessionA.host,
      claim_id: 'claim-browser-1',
      completion_id: 'completion-browser-1',
      response: { message: 'Hello back from the host agent.', model: 'test-double' },
    });
    await eventually('the turn to show as completed', async () => (await stateOf('Hello from the browser')) === 'completed');
    const turn = turnWithText('Hello from the browser');
    assert.equal(await turn.locator('.response-message').innerText(), 'Hello back from the host agent.');
    assert.match(await page.locator('#announcer').innerText(), /The agent answered message 1: Hello back from the host agent\./);
    assert.equal(await page.evaluate(() => window.__noReload), true, 'the page did not reload');
    assert.equal(await page.locator('#announcer').getAttribute('aria-live'), 'polite');
    await shot('chat-desktop');
  });

  step('shows a message enqueued elsewhere, live', async () => {
    await broker.ok('POST', `/v1/sessions/${sessionA.session_id}/messages`, { origin: 'web', text: 'Sent from the CLI' });
    await turnWithText('Sent from the CLI').waitFor({ timeout: 20000 });
    assert.equal(await page.evaluate(() => window.__noReload), true, 'the page did not reload');
  });

  step('reloads and shows the transcript again, without asking for the token', async () => {
    await page.reload();
    const turn = turnWithText('Hello from the browser');
    await turn.waitFor();
    assert.equal(await page.locator('#token-view').isVisible(), false);
    assert.equal(await turn.getAttribute('data-state'), 'completed');
    assert.equal(await turn.locator('.response-message').innerText(), 'Hello back from the host agent.');
    await turnWithText('Sent from the CLI').waitFor();
    assert.equal(await turnsIn().count(), 2);
  });

  step('a double click on Send makes one turn', async () => {
    await page.fill('#composer-text', 'Only once, please');
    await page.dblclick('#send');
    // And two clicks from script, in the same task, for good measure.
    await page.evaluate(() => {
      const send = document.getElementById('send');
      send.click();
      send.click();
    });
    await turnWithText('Only once, please').waitFor();
    await sleep(500);
    const made = (await allTurns(broker, sessionA.session_id)).filter((t) => t.text === 'Only once, please');
    assert.equal(made.length, 1, 'exactly one turn from a double click');
    assert.equal(await turnWithText('Only once, please').count(), 1);
    assert.equal(await page.isDisabled('#send'), false, 'Send is enabled again after sending');
  });

  step('a retry after a lost answer reuses the message id and makes one turn', async () => {
    // The first POST reaches the broker and commits, but its answer is lost.
    let firstStatus = null;
    await page.route(
      '**/v1/sessions/*/messages',
      async (route) => {
        const response = await route.fetch();
        firstStatus = response.status();
        await route.abort('connectionreset');
      },
      { times: 1 },
    );
    const before = sentBodies.length;
    await page.fill('#composer-text', 'Retry me safely');
    await page.press('#composer-text', 'Enter');
    const error = page.locator('#send-error');
    await error.waitFor();
    assert.match(await error.innerText(), /Not sent yet: Could not reach the broker.*Press Send to try again/);
    assert.equal(firstStatus, 201, 'the lost attempt was committed by the broker');
    assert.equal(await page.inputValue('#composer-text'), 'Retry me safely', 'the text is kept for the retry');

    await page.click('#send');
    await turnWithText('Retry me safely').waitFor();
    // The stream may have shown the turn before the retry's answer came back.
    await eventually('the retry to be answered', async () =>
      /already been sent; it was not sent twice/.test(await page.locator('#announcer').innerText()),
    );
    assert.equal(await error.isVisible(), false);
    const bodies = sentBodies.slice(before);
    assert.equal(bodies.length, 2);
    assert.equal(bodies[0].client_message_id, bodies[1].client_message_id, 'the retry reused the id');
    const made = (await allTurns(broker, sessionA.session_id)).filter((t) => t.text === 'Retry me safely');
    assert.equal(made.length, 1, 'exactly one turn after a retry');
    assert.equal(await turnWithText('Retry me safely').count(), 1);

    // A new message gets a new id.
    await page.fill('#composer-text', 'A different message');
    await page.press('#composer-text', 'Enter');
    await turnWithText('A different message').waitFor();
    assert.notEqual(sentBodies.at(-1).client_message_id, bodies[0].client_message_id);
  });

  step('shows the newest 50 turns first and pages back with "load older"', async () => {
    sessionB = await bindSession(broker, 'host-session-b');
    for (let n = 1; n <= 60; n++) {
      await broker.ok('POST', `/v1/sessions/${sessionB.session_id}/messages`, { origin: 'web', text: `Message ${n}` });
    }
    await page.goto(`${broker.base}/#/s/${sessionB.session_id}`);
    await turnWithText('Message 60').waitFor();
    assert.equal(await turnsIn().count(), 50);
    assert.equal(await turnsIn().first().getAttribute('data-seq'), '11');
    assert.equal(await turnsIn().last().getAttribute('data-seq'), '60');
    const older = page.locator('#load-older');
    assert.equal(await older.isVisible(), true);
    await older.click();
    await eventually('60 turns', async () => (await turnsIn().count()) === 60);
    assert.equal(await turnsIn().first().getAttribute('data-seq'), '1');
    assert.equal(await older.isVisible(), false, 'nothing older is left');
    const seqs = await turnsIn().evaluateAll((lis) => lis.map((li) => Number(li.dataset.seq)));
    assert.deepEqual(seqs, Array.from({ length: 60 }, (_, i) => i + 1), 'in order, each once');
  });

  step('a closed session is read-only, with a note, and its queued turns show as cancelled', async () => {
    sessionC = await bindSession(broker, 'host-session-c');
    await broker.ok('POST', `/v1/sessions/${sessionC.session_id}/messages`, { origin: 'web', text: 'Too late' });
    await broker.ok('POST', `/v1/sessions/${sessionC.session_id}/close`, {});
    await page.goto(`${broker.base}/#/s/${sessionC.session_id}`);
    await turnWithText('Too late').waitFor();
    await page.locator('#closed-note').waitFor();
    assert.match(await page.locator('#closed-note').innerText(), /closed, so it is read-only/);
    assert.equal(await page.isDisabled('#composer-text'), true);
    assert.equal(await page.isDisabled('#send'), true);
    assert.equal(await stateOf('Too late'), 'cancelled');
    assert.match(await turnWithText('Too late').innerText(), /session was closed/);
    assert.match(await page.locator('#chat-state').innerText(), /closed.*read-only/is);
    const link = page.locator(`a.session-link[data-session-id="${sessionC.session_id}"]`);
    assert.match(await link.innerText(), /closed/i);
    await shot('closed-session');
  });

  step('a session closed while open turns read-only without a reload', async () => {
    sessionD = await bindSession(broker, 'host-session-d');
    await page.goto(`${broker.base}/#/s/${sessionD.session_id}`);
    await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
    await page.fill('#composer-text', 'Will be cancelled');
    await page.press('#composer-text', 'Enter');
    await turnWithText('Will be cancelled').waitFor();
    await page.evaluate(() => {
      window.__noReload = true;
    });
    await broker.ok('POST', `/v1/sessions/${sessionD.session_id}/close`, {});
    await page.locator('#closed-note').waitFor({ timeout: 20000 });
    assert.equal(await page.isDisabled('#send'), true);
    await eventually('the queued turn to show as cancelled', async () => (await stateOf('Will be cancelled')) === 'cancelled');
    assert.equal(await page.evaluate(() => window.__noReload), true, 'the page did not reload');
  });

  step('follows the stream across a broker restart, resuming with Last-Event-ID', async () => {
    await page.goto(`${broker.base}/#/s/${sessionA.session_id}`);
    await turnWithText('Sent from the CLI').waitFor();
    await eventually('the stream to be live', async () =>
      (await page.locator('#live-status').getAttribute('data-live')) === 'live',
    );
    // One event seen on this stream, so the page has an event id to resume from.
    await broker.ok('POST', `/v1/sessions/${sessionA.session_id}/messages`, { origin: 'web', text: 'Before the restart' });
    await turnWithText('Before the restart').waitFor();
    await page.evaluate(() => {
      window.__noReload = true;
    });
    const streamsBefore = requests.filter((r) => r.url.endsWith('/events')).length;
    await broker.restart();
    // While the page is reconnecting, the host answers the oldest queued turn.
    const claim = await broker.ok('POST', `/v1/sessions/${sessionA.session_id}/claims`, {
      ...sessionA.host,
      claim_id: 'claim-browser-2',
      wait_seconds: 5,
    });
    assert.equal(claim.turn.text, 'Sent from the CLI');
    await broker.ok('POST', `/v1/sessions/${sessionA.session_id}/turns/${claim.turn.turn_id}/complete`, {
      ...sessionA.host,
      claim_id: 'claim-browser-2',
      completion_id: 'completion-browser-2',
      response: { message: 'Answered after a restart.' },
    });
    await eventually('the answer after the restart', async () => (await stateOf('Sent from the CLI')) === 'completed', {
      timeout: 30000,
    });
    assert.equal(
      await turnWithText('Sent from the CLI').locator('.response-message').innerText(),
      'Answered after a restart.',
    );
    await eventually('the stream to be live again', async () =>
      (await page.locator('#live-status').getAttribute('data-live')) === 'live',
    );
    const resumed = requests.slice(0).filter((r) => r.url.endsWith('/events')).slice(streamsBefore);
    assert.ok(resumed.length >= 1, 'the page reconnected');
    assert.ok(
      resumed.some((r) => /^[0-9]+$/.test(r.headers['last-event-id'] || '')),
      `a reconnect sent Last-Event-ID: ${JSON.stringify(resumed.map((r) => r.headers['last-event-id']))}`,
    );
    assert.equal(await page.evaluate(() => window.__noReload), true, 'the page did not reload');
  });

  step('falls back to re-reading the transcript when the stream is unavailable', async () => {
    const sessionE = await bindSession(broker, 'host-session-e');
    await page.route('**/v1/sessions/*/events', (route) =>
      route.fulfill({
        status: 404,
        contentType: 'application/json',
        body: JSON.stringify({ error: { code: 'not_found', message: 'There is no such route.' } }),
      }),
    );
    try {
      await page.goto(`${broker.base}/#/s/${sessionE.session_id}`);
      await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
      await eventually('the page to say the stream is unavailable', async () =>
        (await page.locator('#live-status').getAttribute('data-live')) === 'unavailable',
      );
      assert.match(await page.locator('#live-status').innerText(), /unavailable \(There is no such route\)/);
      await page.fill('#composer-text', 'Polling works too');
      await page.press('#composer-text', 'Enter');
      await turnWithText('Polling works too').waitFor();
      const claim = await broker.ok('POST', `/v1/sessions/${sessionE.session_id}/claims`, {
        ...sessionE.host,
        claim_id: 'claim-browser-e',
        wait_seconds: 5,
      });
      await broker.ok('POST', `/v1/sessions/${sessionE.session_id}/turns/${claim.turn.turn_id}/complete`, {
        ...sessionE.host,
        claim_id: 'claim-browser-e',
        completion_id: 'completion-browser-e',
        response: { message: 'Seen by re-reading.' },
      });
      await eventually('the answer by polling', async () => (await stateOf('Polling works too')) === 'completed');
      assert.equal(await turnWithText('Polling works too').locator('.response-message').innerText(), 'Seen by re-reading.');
    } finally {
      await page.unroute('**/v1/sessions/*/events');
    }
  });

  step('keyboard focus is visible', async () => {
    await page.goto(`${broker.base}/#/s/${sessionA.session_id}`);
    await turnWithText('Hello from the browser').waitFor();
    await page.focus('#composer-text');
    await page.keyboard.press('Tab');
    const focused = await page.evaluate(() => {
      const e = document.activeElement;
      const style = getComputedStyle(e);
      return { id: e.id, visible: e.matches(':focus-visible'), outline: style.outlineStyle, width: style.outlineWidth };
    });
    assert.equal(focused.id, 'send');
    assert.ok(focused.visible && focused.outline !== 'none' && focused.width !== '0px', JSON.stringify(focused));
  });

  step('is readable at 375px wide, with no horizontal scroll', async () => {
    await page.setViewportSize({ width: 375, height: 812 });
    await page.goto(`${broker.base}/#`);
    await page.locator(`a.session-link[data-session-id="${sessionA.session_id}"]`).waitFor();
    let layout = await noHorizontalScroll();
    assert.ok(layout.scrollWidth <= layout.clientWidth && layout.bodyScroll <= 375, JSON.stringify(layout));
    assert.deepEqual(layout.wide, [], 'no element reaches past the right edge');
    assert.equal(await page.locator('#chat-pane').isVisible(), false, 'one pane at a time');
    const listed = await page.locator('a.session-link').count();
    assert.ok(listed >= 5);
    assert.equal(await page.locator('#sessions-note').innerText(), `${listed} sessions, open first, newest first.`);
    await shot('list-375');

    await page.click(`a.session-link[data-session-id="${sessionA.session_id}"]`);
    await turnWithText('Hello from the browser').waitFor();
    await page.fill('#composer-text', 'A long unbroken word: ' + 'x'.repeat(300));
    layout = await noHorizontalScroll();
    assert.ok(layout.scrollWidth <= layout.clientWidth && layout.bodyScroll <= 375, JSON.stringify(layout));
    assert.deepEqual(layout.wide, [], 'no element reaches past the right edge');
    assert.equal(await page.locator('#sessions-pane').isVisible(), false, 'one pane at a time');
    assert.equal(await page.locator('#send').isVisible(), true);
    assert.equal(await page.locator('#back').isVisible(), true);
    await page.fill('#composer-text', '');
    await shot('chat-375');
    await page.click('#back');
    await page.locator('#sessions-pane').waitFor();
    await page.setViewportSize({ width: 1280, height: 860 });
  });

  step('a token refused mid-session is forgotten and asked for again, in words', async () => {
    await page.evaluate(() => sessionStorage.setItem('loopx.owner-token', 'revoked-token'));
    const error = page.locator('#token-error');
    // Any request the page makes now is refused: the list's refresh, or one
    // still on its way from the step before, which may hide the refresh
    // button first (then the click has nothing to click, and need not).
    await Promise.race([page.click('#refresh-sessions', { timeout: 5000 }).catch(() => {}), error.waitFor()]);
    await error.waitFor();
    assert.match(await error.innerText(), /A valid owner token is required/);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('loopx.owner-token')), null);
    assert.equal(await page.locator('#app-view').isVisible(), false);
    await page.fill('#token-input', broker.token);
    await page.press('#token-input', 'Enter');
    await page.locator(`a.session-link[data-session-id="${sessionA.session_id}"]`).waitFor();
  });

  step('never puts the token in a URL, always sends it as a Bearer header, and throws nothing', async () => {
    assert.ok(requests.length > 0);
    for (const request of requests) {
      assert.ok(!request.url.includes(broker.token), `token in a URL: ${request.url}`);
      if (new URL(request.url).pathname.startsWith('/v1/')) {
        assert.match(request.headers.authorization || '', /^Bearer \S+$/, `${request.method} ${request.url}`);
      }
    }
    const streams = requests.filter((r) => r.url.endsWith('/events'));
    assert.ok(streams.length > 0, 'the page asked for the event stream');
    assert.ok(streams.every((r) => r.headers.accept === 'text/event-stream'));
    assert.deepEqual(pageErrors.map(String), []);
  });
});
