// What the agent changed, on the Web chat page in headless Chromium against
// a real broker (issue 57): before any report the Changes view says so; the
// host reports its working tree while it holds a message, then answers it;
// the answered turn shows "2 files changed (+3 −1)"; the Changes view shows
// the branch, ahead/behind and each file with its counts (the binary one
// marked), and a tap opens a file's diff with line numbers; the page is
// accessible throughout.
//
//   LOOPX_BIN=target/debug/loopx node tests/browser/changes.test.mjs
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
let turn;
const pageErrors = [];
const { step, shot } = stepper(() => page);
const ODD = 'docs/a b été.md';

const report = (host) => ({
  ...host,
  branch: 'feature/phone',
  head: '0123456789abcdef0123456789abcdef01234567',
  ahead: 2,
  behind: 0,
  files: [
    { path: 'src/main.rs', status: 'modified', added: 2, removed: 1 },
    { path: ODD, status: 'untracked', added: 1, removed: 0 },
    { path: 'logo.png', status: 'modified', added: 0, removed: 0, binary: true },
  ],
  diff:
    'diff --git a/src/main.rs b/src/main.rs\n--- a/src/main.rs\n+++ b/src/main.rs\n' +
    '@@ -10,3 +10,4 @@ fn main() {\n     keep();\n-    old();\n+    new();\n+    more();\n     end();\n' +
    `diff --git a/${ODD} b/${ODD}\nnew file mode 100644\n--- /dev/null\n+++ b/${ODD}\n@@ -0,0 +1 @@\n+<b>not bold</b>\n`,
  turn_files: ['src/main.rs', ODD],
});

describe('what the agent changed, on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-changes');
    turn = await broker.ok('POST', `/v1/sessions/${session.session_id}/messages`, { origin: 'web', text: 'Fix main, please.' });
    ({ browser, page } = await launchPage(pageErrors));
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('before any report, the Changes view says there is none', async () => {
    await page.getByRole('button', { name: 'Changes' }).click();
    await page.locator('#changes-summary', { hasText: 'No changes reported' }).waitFor();
    await page.getByRole('button', { name: 'Back to the chat' }).click();
    assert.equal(await page.locator('#changes-view').isHidden(), true);
    assert.equal(await page.locator('#transcript-scroll').isVisible(), true);
  });

  step('an answered turn shows what its tools changed', async () => {
    const sid = session.session_id;
    await broker.ok('POST', `/v1/sessions/${sid}/claims`, { ...session.host, claim_id: 'claim-edit' });
    const { status } = await broker.call('POST', `/v1/sessions/${sid}/changes`, report(session.host));
    assert.equal(status, 204);
    await broker.ok('POST', `/v1/sessions/${sid}/turns/${turn.turn_id}/complete`, {
      ...session.host,
      claim_id: 'claim-edit',
      completion_id: 'done-edit',
      response: { message: 'Fixed.' },
    });
    const line = page.locator(`#turn-${turn.turn_id} .turn-changes summary`);
    await line.waitFor();
    assert.equal(await line.innerText(), '2 files changed (+3 \u22121)');
    await shot('changes-turn');
  });

  step('the Changes view lists the branch and the files, binary marked', async () => {
    await page.getByRole('button', { name: 'Changes' }).click();
    const summary = page.locator('#changes-summary');
    await summary.locator('.changes-branch', { hasText: 'feature/phone' }).waitFor();
    assert.match(await summary.locator('.changes-head').innerText(), /↑2 ↓0/);
    assert.match(await summary.locator('.changes-head').innerText(), /3 files changed \(\+3 \u22121\)/);
    const files = await summary.locator('.changes-file').allInnerTexts();
    assert.equal(files.length, 3);
    assert.match(files[0], /src\/main\.rs[\s\S]*\+2 \u22121/);
    assert.match(files[2], /logo\.png[\s\S]*binary/);
    assert.equal(await page.locator('#transcript-scroll').isHidden(), true);
  });

  step("a tap opens the file's diff with line numbers", async () => {
    await page.locator('.changes-file', { hasText: 'src/main.rs' }).click();
    const rows = page.locator('#changes-diff table.diff tbody tr');
    await rows.first().waitFor();
    const added = page.locator('#changes-diff tr.diff-add');
    assert.equal(await added.count(), 2);
    assert.deepEqual(await added.first().locator('td').allInnerTexts(), ['', '11', '+    new();']);
    const removed = page.locator('#changes-diff tr.diff-del');
    assert.deepEqual(await removed.first().locator('td').allInnerTexts(), ['11', '', '-    old();']);
    const context = page.locator('#changes-diff tr.diff-ctx').last();
    assert.deepEqual(await context.locator('td').allInnerTexts(), ['12', '13', '     end();']);
    await shot('changes-diff');
  });

  step('a path with spaces and accents opens, its text shown as text', async () => {
    await page.locator('.changes-file', { hasText: ODD }).click();
    await page.locator('#changes-diff .diff-title', { hasText: ODD }).waitFor();
    assert.equal(await page.locator('#changes-diff b').count(), 0);
    assert.equal(await page.locator('#changes-diff tr.diff-add td.diff-line').innerText(), '+<b>not bold</b>');
    await page.locator('.changes-file', { hasText: 'logo.png' }).click();
    await page.locator('#changes-diff .diff-none', { hasText: 'binary' }).waitFor();
  });

  step('axe-core finds no serious or critical accessibility violation in the Changes view', async () => {
    assert.deepEqual(await seriousAxeProblems(page), []);
  });

  step('back to the chat', async () => {
    await page.getByRole('button', { name: 'Back to the chat' }).click();
    await eventually('the transcript', async () => page.locator('#transcript-scroll').isVisible());
    assert.equal(await page.locator('#changes-diff').isHidden(), true);
  });

  step('threw nothing', async () => {
    assert.deepEqual(pageErrors.map(String), []);
  });
});
