// Attachments on the Web chat page, in headless Chromium against a real
// broker: files attached (the file picker), pasted and removed in the
// composer; the message and its files sent together (one multipart
// request); the agent side claims the turn and downloads the same bytes; the
// transcript shows the image as a thumbnail (fetched with the token, shown
// from a blob: URL the page's CSP allows) and the other file as a download
// link; nothing breaks the CSP; axe-core.
//
//   node tests/browser/attachments.test.mjs
//
// Builds nothing (LOOPX_BIN, default target/debug/loopx); Debian's Chromium.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs/promises';
import { after, before, describe } from 'node:test';

import { ARTIFACTS, bindSession, brokerForThisProcess, eventually, launchPage, openChat, seriousAxeProblems, stepper } from './support.mjs';

// A 2×2 PNG (red, green, blue, white): small, and decodable, so a shown
// thumbnail has a natural size.
const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEklEQVR4nGP4z8DAAMIM/4EAAB/uBfsL2WiLAAAAAElFTkSuQmCC',
  'base64',
);
const NOTES = Buffer.from('plain notes from the browser\n');

const broker = brokerForThisProcess();
let browser;
let page;
let session;
const pageErrors = [];
const consoleProblems = [];
const multipartPosts = [];
const { step, shot } = stepper(() => page);

const sha256 = (bytes) => crypto.createHash('sha256').update(bytes).digest('hex');
const turnWithText = (text) =>
  page.locator('#transcript > li', { has: page.locator('.bubble-user .bubble-text', { hasText: text }) });

describe('attachments on the Web chat page', () => {
  before(async () => {
    await fs.mkdir(ARTIFACTS, { recursive: true });
    await broker.start();
    session = await bindSession(broker, 'host-session-attachments');
    ({ browser, page } = await launchPage(pageErrors));
    page.on('console', (message) => {
      if (/Content Security Policy|Refused to/i.test(message.text())) consoleProblems.push(message.text());
    });
    page.on('request', (request) => {
      if (request.method() === 'POST' && request.url().endsWith('/messages/with-attachments')) {
        multipartPosts.push(request.headers()['content-type'] || '');
      }
    });
    await openChat(page, broker, session.session_id);
  });

  after(async () => {
    await browser?.close();
    await broker.stop();
  });

  step('a pasted file shows as a chip and can be removed', async () => {
    await page.focus('#composer-text');
    await page.evaluate(() => {
      const data = new DataTransfer();
      data.items.add(new File(['pasted bytes'], 'pasted.txt', { type: 'text/plain' }));
      const paste = new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true });
      document.getElementById('composer-text').dispatchEvent(paste);
    });
    const chip = page.locator('#file-list .file-chip', { hasText: 'pasted.txt' });
    await chip.waitFor();
    assert.equal(await page.inputValue('#composer-text'), '', 'a pasted file is not pasted as text');
    await page.getByRole('button', { name: 'Remove pasted.txt' }).click();
    await eventually('the chip to go', async () => (await page.locator('#file-list .file-chip').count()) === 0);
  });

  step('an empty file is refused in words before anything is sent', async () => {
    await page.setInputFiles('#file-input', { name: 'empty.txt', mimeType: 'text/plain', buffer: Buffer.alloc(0) });
    await eventually('the refusal', async () => /empty\.txt is empty/.test(await page.locator('#send-error').innerText()));
    assert.equal(await page.locator('#file-list .file-chip').count(), 0);
  });

  step('a message sent with an image and a file reaches the agent side byte for byte', async () => {
    await page.setInputFiles('#file-input', [
      { name: 'shot.png', mimeType: 'image/png', buffer: PNG },
      { name: 'notes.txt', mimeType: 'text/plain', buffer: NOTES },
    ]);
    await page.locator('#file-list .file-chip', { hasText: 'notes.txt' }).waitFor();
    assert.equal(await page.locator('#file-list .file-chip').count(), 2);
    await page.fill('#composer-text', 'Here is the screenshot');
    await page.press('#composer-text', 'Enter');
    const turn = turnWithText('Here is the screenshot');
    await turn.waitFor();
    await eventually('the chips to clear', async () => (await page.locator('#file-list .file-chip').count()) === 0);
    assert.equal(multipartPosts.length, 1, 'one request carried the message and its files');
    assert.match(multipartPosts[0], /^multipart\/form-data; boundary=/);

    // The agent side: claim the turn, download its files.
    const claim = await broker.ok('POST', `/v1/sessions/${session.session_id}/claims`, {
      ...session.host,
      claim_id: 'claim-attachments-1',
      wait_seconds: 5,
    });
    assert.equal(claim.claimed, true);
    assert.equal(claim.turn.text, 'Here is the screenshot');
    const [image, notes] = claim.turn.attachments;
    assert.equal(image.name, 'shot.png');
    assert.equal(image.content_type, 'image/png');
    assert.equal(image.sha256, sha256(PNG));
    assert.equal(notes.name, 'notes.txt');
    assert.equal(notes.content_type, 'application/octet-stream');
    for (const [listed, bytes] of [
      [image, PNG],
      [notes, NOTES],
    ]) {
      const response = await fetch(`${broker.base}${listed.download}`, {
        headers: { Authorization: `Bearer ${broker.token}` },
      });
      assert.equal(response.status, 200);
      assert.equal(response.headers.get('x-content-type-options'), 'nosniff');
      assert.deepEqual(Buffer.from(await response.arrayBuffer()), bytes);
    }
  });

  step('the transcript shows the image as a thumbnail and the file as a download link', async () => {
    const turn = turnWithText('Here is the screenshot');
    const thumb = turn.locator('img.thumb');
    await thumb.waitFor();
    assert.equal(await thumb.getAttribute('alt'), 'shot.png');
    await eventually('the thumbnail to load', async () =>
      thumb.evaluate((img) => img.complete && img.naturalWidth === 2 && img.src.startsWith('blob:')),
    );
    const link = turn.locator('a.attachment-link');
    assert.match(await link.innerText(), /notes\.txt \(application\/octet-stream, 29 B\)/);
    const [download] = await Promise.all([page.waitForEvent('download'), link.click()]);
    assert.equal(download.suggestedFilename(), 'notes.txt');
    const saved = await download.path();
    assert.deepEqual(await fs.readFile(saved), NOTES);
    await shot('attachments-thumbnail');
  });

  step('a reload shows the thumbnail again; no CSP violation, no page error, axe-core finds nothing serious', async () => {
    await page.reload();
    const thumb = turnWithText('Here is the screenshot').locator('img.thumb');
    await thumb.waitFor();
    await eventually('the thumbnail to load again', async () => thumb.evaluate((img) => img.complete && img.naturalWidth === 2));
    assert.deepEqual(consoleProblems, []);
    assert.deepEqual(pageErrors.map(String), []);
    assert.deepEqual(await seriousAxeProblems(page), []);
  });
});
