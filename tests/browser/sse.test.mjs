// Unit tests of the page's event-stream client (src/web/sse.js), in Node:
// the parser on awkward chunkings, and the reconnecting stream against a
// small local server that drops the connection and expects Last-Event-ID.
//
//   node tests/browser/sse.test.mjs

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';

import { SseParser, backoffDelay, openEventStream } from '../../src/web/sse.js';

function parseAll(chunks) {
  const events = [];
  const retries = [];
  const parser = new SseParser(
    (e) => events.push(e),
    (ms) => retries.push(ms),
  );
  for (const chunk of chunks) parser.feed(chunk);
  return { events, retries, parser };
}

describe('SseParser', () => {
  it('parses id, event and data, with a blank line ending each event', () => {
    const { events } = parseAll([
      'id: 1\nevent: turn\ndata: {"turn_id":"turn_1","seq":1,"state":"queued"}\n\n',
      'id: 2\nevent: session\ndata: {"state":"closed"}\n\n',
    ]);
    assert.deepEqual(events, [
      { id: '1', event: 'turn', data: '{"turn_id":"turn_1","seq":1,"state":"queued"}' },
      { id: '2', event: 'session', data: '{"state":"closed"}' },
    ]);
  });

  it('handles any chunking, CRLF and CR line ends, even a CRLF split in two', () => {
    const text = 'id: 7\r\nevent: turn\r\ndata: a\r\n\r\nid: 8\rdata: b\r\r';
    for (let size = 1; size <= text.length; size++) {
      const chunks = [];
      for (let i = 0; i < text.length; i += size) chunks.push(text.slice(i, i + size));
      const { events } = parseAll(chunks);
      assert.deepEqual(
        events,
        [
          { id: '7', event: 'turn', data: 'a' },
          { id: '8', event: 'message', data: 'b' },
        ],
        `chunk size ${size}`,
      );
    }
  });

  it('ignores comments, joins data lines, keeps the last id, skips events without data', () => {
    const { events, retries, parser } = parseAll([
      ': keep-alive\n\n',
      'id: 3\n\n', // an id alone dispatches nothing but is remembered
      'data:one\ndata: two\ndata\n\n',
      'retry: 2500\nunknown: x\n\n',
      'id: 4\nevent: turn\ndata: {}\n',
    ]);
    assert.deepEqual(events, [{ id: '3', event: 'message', data: 'one\ntwo\n' }]);
    assert.deepEqual(retries, [2500]);
    parser.feed('\n');
    assert.deepEqual(events[1], { id: '4', event: 'turn', data: '{}' });
  });
});

describe('backoffDelay', () => {
  it('grows from about a second and stays under the cap', () => {
    assert.equal(backoffDelay(1, { random: () => 1 }), 1000);
    assert.equal(backoffDelay(1, { random: () => 0 }), 500);
    assert.equal(backoffDelay(4, { random: () => 1 }), 8000);
    assert.equal(backoffDelay(40, { random: () => 1 }), 30000);
  });
});

describe('openEventStream', () => {
  let server;
  let base;
  const seen = [];
  let behaviour = () => {};

  before(async () => {
    server = http.createServer((req, res) => {
      seen.push({ url: req.url, headers: req.headers });
      behaviour(req, res);
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${server.address().port}`;
  });

  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it('sends the token as a header, resumes with Last-Event-ID after a drop', async () => {
    seen.length = 0;
    let connection = 0;
    behaviour = (req, res) => {
      connection += 1;
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      if (connection === 1) {
        res.write(': hello\n\nid: 1\nevent: turn\ndata: {"turn_id":"turn_a","seq":1,"state":"queued"}\n\n');
        res.write('id: 2\nevent: turn\ndata: {"turn_id":"turn_a","seq":1,"state":"claimed"}\n\nid: 3\nevent: tu');
        setTimeout(() => res.socket.destroy(), 50); // drop mid-event
      } else {
        res.end('id: 3\nevent: turn\ndata: {"turn_id":"turn_a","seq":1,"state":"completed"}\n\n');
      }
    };
    const events = [];
    const opens = [];
    const downs = [];
    const stream = openEventStream({
      url: `${base}/v1/sessions/ses_1/events`,
      token: 'secret-token',
      delay: () => 20,
      onOpen: (o) => opens.push(o),
      onEvent: (e) => events.push(e),
      onDown: (d) => downs.push(d),
    });
    try {
      const deadline = Date.now() + 5000;
      while (events.length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      assert.deepEqual(
        events.map((e) => [e.id, e.event, JSON.parse(e.data).state]),
        [
          ['1', 'turn', 'queued'],
          ['2', 'turn', 'claimed'],
          ['3', 'turn', 'completed'],
        ],
      );
      assert.equal(seen[0].headers.authorization, 'Bearer secret-token');
      assert.equal(seen[0].headers.accept, 'text/event-stream');
      assert.equal(seen[0].headers['last-event-id'], undefined, 'the first stream starts from now');
      assert.equal(seen[1].headers['last-event-id'], '2', 'the reconnect resumes after the last whole event');
      assert.ok(seen.every((s) => !s.url.includes('secret-token')), 'the token is never in a URL');
      assert.deepEqual(opens.slice(0, 2), [{ resumed: false }, { resumed: true }]);
      assert.ok(downs.length >= 1 && downs.every((d) => !d.unavailable));
      assert.equal(stream.lastEventId, '3');
    } finally {
      stream.close();
    }
  });

  it('reports a missing stream as unavailable, with the error message in words', async () => {
    behaviour = (req, res) => {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end('{"error":{"code":"not_found","message":"No such route."}}');
    };
    const down = await new Promise((resolve) => {
      const stream = openEventStream({
        url: `${base}/v1/sessions/ses_1/events`,
        token: 't',
        onDown: (d) => {
          stream.close();
          resolve(d);
        },
      });
    });
    assert.equal(down.unavailable, true);
    assert.equal(down.error.message, 'No such route.');
    assert.ok(down.retryInMs >= 15000);
  });

  it('stops for good on 401 and hands over the broker message', async () => {
    let calls = 0;
    behaviour = (req, res) => {
      calls += 1;
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end('{"error":{"code":"unauthorized","message":"A valid owner token is required."}}');
    };
    const error = await new Promise((resolve) => {
      openEventStream({ url: `${base}/e`, token: 'bad', delay: () => 10, onUnauthorized: resolve });
    });
    assert.equal(error.status, 401);
    assert.equal(error.message, 'A valid owner token is required.');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(calls, 1, 'no reconnect after 401');
  });

  it('close() aborts a running stream and schedules nothing', async () => {
    let connections = 0;
    behaviour = (req, res) => {
      connections += 1;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(': open\n\n');
    };
    const downs = [];
    const opened = await new Promise((resolve) => {
      const stream = openEventStream({
        url: `${base}/e`,
        token: 't',
        delay: () => 10,
        onOpen: () => resolve(stream),
        onDown: (d) => downs.push(d),
      });
    });
    opened.close();
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(connections, 1);
    assert.deepEqual(downs, []);
  });
});
