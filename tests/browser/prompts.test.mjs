// Every blocking prompt on the Web chat page (HOOKS.md "Every blocking
// prompt", WEB.md "The phone's screen"), in headless Chromium against a real
// broker, the requests made over HTTP as the host makes them: pending ones
// are pinned above the composer with "waiting for you"; a question answered
// by tapping options (single and multi-select) and typing its own words is
// allowed with exactly those answers; a plan is rendered Markdown (a hostile
// <img onerror> does not run) and approved with auto-accepted edits, another
// sent back with feedback; a tool's "always allow" choice is answered as its
// index; a request answered at the terminal turns "Answered at the terminal"
// live, and a late tap on one re-draws it from the broker's state; axe-core;
// screenshots at 390×844 and 1280×900.
//
//   LOOPX_BIN=target/debug/loopx node tests/browser/prompts.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, bindSession, brokerForThisProcess, eventually, launchPage, openChat, seriousAxeProblems, sleep, stepper } from './support.mjs';

const QUESTIONS = [
  {
    question: 'Which database should the service use?',
    header: 'Database',
    multi_select: false,
    options: [
      { label: 'PostgreSQL', description: 'One server, shared by every instance' },
      { label: 'SQLite', description: 'A file beside the binary' },
    ],
  },
  {
    question: 'Which checks should run before each commit?',
    header: 'Checks',
    multi_select: true,
    options: [
      { label: 'fmt', description: '' },
      { label: 'clippy', description: 'Lints as errors' },
      { label: 'tests', description: 'The whole suite' },
    ],
  },
  {
    question: 'Which branch should it go to?',
    header: 'Branch',
    multi_select: false,
    options: [
      { label: 'main', description: '' },
      { label: 'next', description: '' },
    ],
  },
];

const PLAN = [
  '# Move the store to PostgreSQL',
  '',
  '1. Add the **migrations**',
  '2. Port the queries',
  '',
  '- keep SQLite for tests',
  '',
  '<img src="x" onerror="window.__pwned = 1"> <script>window.__pwned = 2</script>',
].join('\n');

const SUGGESTIONS = [{ label: 'Always allow Bash(npm test) in this project' }, { label: 'Always allow Bash in this project' }];

const broker = brokerForThisProcess();
let browser;
let page;
let session;
const pageErrors = [];
const { step, shot } = stepper(() => page);

const card = (requestId) => page.locator(`li.permission-card[data-request-id="${requestId}"]`);
const pinnedIds = () => page.locator('#pinned > li.permission-card').evaluateAll((cards) => cards.map((c) => c.dataset.requestId));
const route = (requestId = '') => `/v1/sessions/${session.session_id}/permission-requests${requestId ? `/${requestId}` : ''}`;
const read = (requestId) => broker.ok('GET', route(requestId));

async function ask(requestId, fields) {
  const { status, data } = await broker.call('POST', route(), {
    ...session.host,
    request_id: requestId,
    tool_name: 'Bash',
    description: '',
    input_preview: '',
    ...fields,
  });
  assert.equal(status, 201, JSON.stringify(data));
}

async function settledAs(requestId, state) {
  await eventually(`${requestId} to be ${state} on the page`, async () => (await card(requestId).getAttribute('data-state')) === state);
  assert.equal(await card(requestId).locator('xpath=..').getAttribute('id'), 'transcript', 'a settled card stands in the transcript');
  assert.equal(await card(requestId).getByRole('button').count(), 0, 'a settled card has no buttons');
}

describe('every blocking prompt on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-prompts');
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('pending requests of every kind are pinned above the composer, with "waiting for you"', async () => {
    assert.equal(await page.locator('#needs-you').isVisible(), false, 'nothing pinned while nothing waits');
    assert.equal(await page.locator('#chat-asking').isVisible(), false);
    await ask('quest', { kind: 'question', tool_name: 'AskUserQuestion', questions: QUESTIONS });
    await ask('plana', { kind: 'plan', tool_name: 'ExitPlanMode', plan: PLAN });
    await ask('toolx', { kind: 'tool', description: 'Run the tests', input_preview: 'npm test', suggestions: SUGGESTIONS });
    await eventually('three pinned cards', async () => (await pinnedIds()).length === 3);
    assert.deepEqual(await pinnedIds(), ['quest', 'plana', 'toolx']);
    assert.equal(await page.locator('#transcript > li.permission-card').count(), 0, 'no pending card in the transcript');
    assert.equal(await page.locator('#needs-you').isVisible(), true);
    assert.match(await page.locator('#needs-you-heading').innerText(), /3 requests/);
    assert.equal(await page.locator('#chat-asking').isVisible(), true, '"waiting for you" shows');
    assert.match((await page.locator('#chat-asking').textContent()).trim(), /^waiting for you$/);
    // The region sits right above the message box.
    const [region, composer] = await Promise.all([page.locator('#needs-you').boundingBox(), page.locator('#composer').boundingBox()]);
    assert.ok(region.y + region.height <= composer.y + 1 && composer.y - (region.y + region.height) < 40, 'pinned right above the composer');
    await shot('prompts-pending-1280x900');
  });

  step('axe-core finds no serious or critical violation with every kind pending', async () => {
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('at 390×844 the pinned requests and the composer are both in sight, nothing scrolls sideways', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await eventually('the narrow layout', async () => (await page.evaluate(() => innerWidth)) === 390);
    const box = await page.locator('#composer-text').boundingBox();
    assert.ok(box && box.y >= 0 && box.y + box.height <= 844, `the message box is on screen (${JSON.stringify(box)})`);
    const region = await page.locator('#needs-you').boundingBox();
    assert.ok(region.y >= 0 && region.y < 844 && region.height >= 200, `the pinned requests are on screen (${JSON.stringify(region)})`);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= innerWidth), 'no sideways scroll');
    await card('quest').scrollIntoViewIfNeeded();
    await shot('prompts-phone-390x844');
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('a question: options tapped (single and multi-select) and own words, sent as exactly those answers', async () => {
    const q = card('quest');
    const send = q.getByRole('button', { name: 'Send answers' });
    assert.equal(await send.isDisabled(), true, 'nothing answered yet');
    assert.equal(await q.locator('fieldset.question').count(), 3);
    assert.equal(await q.locator('fieldset.question').first().locator('legend').textContent(), 'Database Which database should the service use?');
    assert.equal(await q.locator('.option-description', { hasText: 'A file beside the binary' }).isVisible(), true);

    const [db, checks, branch] = [0, 1, 2].map((i) => q.locator(`fieldset[data-question="${i}"]`));
    const option = (fieldset, label) => fieldset.locator('button.option', { has: page.locator('.option-label', { hasText: new RegExp(`^${label}$`) }) });
    // Single-select: the later tap replaces the earlier one.
    await option(db, 'SQLite').click();
    await option(db, 'PostgreSQL').click();
    assert.equal(await option(db, 'PostgreSQL').getAttribute('aria-pressed'), 'true');
    assert.equal(await option(db, 'SQLite').getAttribute('aria-pressed'), 'false');
    // Multi-select: each tap toggles.
    for (const label of ['tests', 'clippy', 'fmt', 'clippy']) await option(checks, label).click();
    assert.deepEqual(
      await checks.locator('button.option').evaluateAll((bs) => bs.map((b) => b.getAttribute('aria-pressed'))),
      ['true', 'false', 'true'],
    );
    assert.equal(await send.isDisabled(), true, 'the third question is still open');
    // Own words win over a tapped option.
    await option(branch, 'next').click();
    await branch.getByLabel(/Other/).fill('release/1.2');
    assert.equal(await send.isDisabled(), false);
    await send.click();

    await settledAs('quest', 'allowed');
    const request = await read('quest');
    assert.equal(request.state, 'allowed');
    assert.equal(request.answered_via, 'owner');
    assert.deepEqual(request.answer, {
      answers: {
        'Which database should the service use?': 'PostgreSQL',
        'Which checks should run before each commit?': 'fmt, tests',
        'Which branch should it go to?': 'release/1.2',
      },
    });
    const shown = await card('quest').locator('.permission-what dd').allTextContents();
    assert.deepEqual(shown, ['PostgreSQL', 'fmt, tests', 'release/1.2'], 'the settled card says what was answered');
    assert.deepEqual(await pinnedIds(), ['plana', 'toolx']);
  });

  step('a plan is rendered Markdown, never raw HTML, and approved with auto-accepted edits', async () => {
    const body = card('plana').locator('.plan-body');
    assert.equal(await body.locator('h1').innerText(), 'Move the store to PostgreSQL');
    assert.deepEqual(await body.locator('ol > li').allInnerTexts(), ['Add the migrations', 'Port the queries']);
    assert.equal(await body.locator('ol strong').innerText(), 'migrations');
    assert.equal(await body.locator('ul > li').innerText(), 'keep SQLite for tests');
    assert.equal(await card('plana').locator('img, script').count(), 0, 'no raw HTML from the plan');
    await sleep(200);
    assert.equal(await page.evaluate(() => window.__pwned), undefined, 'nothing in the plan ran');

    await card('plana').getByRole('button', { name: 'Approve, auto-accept edits' }).click();
    await settledAs('plana', 'allowed');
    const request = await read('plana');
    assert.equal(request.state, 'allowed');
    assert.deepEqual(request.answer, { mode: 'accept_edits' });
    assert.match(await card('plana').locator('.permission-what').innerText(), /accepted automatically/);
  });

  step('a tool\'s "always allow" choice is answered as its index, and the pinned region empties', async () => {
    const t = card('toolx');
    assert.equal(await t.getByRole('button', { name: 'Allow', exact: true }).count(), 1);
    assert.equal(await t.getByRole('button', { name: 'Deny', exact: true }).count(), 1);
    assert.equal(await t.getByRole('button', { name: SUGGESTIONS[1].label }).count(), 1);
    await t.getByRole('button', { name: SUGGESTIONS[0].label }).click();
    await settledAs('toolx', 'allowed');
    const request = await read('toolx');
    assert.equal(request.state, 'allowed');
    assert.deepEqual(request.answer, { suggestion: 0 });
    assert.match(await card('toolx').locator('.permission-what').innerText(), /Chosen: Always allow Bash\(npm test\) in this project/);
    assert.deepEqual(await pinnedIds(), []);
    await eventually('the pinned region to hide', async () => !(await page.locator('#needs-you').isVisible()));
    assert.equal(await page.locator('#chat-asking').isVisible(), false, 'no longer waiting for you');
  });

  step('another plan is sent back with feedback', async () => {
    await ask('planb', { kind: 'plan', tool_name: 'ExitPlanMode', plan: '## Rewrite it all\n\n- in one go' });
    await card('planb').waitFor();
    assert.equal(await page.locator('#chat-asking').isVisible(), true);
    await card('planb').getByRole('button', { name: 'Keep planning…' }).click();
    const box = card('planb').getByLabel('What should the agent change in its plan?');
    await box.waitFor();
    assert.equal(await box.evaluate((node) => node === document.activeElement), true, 'the feedback box takes the focus');
    await box.fill('Split it into three steps, tests first.');
    await card('planb').getByRole('button', { name: 'Send back to planning' }).click();
    await settledAs('planb', 'denied');
    const request = await read('planb');
    assert.equal(request.state, 'denied');
    assert.deepEqual(request.answer, { message: 'Split it into three steps, tests first.' });
    assert.match(await card('planb').locator('.permission-what').innerText(), /Sent back to planning: .?Split it into three steps, tests first\..?$/);
  });

  step('a request answered at the terminal turns "Answered at the terminal" live, not as an error', async () => {
    await ask('termq', { kind: 'question', tool_name: 'AskUserQuestion', questions: QUESTIONS.slice(0, 1) });
    await card('termq').waitFor();
    await card('termq').getByRole('button', { name: /SQLite/ }).click(); // a draft, then the terminal answers first
    await broker.ok('POST', `${route('termq')}/withdraw`, { ...session.host, answered_at_terminal: true });
    await settledAs('termq', 'expired');
    assert.equal(await card('termq').getAttribute('data-answered-via'), 'terminal');
    assert.match(await card('termq').locator('.permission-outcome').innerText(), /^Answered at the terminal/);
    assert.equal(await card('termq').locator('.error, [role="alert"], .badge-expired').count(), 0, 'not an error look');
    assert.deepEqual(await pinnedIds(), []);
    assert.equal(await page.locator('#chat-asking').isVisible(), false);
  });

  step('a late tap (409) re-draws the card from the broker\'s state', async () => {
    await ask('latex', { kind: 'tool', description: 'Remove build', input_preview: 'rm -rf build' });
    await card('latex').waitFor();
    // The page misses the news (its re-read fails), so it still offers the buttons.
    let blocked = true;
    await page.route(`**${route('latex')}`, (r) => (blocked && r.request().method() === 'GET' ? r.abort() : r.continue()));
    await broker.ok('POST', `${route('latex')}/withdraw`, { ...session.host, answered_at_terminal: true });
    await sleep(500);
    assert.equal(await card('latex').getAttribute('data-state'), 'pending', 'the page has not heard yet');
    blocked = false;
    await card('latex').getByRole('button', { name: 'Allow', exact: true }).click();
    await settledAs('latex', 'expired');
    assert.equal(await card('latex').getAttribute('data-answered-via'), 'terminal');
    assert.match(await card('latex').locator('.note').innerText(), /answered at the terminal first/);
    const request = await read('latex');
    assert.equal(request.state, 'expired');
    assert.equal(request.answer, null, 'the late tap changed nothing');
    await page.unroute(`**${route('latex')}`);
  });

  step('axe-core finds no serious or critical violation with the settled cards', async () => {
    assert.deepEqual(await seriousAxeProblems(page), []);
    await page.setViewportSize({ width: 1280, height: 900 });
    await shot('prompts-settled-1280x900');
  });

  step('threw nothing, ran nothing', async () => {
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
    assert.deepEqual(pageErrors.map(String), []);
  });
});
