// What every browser test needs: the broker as a child process on a free
// port with a temp data dir, a test host that binds sessions over HTTP, and
// Debian's Chromium (/usr/bin/chromium, or CHROMIUM_PATH) with the flags
// that keep it quiet. Builds nothing: the broker binary comes from LOOPX_BIN
// (default target/debug/loopx); no browser is downloaded.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createWriteStream, existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { it } from 'node:test';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
export const BIN = path.resolve(repo, process.env.LOOPX_BIN || 'target/debug/loopx');
export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
export const ARTIFACTS = path.join(repo, 'target/test-artifacts/browser');
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** Headless Chromium with one 1280×900 page whose errors land in `pageErrors`. */
export async function launchPage(pageErrors) {
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(15000);
  page.on('pageerror', (error) => pageErrors.push(error));
  return { browser, page };
}

const axeSource = createRequire(import.meta.url)('axe-core').source;

/** axe-core's serious and critical violations on the page (WCAG 2.1 AA and best practice). */
export async function seriousAxeProblems(page) {
  await page.evaluate(axeSource);
  const result = await page.evaluate(() =>
    window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] } }),
  );
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id}: ${v.help}: ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it returns something truthy; fails with `what` after `timeout`. */
export async function eventually(what, check, { timeout = 15000, interval = 100 } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
      last = undefined;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ''}`);
    }
    await sleep(interval);
  }
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

// --- the broker, as a child process on a free port with a temp data dir ---

export class Broker {
  async start() {
    if (!existsSync(BIN)) {
      throw new Error(`no broker binary at ${BIN}: run \`cargo build\` first or set LOOPX_BIN`);
    }
    this.dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'loopx-browser-'));
    await fs.mkdir(ARTIFACTS, { recursive: true });
    this.log = createWriteStream(path.join(ARTIFACTS, 'broker.log'));
    await this.spawn();
  }

  /** Starts the broker on `port` (a free one by default), on the same data dir. */
  async spawn(port) {
    for (let attempt = 1; ; attempt++) {
      port = port || (await freePort());
      this.port = port;
      this.base = `http://127.0.0.1:${port}`;
      this.child = spawn(BIN, ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', this.dataDir], {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, RUST_LOG: process.env.RUST_LOG || 'info' },
      });
      this.exited = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })));
      this.child.stdout.pipe(this.log, { end: false });
      this.child.stderr.pipe(this.log, { end: false });
      const up = await Promise.race([
        eventually('the broker to answer /healthz', async () => (await fetch(`${this.base}/healthz`)).ok, {
          timeout: 30000,
        }).then(() => true),
        this.exited.then(() => false),
      ]);
      if (up) break;
      if (attempt === 3) throw new Error('the broker did not start; see target/test-artifacts/browser/broker.log');
      await sleep(500);
    }
    this.token = (await fs.readFile(path.join(this.dataDir, 'owner.token'), 'utf8')).trim();
  }

  /** Stops the broker (SIGTERM, as an operator would) and starts it again on the same port. */
  async restart() {
    await this.halt();
    await this.spawn(this.port);
  }

  async halt() {
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill('SIGTERM');
      const done = await Promise.race([this.exited, sleep(10000).then(() => null)]);
      if (!done) {
        this.child.kill('SIGKILL');
        await this.exited;
      }
    }
  }

  /** One HTTP call as a host or a script would make it. */
  async call(method, route, body, { token = this.token, headers = {} } = {}) {
    const init = { method, headers: { Authorization: `Bearer ${token}`, ...headers } };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const response = await fetch(`${this.base}${route}`, init);
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = text;
    }
    return { status: response.status, data, headers: response.headers };
  }

  async ok(method, route, body) {
    const { status, data } = await this.call(method, route, body);
    assert.ok(status >= 200 && status < 300, `${method} ${route} answered ${status}: ${JSON.stringify(data)}`);
    return data;
  }

  async stop() {
    await this.halt();
    this.log?.end();
    if (this.dataDir) await fs.rm(this.dataDir, { recursive: true, force: true });
  }
}

// --- a test host: registers, binds, claims and completes over HTTP ---

export async function bindSession(broker, hostSessionId) {
  const identity = {
    goal_id: 'goal-browser',
    agent_id: 'agent-web',
    host_surface: 'codex-cli',
    host_session_id: hostSessionId,
  };
  await broker.ok('POST', '/v1/agent-threads', identity);
  const session = await broker.ok('POST', '/v1/sessions', {
    ...identity,
    executor_endpoint_id: 'exec-browser',
    dry_run: false,
  });
  return { ...session, host: { host_surface: 'codex-cli', host_session_id: hostSessionId } };
}

/** Signs in with the owner token and opens a session bound by
 * `bindSession`, waiting until its event stream is live. */
export async function openChat(page, broker, sessionId) {
  await page.goto(`${broker.base}/`);
  await page.fill('#token-input', broker.token);
  await page.press('#token-input', 'Enter');
  await page.goto(`${broker.base}/#/s/${sessionId}`);
  await page.locator('#chat-heading', { hasText: 'goal-browser' }).waitFor();
  await eventually('the event stream', async () => (await page.locator('#live-status').getAttribute('data-live')) === 'live');
}

export async function allTurns(broker, sessionId) {
  const { turns } = await broker.ok('GET', `/v1/sessions/${sessionId}/turns?limit=200`);
  return turns;
}

/**
 * A broker that is killed with this process, also when the script is
 * interrupted or exits before its `after` hook ran (the browser is a child
 * of playwright, which ends it on exit).
 */
export function brokerForThisProcess() {
  const broker = new Broker();
  process.on('exit', () => {
    if (broker.child && broker.child.exitCode === null && broker.child.signalCode === null) {
      broker.child.kill('SIGKILL');
    }
  });
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, () => process.exit(130));
  }
  return broker;
}

/**
 * `step(name, fn)`: one test that, on failure, saves a screenshot of the page
 * named after it; `shot(name)`: a screenshot into the artifacts folder.
 */
export function stepper(getPage) {
  async function shot(name) {
    await getPage().screenshot({ path: path.join(ARTIFACTS, `${name}.png`), fullPage: false });
  }
  function step(name, fn) {
    it(name, async (t) => {
      try {
        await fn(t);
      } catch (error) {
        if (getPage()) {
          const file = `failed-${name.replace(/[^a-z0-9]+/gi, '-').slice(0, 60)}`;
          await shot(file).catch(() => {});
        }
        throw error;
      }
    });
  }
  return { step, shot };
}
