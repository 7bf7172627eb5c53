// The Web chat page for daily use with a coding agent, in headless Chromium
// against a real broker: Markdown answers (and hostile ones, inert), the copy
// button, a turn's progress, the unread count and notifications, keyboard and
// an axe-core accessibility check.
//
//   node tests/browser/answers.test.mjs
//
// Like chat.test.mjs it builds nothing (LOOPX_BIN, default target/debug/loopx)
// and uses Debian's Chromium. Screenshots go to target/test-artifacts/browser/
// (markdown-answer.png is the rendered Markdown answer).

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { createRequire } from 'node:module';
import { after, before, describe } from 'node:test';

import { chromium } from 'playwright-core';

import {
  ARTIFACTS,
  CHROMIUM,
  CHROMIUM_ARGS,
  bindSession,
  brokerForThisProcess,
  eventually,
  openChat,
  sleep,
  stepper,
} from './support.mjs';

const axeSource = createRequire(import.meta.url)('axe-core').source;

const MARKDOWN_ANSWER = [
  '## Plan for the fix',
  '',
  'The parser drops the **last** line; see [the issue](https://example.com/issues/7).',
  '',
  '- read the input',
  '- split it into `lines`',
  '- keep the tail',
  '',
  '| step | status |',
  '| --- | :---: |',
  '| parse | done |',
  '| test | to do |',
  '',
  '- [x] reproduced',
  '- [ ] fixed',
  '',
  '```rust',
  'fn tail(input: &str) -> Vec<&str> {',
  '    input',
  '        .lines() // keeps the last line, even without a newline at the end, which is the whole point of this very long comment',
  '        .collect()',
  '}',
  '```',
].join('\n');

const RUST_CODE = MARKDOWN_ANSWER.split('```rust\n')[1].split('```')[0];

/** Answers that try to run, load or restyle something; each must be inert. */
const HOSTILE_ANSWERS = [
  '<img src=x onerror="window.__pwned = \'img\'; alert(1)">',
  'Before <script>window.__pwned = "script"; alert(2)</script> after',
  '[a markdown link](javascript:window.__pwned=%22md-link%22;alert(3))',
  '<a href="javascript:window.__pwned=\'raw-link\';alert(4)">a raw link</a> and <a href="JaVaScRiPt:alert(5)">another</a>',
  '<style>body { display: none !important; } * { background: red !important; } #send { visibility: hidden; }</style>Styled?',
  '<div style="position:fixed;inset:0;background:red">cover</div><p id="send">not the button</p><p class="banner error">fake</p>',
  '<iframe src="x"></iframe><svg onload="alert(6)"><circle r="5"/></svg><form action="x"><button>go</button></form><dialog open>top</dialog><div popover id="pop">pop</div><button popovertarget="pop">open</button>',
  '![tracking pixel](x) <video src="x"></video> <object data="x"></object> <link rel="stylesheet" href="x"> <meta http-equiv="refresh" content="0;url=x">',
];

// Headless Chromium never hides a tab (a background page or a minimized
// window still reports "visible"), so the test drives visibility itself: the
// page reads document.visibilityState and listens for visibilitychange, as it
// would for a real hidden tab. Notifications are recorded instead of shown
// (headless Chromium shows none), with the permission "not asked yet".
function pageShims() {
  let hidden = false;
  Object.defineProperty(Document.prototype, 'visibilityState', {
    configurable: true,
    get: () => (hidden ? 'hidden' : 'visible'),
  });
  Object.defineProperty(Document.prototype, 'hidden', { configurable: true, get: () => hidden });
  window.__setHidden = (value) => {
    hidden = value;
    document.dispatchEvent(new Event('visibilitychange'));
  };
  window.__asked = 0;
  window.__notes = [];
  let permission = 'default';
  window.Notification = class {
    static get permission() {
      return permission;
    }
    static async requestPermission() {
      window.__asked += 1;
      permission = 'granted';
      return permission;
    }
    constructor(title, options = {}) {
      window.__notes.push({ title, body: options.body });
    }
    addEventListener() {}
    close() {}
  };
  window.__violations = [];
  document.addEventListener('securitypolicyviolation', (e) => window.__violations.push(e.violatedDirective));
}

const broker = brokerForThisProcess();
let browser;
let context;
let page;
let session;
const pageErrors = [];
const dialogs = [];
const requests = [];
let claims = 0;
const { step, shot } = stepper(() => page);

const turnWithText = (text) =>
  page.locator('#transcript > li', { has: page.locator('.bubble-user .bubble-text', { hasText: text }) });
const stateOf = (text) => turnWithText(text).first().getAttribute('data-state');

/** The test host claims the oldest queued turn; returns the claim id and turn. */
async function claimNext() {
  claims += 1;
  const claimId = `claim-answers-${claims}`;
  const claim = await broker.ok('POST', `/v1/sessions/${session.session_id}/claims`, {
    ...session.host,
    claim_id: claimId,
    wait_seconds: 5,
  });
  assert.equal(claim.claimed, true);
  return { claimId, turn: claim.turn };
}

async function complete({ claimId, turn }, message) {
  await broker.ok('POST', `/v1/sessions/${session.session_id}/turns/${turn.turn_id}/complete`, {
    ...session.host,
    claim_id: claimId,
    completion_id: `completion-${claimId}`,
    response: { message },
  });
}

/** A message from the page, answered by the test host with `answer`. */
async function askAndAnswer(question, answer) {
  await page.fill('#composer-text', question);
  await page.press('#composer-text', 'Enter');
  await turnWithText(question).waitFor();
  await complete(await claimNext(), answer);
  await eventually(`"${question}" answered`, async () => (await stateOf(question)) === 'completed');
  return turnWithText(question);
}

/** A message enqueued by another client and answered, while the page looks on. */
async function answeredElsewhere(question, answer) {
  await broker.ok('POST', `/v1/sessions/${session.session_id}/messages`, { origin: 'web', text: question });
  await complete(await claimNext(), answer);
}

describe('agent answers on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-answers');
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: broker.base });
    await context.addInitScript(pageShims);
    page = await context.newPage();
    page.setDefaultTimeout(15000);
    page.on('pageerror', (error) => pageErrors.push(error));
    page.on('dialog', (dialog) => {
      dialogs.push(dialog.message());
      dialog.dismiss().catch(() => {});
    });
    page.on('request', (request) => requests.push(request.url()));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await context?.close().catch(() => {});
    await browser?.close().catch(() => {});
    await broker.stop();
  });

  step('renders an answer with a heading, a list, a table, a Rust block and a link as such', async () => {
    const turn = await askAndAnswer('How would you fix the parser?', MARKDOWN_ANSWER);
    const answer = turn.locator('.response-message');
    assert.equal(await answer.locator('h2').innerText(), 'Plan for the fix');
    assert.equal(await answer.locator('strong').innerText(), 'last');
    assert.deepEqual(await answer.locator('ul').first().locator('li').allInnerTexts(), [
      'read the input',
      'split it into lines',
      'keep the tail',
    ]);
    assert.equal(await answer.locator('ul li code').innerText(), 'lines');
    assert.deepEqual(await answer.locator('table th').allInnerTexts(), ['step', 'status']);
    assert.deepEqual(await answer.locator('table tbody td').allInnerTexts(), ['parse', 'done', 'test', 'to do']);
    assert.equal(await answer.locator('table th').nth(1).getAttribute('align'), 'center');
    const boxes = answer.locator('input[type="checkbox"]');
    assert.equal(await boxes.count(), 2);
    assert.deepEqual(await boxes.evaluateAll((b) => b.map((x) => [x.checked, x.disabled])), [
      [true, true],
      [false, true],
    ]);

    const link = answer.locator('a', { hasText: 'the issue' });
    assert.equal(await link.getAttribute('href'), 'https://example.com/issues/7');
    assert.equal(await link.getAttribute('target'), '_blank');
    assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');

    const code = answer.locator('pre code.language-rust');
    assert.equal(await code.textContent(), RUST_CODE, 'the code keeps every space and line');
    assert.equal(await answer.locator('.code-lang').innerText(), 'rust');
    const layout = await answer.locator('.code-scroll').evaluate((box) => ({
      whiteSpace: getComputedStyle(box.querySelector('pre')).whiteSpace,
      overflowX: getComputedStyle(box).overflowX,
      scrolls: box.scrollWidth > box.clientWidth,
      inBubble: box.getBoundingClientRect().right <= box.closest('.bubble').getBoundingClientRect().right + 1,
      focusable: box.tabIndex === 0,
    }));
    assert.deepEqual(layout, { whiteSpace: 'pre', overflowX: 'auto', scrolls: true, inBubble: true, focusable: true });

    assert.match(await page.locator('#announcer').innerText(), /The agent answered message \d+: Plan for the fix The parser/);
    await turn.scrollIntoViewIfNeeded();
    await shot('markdown-answer');
  });

  step("a person's own message stays plain text", async () => {
    const text = '**not bold** and `not code` <b>nor this</b>';
    await page.fill('#composer-text', text);
    await page.press('#composer-text', 'Enter');
    const bubble = turnWithText('not bold').locator('.bubble-user .bubble-text');
    await bubble.waitFor();
    assert.equal(await bubble.textContent(), text);
    assert.equal(await bubble.locator('*').count(), 0);
    await complete(await claimNext(), 'Noted.');
    await eventually('answered', async () => (await stateOf('not bold')) === 'completed');
  });

  step('the copy button copies the code block exactly', async () => {
    const turn = turnWithText('How would you fix the parser?');
    await turn.locator('.code-copy').click();
    await eventually('the copy to be confirmed', async () => (await turn.locator('.code-status').innerText()) === 'Copied');
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), RUST_CODE);
    assert.equal(await turn.locator('.code-copy').getAttribute('aria-label'), 'Copy code (rust)');
  });

  step('hostile answers render inert: no dialog, no request, no script, nothing restyled', async () => {
    const sendStyle = await page.locator('#send').evaluate((b) => getComputedStyle(b).backgroundColor);
    const requestsBefore = requests.length;
    for (const [i, hostile] of HOSTILE_ANSWERS.entries()) await askAndAnswer(`Hostile ${i + 1}`, hostile);
    await sleep(500); // time for anything that would load or run
    // The links that were javascript: URLs, clicked as a person would.
    for (const n of [3, 4]) {
      const links = await turnWithText(`Hostile ${n}`).locator('.response-message a').all();
      assert.ok(links.length >= 1);
      for (const link of links) await link.click();
    }
    await sleep(300);

    assert.deepEqual(dialogs, [], 'no dialog opened');
    assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no script ran');
    assert.equal(context.pages().length, 1, 'no javascript: link opened a tab');
    const loaded = requests.slice(requestsBefore).filter((url) => !/\/v1\/sessions\//.test(new URL(url).pathname));
    assert.deepEqual(loaded, [], 'nothing but the API was requested');
    // Chromium checks the CSP while any parser, even an inert one (the
    // sanitizer's), reads an inline handler or style, and reports those; no
    // other directive may be reported: nothing tried to load or run.
    const violations = new Set(await page.evaluate(() => window.__violations));
    for (const directive of violations) {
      assert.ok(['script-src-attr', 'style-src-attr', 'style-src-elem'].includes(directive), `CSP: ${directive}`);
    }

    const answers = page.locator('#transcript .response-message');
    const found = await answers.evaluateAll((nodes) => {
      const all = nodes.flatMap((n) => [...n.querySelectorAll('*')]);
      return {
        tags: [...new Set(all.map((e) => e.tagName.toLowerCase()))].sort(),
        handlers: all.filter((e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
        styled: all
          .filter((e) => e.getAttribute('style') || e.hasAttribute('id') || e.hasAttribute('popover'))
          .map((e) => e.outerHTML),
        scriptLinks: all.filter((e) => e.tagName === 'A' && /^\s*javascript:/i.test(e.getAttribute('href') || '')).length,
      };
    });
    for (const tag of ['img', 'script', 'style', 'iframe', 'svg', 'form', 'dialog', 'video', 'object', 'link', 'meta']) {
      assert.ok(!found.tags.includes(tag), `<${tag}> was kept: ${found.tags}`);
    }
    assert.equal(found.handlers, 0);
    assert.deepEqual(found.styled, []);
    assert.equal(found.scriptLinks, 0);
    assert.equal(await page.evaluate(() => document.getElementById('send').tagName), 'BUTTON');
    assert.equal(await page.locator('#send').evaluate((b) => getComputedStyle(b).backgroundColor), sendStyle);
    assert.equal(await page.locator('#send').isVisible(), true);
    assert.equal(await page.evaluate(() => getComputedStyle(document.body).display), 'flex');
    assert.match(await turnWithText('Hostile 2').locator('.response-message').innerText(), /Before\s+after/);
    assert.match(await turnWithText('Hostile 8').locator('.response-message').innerText(), /Image: tracking pixel/);
    await shot('hostile-answers');
  });

  step('a turn shows queued, delivered with the elapsed time, then answered, for a claim held 2 s', async () => {
    await page.evaluate(() => {
      window.__states = [];
      new MutationObserver(() => {
        const li = [...document.querySelectorAll('#transcript > li')].find((n) =>
          n.querySelector('.bubble-user')?.textContent.includes('Hold it for two seconds'),
        );
        const state = li?.dataset.state;
        if (state && window.__states.at(-1) !== state) window.__states.push(state);
      }).observe(document.getElementById('transcript'), { childList: true, subtree: true });
    });
    const question = 'Hold it for two seconds';
    await page.fill('#composer-text', question);
    await page.press('#composer-text', 'Enter');
    const turn = turnWithText(question);
    await turn.waitFor();
    assert.equal(await turn.locator('.step-current').getAttribute('data-step'), 'queued');
    assert.match(await turn.locator('.state-words').innerText(), /waiting for the agent/);

    const heldSince = Date.now();
    const claim = await claimNext();
    await eventually('the turn to show as delivered', async () => (await stateOf(question)) === 'claimed');
    assert.equal(await turn.locator('.step-current').getAttribute('data-step'), 'claimed');
    assert.equal(await turn.locator('.step-current').getAttribute('aria-current'), 'step');
    assert.deepEqual(await turn.locator('.step-done').evaluateAll((n) => n.map((x) => x.dataset.step)), ['queued']);
    // The host holds the claim for 2 s; the page counts them.
    await eventually('2 s of work shown', async () =>
      /^Delivered to the agent; working on it for 2 s$/.test(await turn.locator('.state-words').innerText()),
    );
    assert.ok(Date.now() - heldSince >= 1900, 'the page did not count ahead of the clock');
    assert.equal(await stateOf(question), 'claimed');
    await shot('turn-delivered');
    await complete(claim, 'Done after two seconds.');
    await eventually('the answer', async () => (await stateOf(question)) === 'completed');
    assert.match(await turn.locator('.state-words').innerText(), /^answered in [2-9] s$/);
    assert.equal(await turn.locator('.turn-steps').count(), 0, 'a finished turn needs no progress bar');
    assert.deepEqual(await page.evaluate(() => window.__states), ['queued', 'claimed', 'completed']);
  });

  step('a released turn shows it went back to the queue', async () => {
    const question = 'Release this one';
    await page.fill('#composer-text', question);
    await page.press('#composer-text', 'Enter');
    await turnWithText(question).waitFor();
    const first = await claimNext();
    await eventually('delivered', async () => (await stateOf(question)) === 'claimed');
    await broker.ok('POST', `/v1/sessions/${session.session_id}/claims/${first.claimId}/release`, session.host);
    const turn = turnWithText(question);
    await eventually('back in the queue', async () => (await stateOf(question)) === 'queued');
    assert.match(await turn.locator('.state-words').innerText(), /^Released by the agent at .+: back in the queue, waiting for the agent$/);
    assert.equal(await turn.locator('.turn-state').getAttribute('data-released'), '1');
    assert.equal(await turn.locator('.step-current').getAttribute('data-step'), 'queued');
    assert.match(await page.locator('#announcer').innerText(), /released message \d+; it is back in the queue/);
    await page.reload();
    await turn.waitFor();
    assert.match(await turn.locator('.state-words').innerText(), /^Released by the agent at .+: back in the queue/, 'kept over a reload');
    await eventually('the stream again', async () => (await page.locator('#live-status').getAttribute('data-live')) === 'live');

    const second = await claimNext();
    assert.equal(second.turn.turn_id, first.turn.turn_id);
    await eventually('delivered again', async () => (await stateOf(question)) === 'claimed');
    assert.match(await turn.locator('.state-words').innerText(), /^Delivered to the agent again; working on it for/);
    await complete(second, 'Answered on the second try.');
    await eventually('answered', async () => (await stateOf(question)) === 'completed');
    assert.equal(
      await page.evaluate((id) => sessionStorage.getItem(`loopx.released.${id}`), session.session_id),
      null,
      'forgotten once answered',
    );
  });

  step('a hidden tab counts unread answers in its title and clears them when shown; notifications only after the button', async () => {
    const title = 'goal-browser · agent-web · LoopX chat';
    assert.equal(await page.title(), title);
    const button = page.getByRole('button', { name: 'Notify me of answers' });
    assert.equal(await button.isVisible(), true);
    assert.equal(await button.getAttribute('aria-pressed'), 'false');
    assert.equal(await page.evaluate(() => window.__asked), 0, 'nothing asked before the button');

    await page.evaluate(() => window.__setHidden(true));
    await answeredElsewhere('Unread one', 'First answer while away.');
    await eventually('one unread', async () => (await page.title()) === `(1) ${title}`);
    await answeredElsewhere('Unread two', 'Second answer while away.');
    await eventually('two unread', async () => (await page.title()) === `(2) ${title}`);
    assert.deepEqual(await page.evaluate(() => window.__notes), [], 'no notification without consent');
    await page.evaluate(() => window.__setHidden(false));
    assert.equal(await page.title(), title, 'cleared when the tab is shown');

    await button.click();
    assert.equal(await page.evaluate(() => window.__asked), 1, 'asked once, on the click');
    assert.equal(await page.locator('#notify-toggle').getAttribute('aria-pressed'), 'true');
    assert.equal(await page.locator('#notify-toggle').innerText(), 'Notifications: on');

    // A visible tab neither counts nor notifies.
    await answeredElsewhere('Seen at once', 'Answered while watching.');
    await eventually('answered', async () => (await stateOf('Seen at once')) === 'completed');
    assert.equal(await page.title(), title);

    await page.evaluate(() => window.__setHidden(true));
    await answeredElsewhere('Notify me', 'The **build** is green.');
    await eventually('the notification', async () => (await page.evaluate(() => window.__notes.length)) === 1);
    assert.deepEqual(await page.evaluate(() => window.__notes), [
      { title: 'Answer in goal-browser · agent-web', body: 'The build is green.' },
    ]);
    assert.equal(await page.title(), `(1) ${title}`);
    await page.evaluate(() => window.__setHidden(false));
    assert.equal(await page.title(), title);
  });

  step("counts a turn's working time on the broker's clock, not a computer clock 10 minutes ahead", async () => {
    await page.clock.setSystemTime(new Date(Date.now() + 10 * 60 * 1000));
    try {
      const question = 'Time me with a wrong clock';
      await page.fill('#composer-text', question); // sending reads the broker's Date header
      await page.press('#composer-text', 'Enter');
      await turnWithText(question).waitFor();
      const claim = await claimNext();
      await eventually('delivered', async () => (await stateOf(question)) === 'claimed');
      await sleep(1200);
      const words = await turnWithText(question).locator('.state-words').innerText();
      assert.match(words, /working on it for [0-3] s$/, words);
      await complete(claim, 'On time.');
      await eventually('answered', async () => (await stateOf(question)) === 'completed');
    } finally {
      await page.clock.setSystemTime(new Date());
    }
  });

  step('Esc leaves the composer for the transcript', async () => {
    await page.focus('#composer-text');
    await page.keyboard.press('Escape');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'transcript-scroll');
    assert.equal(await page.getByLabel('Message', { exact: true }).count(), 1);
  });

  step('at 375 px wide an answer with a wide table and long code scrolls inside its bubble, not the page', async () => {
    await page.setViewportSize({ width: 375, height: 812 });
    try {
      const turn = await askAndAnswer(
        'Narrow screen please',
        `| ${'column | '.repeat(12)}\n|${' --- |'.repeat(12)}\n| ${'a-long-cell-value | '.repeat(12)}\n\n${MARKDOWN_ANSWER}`,
      );
      await turn.locator('.code-block').scrollIntoViewIfNeeded();
      const layout = await page.evaluate(() => ({
        pageScrolls: document.documentElement.scrollWidth > document.documentElement.clientWidth,
        wide: [...document.querySelectorAll('body *')]
          .filter((e) => e.getClientRects().length && !e.closest('.code-scroll, .table-scroll'))
          .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
          .map((e) => `${e.tagName.toLowerCase()}.${e.className}`),
      }));
      assert.deepEqual(layout, { pageScrolls: false, wide: [] });
      for (const box of ['.table-scroll', '.code-scroll']) {
        assert.ok(
          await turn.locator(box).first().evaluate((b) => b.scrollWidth > b.clientWidth),
          `${box} scrolls sideways on its own`,
        );
      }
      await shot('markdown-answer-375');
    } finally {
      await page.setViewportSize({ width: 1280, height: 900 });
    }
  });

  step('axe-core finds no serious or critical accessibility violation, light and dark', async () => {
    const problems = [];
    for (const [where, url, colorScheme] of [
      ['the chat with Markdown answers', `${broker.base}/#/s/${session.session_id}`, 'light'],
      ['the session list', `${broker.base}/#`, 'light'],
      ['the chat with Markdown answers, dark', `${broker.base}/#/s/${session.session_id}`, 'dark'],
    ]) {
      await page.emulateMedia({ colorScheme });
      await page.goto(url);
      await page.locator('#session-list li').first().waitFor();
      if (url.includes('/s/')) await turnWithText('How would you fix the parser?').waitFor();
      await page.evaluate(axeSource); // evaluated by the driver, not an inline script: the CSP stays as it is
      const result = await page.evaluate(() =>
        window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] } }),
      );
      for (const v of result.violations.filter((x) => x.impact === 'serious' || x.impact === 'critical')) {
        problems.push(`${where}: ${v.id} (${v.impact}) ${v.help}: ${v.nodes.map((n) => n.target.join(' ')).slice(0, 5).join(', ')}`);
      }
      if (colorScheme === 'dark') {
        await turnWithText('How would you fix the parser?').scrollIntoViewIfNeeded();
        await shot('markdown-answer-dark');
      }
    }
    await page.emulateMedia({ colorScheme: 'light' });
    assert.deepEqual(problems, []);
  });

  step('threw nothing', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
