// Server-Sent Events over fetch, so the owner token travels in the
// Authorization header (EventSource cannot send headers, and the token never
// goes into a URL). Works in browsers and in Node 20+ (the unit tests).

/**
 * An incremental parser for the text/event-stream format: feed it decoded
 * text in any chunking, it calls onEvent({id, event, data}) at each blank
 * line that ends an event with data. Lines end with CRLF, LF or CR; lines
 * starting with ':' are comments; "field: value" drops one leading space.
 * `id` persists across events (the "last event ID"), as the standard says.
 */
export class SseParser {
  constructor(onEvent, onRetry = () => {}) {
    this.onEvent = onEvent;
    this.onRetry = onRetry;
    this.buffer = '';
    this.pendingCR = false;
    this.lastEventId = '';
    this.reset();
  }

  reset() {
    this.eventType = '';
    this.data = [];
    this.hasData = false;
  }

  feed(text) {
    let chunk = text;
    // A CR at the very end of the previous chunk may be the first half of a CRLF.
    if (this.pendingCR && chunk.startsWith('\n')) chunk = chunk.slice(1);
    this.pendingCR = false;
    this.buffer += chunk;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const c = this.buffer[i];
      if (c !== '\n' && c !== '\r') continue;
      this.line(this.buffer.slice(start, i));
      if (c === '\r') {
        if (i + 1 === this.buffer.length) this.pendingCR = true;
        else if (this.buffer[i + 1] === '\n') i++;
      }
      start = i + 1;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === '') {
      this.dispatch();
      return;
    }
    if (line.startsWith(':')) return; // a comment (keep-alive)
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'event':
        this.eventType = value;
        break;
      case 'data':
        this.data.push(value);
        this.hasData = true;
        break;
      case 'id':
        if (!value.includes('\0')) this.lastEventId = value;
        break;
      case 'retry':
        if (/^\d+$/.test(value)) this.onRetry(Number(value));
        break;
      default:
        break; // unknown fields are ignored
    }
  }

  dispatch() {
    if (this.hasData) {
      this.onEvent({
        id: this.lastEventId,
        event: this.eventType || 'message',
        data: this.data.join('\n'),
      });
    }
    this.reset();
  }
}

/** The next reconnection delay: exponential from 1 s, capped, with jitter. */
export function backoffDelay(attempt, { base = 1000, cap = 30000, random = Math.random } = {}) {
  const ceiling = Math.min(cap, base * 2 ** Math.max(0, attempt - 1));
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

/** Thrown for a response that is not an event stream; carries the status and error body. */
export class StreamRefused extends Error {
  constructor(status, body, message) {
    super(message);
    this.name = 'StreamRefused';
    this.status = status;
    this.body = body;
  }
}

/**
 * Keeps one event stream open: connects, parses, and reconnects with backoff
 * when the stream drops, sending `Last-Event-ID` so the broker replays exactly
 * what was missed. Callbacks:
 *  - onOpen({resumed}): a stream answered 200 text/event-stream; `resumed` is
 *    false when it started without Last-Event-ID ("from now"), so the caller
 *    should re-read what may have changed before it.
 *  - onEvent({id, event, data})
 *  - onDown({error, retryInMs, unavailable}): the stream is not running;
 *    `unavailable` says the broker has no such stream (404/405/406/501 or not
 *    an event stream), so the caller should fall back to polling.
 *  - onUnauthorized(error): 401; the stream stops for good.
 * Returns {close()}.
 */
export function openEventStream({
  url,
  token,
  lastEventId = '',
  onOpen = () => {},
  onEvent = () => {},
  onDown = () => {},
  onUnauthorized = () => {},
  fetchImpl = (...args) => globalThis.fetch(...args),
  delay = backoffDelay,
  unavailableDelayMs = 15000,
  setTimer = (fn, ms) => setTimeout(fn, ms),
  clearTimer = (t) => clearTimeout(t),
}) {
  let closed = false;
  let attempt = 0;
  let timer = null;
  let controller = null;
  let retryHint = null;
  let lastId = lastEventId;

  const schedule = (error, unavailable) => {
    if (closed) return;
    attempt += 1;
    const retryInMs = unavailable
      ? Math.max(unavailableDelayMs, delay(attempt))
      : (retryHint ?? delay(attempt));
    onDown({ error, retryInMs, unavailable });
    if (closed) return; // onDown may have closed the stream
    timer = setTimer(connect, retryInMs);
  };

  async function connect() {
    if (closed) return;
    timer = null;
    controller = new AbortController();
    const headers = { Authorization: `Bearer ${token}`, Accept: 'text/event-stream' };
    if (lastId !== '') headers['Last-Event-ID'] = lastId;
    let response;
    try {
      response = await fetchImpl(url, { headers, signal: controller.signal, cache: 'no-store' });
    } catch (error) {
      if (!closed) schedule(error, false);
      return;
    }
    const type = response.headers.get('content-type') || '';
    if (!response.ok || !type.startsWith('text/event-stream')) {
      let body = null;
      try {
        body = await response.json();
      } catch {
        // not JSON; the status says enough
      }
      const message = body?.error?.message || `The event stream answered HTTP ${response.status}.`;
      const error = new StreamRefused(response.status, body, message);
      if (closed) return;
      if (response.status === 401) {
        closed = true;
        onUnauthorized(error);
        return;
      }
      const unavailable = [404, 405, 406, 501].includes(response.status) || response.ok;
      schedule(error, unavailable);
      return;
    }
    const resumed = lastId !== '';
    const parser = new SseParser(
      (event) => {
        lastId = event.id;
        if (!closed) onEvent(event);
      },
      (ms) => {
        retryHint = ms;
      },
    );
    parser.lastEventId = lastId;
    onOpen({ resumed });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let receivedSomething = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!receivedSomething) {
          receivedSomething = true;
          attempt = 0; // a stream that delivered something was a good connection
        }
        parser.feed(decoder.decode(value, { stream: true }));
      }
      parser.feed(decoder.decode());
      if (!closed) schedule(new Error('The event stream ended.'), false);
    } catch (error) {
      if (!closed) schedule(error, false);
    }
  }

  connect();
  return {
    close() {
      closed = true;
      if (timer !== null) clearTimer(timer);
      controller?.abort();
    },
    get lastEventId() {
      return lastId;
    },
  };
}
