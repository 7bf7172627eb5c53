// What the agent is doing now (issue 37), on the Web chat page in headless
// Chromium against a real broker: a host that reports `working` with a tool
// (as `loopx hook pre-tool-use` does) gets the tool's name on the agent
// badge, live and after a reload; another tool within 2 s of the last change
// is not written (the broker's throttle); an empty tool reported 2 s later
// (PostToolUse) takes it off.
//
//   node tests/browser/tool.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, bindSession, brokerForThisProcess, eventually, launchPage, openChat, sleep, stepper } from './support.mjs';

/** The broker's least time between two writes of a session's tool (TOOL_EVERY_MS). */
const TOOL_EVERY_MS = 2000;

const broker = brokerForThisProcess();
let browser;
let page;
let session;
let bashAt;
const pageErrors = [];
const { step, shot } = stepper(() => page);

const badge = () => page.locator('#chat-state .agent-badge');
const report = (body) => broker.ok('POST', `/v1/sessions/${session.session_id}/agent-state`, { ...session.host, ...body });
const agent = async () => (await broker.ok('GET', `/v1/sessions/${session.session_id}`)).agent;

describe('the tool the agent runs, on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-tool');
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('working with a tool shows its name on the badge, live', async () => {
    assert.equal(await badge().getAttribute('data-tool'), null);
    bashAt = Date.now();
    await report({ state: 'working', tool: 'Bash' });
    await eventually('the badge to name Bash', async () => (await badge().getAttribute('data-tool')) === 'Bash');
    assert.equal(await badge().getAttribute('data-agent-state'), 'working');
    assert.match(await badge().textContent(), /^agent working · Bash · \d/);
    const shown = await agent();
    assert.equal(shown.tool, 'Bash');
    assert.ok(shown.tool_since, JSON.stringify(shown));
    await shot('tool-bash');
  });

  step('another tool within 2 s of the last change is not written', async () => {
    await report({ state: 'working', tool: 'Edit' });
    assert.ok(Date.now() - bashAt < TOOL_EVERY_MS, 'the test was too slow to see the throttle');
    assert.equal((await agent()).tool, 'Bash');
  });

  step('a reload shows the tool too', async () => {
    await page.reload();
    await eventually('the badge to name Bash after the reload', async () => (await badge().getAttribute('data-tool')) === 'Bash');
    assert.match(await badge().textContent(), /Bash/);
  });

  step('an empty tool reported 2 s later takes it off', async () => {
    await sleep(Math.max(0, bashAt + TOOL_EVERY_MS + 200 - Date.now()));
    await report({ state: 'working', tool: '' });
    await eventually('the badge to name no tool', async () => (await badge().getAttribute('data-tool')) === null);
    assert.equal(await badge().getAttribute('data-agent-state'), 'working');
    assert.equal(await badge().textContent(), 'agent working');
    const shown = await agent();
    assert.equal(shown.tool, null);
    await shot('tool-none');
  });

  step('threw nothing', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
