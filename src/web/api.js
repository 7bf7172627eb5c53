// The broker's /v1 routes, called with the owner token or this device's own
// credential (signed in with a link) as a Bearer header.
// Every failure becomes an ApiError whose message is words a person can read:
// the broker's JSON error `message`, or what went wrong on the way.

const TOKEN_KEY = 'loopx.owner-token';
// A device credential (WEB.md "Signing in a phone") is this device's own,
// revocable, and kept across restarts of an installed page; the owner token
// stays in this tab's session storage only.
const DEVICE_KEY = 'loopx.device-token';

export class ApiError extends Error {
  constructor(message, { status = 0, code = 'network_error', body = null } = {}) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

export const token = {
  get() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(DEVICE_KEY) || '';
    } catch {
      return '';
    }
  },
  set(value) {
    sessionStorage.setItem(TOKEN_KEY, value);
  },
  setDevice(value) {
    localStorage.setItem(DEVICE_KEY, value);
  },
  /** Whether the page signed in as a device (not with the owner token). */
  isDevice() {
    return this.get().startsWith('lxd_');
  },
  forget() {
    sessionStorage.removeItem(TOKEN_KEY);
    try {
      localStorage.removeItem(DEVICE_KEY);
    } catch {
      // nothing kept
    }
  },
};

/**
 * Trades a sign-in link's code for this device's own credential (`POST
 * /v1/devices`, no bearer). A refusal is the broker's words, and is not a
 * refused token: nothing is forgotten.
 */
export async function signInDevice(code, name) {
  let response;
  try {
    response = await fetch('/v1/devices', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify({ code, name }),
      cache: 'no-store',
    });
  } catch (error) {
    throw new ApiError(`Could not reach the broker (${error.message || 'network error'}).`);
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    throw new ApiError(data?.error?.message || `The broker answered HTTP ${response.status}.`, {
      status: response.status,
      code: data?.error?.code || 'http_error',
    });
  }
  return data;
}

/** What this browser calls itself in the broker's list of devices: "Chrome on Android". */
export function deviceName(userAgent = navigator.userAgent) {
  const browser =
    [
      [/Edg\//, 'Edge'],
      [/Firefox\//, 'Firefox'],
      [/Chrome\//, 'Chrome'],
      [/Safari\//, 'Safari'],
    ].find(([pattern]) => pattern.test(userAgent))?.[1] || 'A browser';
  const system =
    [
      [/iPhone/, 'iPhone'],
      [/iPad/, 'iPad'],
      [/Android/, 'Android'],
      [/Windows/, 'Windows'],
      [/Mac OS X/, 'a Mac'],
      [/Linux/, 'Linux'],
    ].find(([pattern]) => pattern.test(userAgent))?.[1] || 'another device';
  return `${browser} on ${system}`;
}

/**
 * The broker's clock as this page sees it, from each answer's `Date` header
 * (whole seconds): the page's own clock may be off, and "working on it for
 * 5 s" counts from the broker's `claimed_at`. Differences within the header's
 * resolution are taken as none.
 */
export const clock = {
  offsetMs: 0,
  now() {
    return Date.now() + this.offsetMs;
  },
  observe(dateHeader, sentAt, receivedAt) {
    const server = Date.parse(dateHeader || '');
    if (Number.isNaN(server)) return;
    const offset = server + 500 - (sentAt + receivedAt) / 2;
    this.offsetMs = Math.abs(offset) > 1500 ? Math.round(offset) : 0;
  },
};

/** Hooks the app installs: called when the broker refuses the token. */
export const hooks = { onUnauthorized: (_error) => {} };

export async function request(method, path, body) {
  const headers = { Authorization: `Bearer ${token.get()}`, Accept: 'application/json' };
  const init = { method, headers, cache: 'no-store' };
  if (body instanceof FormData) {
    init.body = body; // the browser sets the multipart boundary
  } else if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  const sentAt = Date.now();
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(`Could not reach the broker (${error.message || 'network error'}).`);
  }
  clock.observe(response.headers.get('date'), sentAt, Date.now());
  let data = null;
  const text = await response.text().catch(() => '');
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const err = data && typeof data === 'object' ? data.error : null;
    const error = new ApiError(
      err?.message || `The broker answered HTTP ${response.status} ${response.statusText}.`.trim(),
      { status: response.status, code: err?.code || 'http_error', body: data },
    );
    if (response.status === 401) hooks.onUnauthorized(error);
    throw error;
  }
  if (data === null) throw new ApiError('The broker sent an answer that is not JSON.', { status: response.status });
  return { data, status: response.status, headers: response.headers };
}

const enc = encodeURIComponent;

/** All sessions, following next_cursor (bounded), in the broker's order. */
export async function listSessions({ state } = {}) {
  const sessions = [];
  let cursor = null;
  for (let page = 0; page < 10; page++) {
    const query = new URLSearchParams({ limit: '500' });
    if (state) query.set('state', state);
    if (cursor) query.set('cursor', cursor);
    const { data } = await request('GET', `/v1/sessions?${query}`);
    sessions.push(...data.sessions);
    cursor = data.next_cursor;
    if (!cursor) return { sessions, truncated: false };
  }
  return { sessions, truncated: true };
}

export async function getSession(sessionId) {
  return (await request('GET', `/v1/sessions/${enc(sessionId)}`)).data;
}

/** The newest page, or the page just before `beforeSeq`: {turns (seq order), has_more}. */
export async function listTurns(sessionId, { beforeSeq, afterSeq, limit = 50 } = {}) {
  const query = new URLSearchParams({ limit: String(limit) });
  if (afterSeq !== undefined) query.set('after_seq', String(afterSeq));
  // Without a bound the broker pages from the oldest; the largest seq a
  // page can name asks for the newest page instead.
  if (beforeSeq !== undefined) query.set('before_seq', String(beforeSeq));
  else if (afterSeq === undefined) query.set('before_seq', String(Number.MAX_SAFE_INTEGER));
  return (await request('GET', `/v1/sessions/${enc(sessionId)}/turns?${query}`)).data;
}

export async function getTurn(sessionId, turnId) {
  return (await request('GET', `/v1/sessions/${enc(sessionId)}/turns/${enc(turnId)}`)).data;
}

export async function sendMessage(sessionId, text, clientMessageId) {
  const { data } = await request('POST', `/v1/sessions/${enc(sessionId)}/messages`, {
    origin: 'web',
    text,
    client_message_id: clientMessageId,
  });
  return data;
}

/** A message with files: one multipart request, the message as its
 * `message` part and each file a `file` part; answered as sendMessage. */
export async function sendMessageWithFiles(sessionId, text, clientMessageId, files) {
  const form = new FormData();
  const message = { origin: 'web', text, client_message_id: clientMessageId };
  form.append('message', new Blob([JSON.stringify(message)], { type: 'application/json' }));
  for (const file of files) form.append('file', file, file.name);
  const path = `/v1/sessions/${enc(sessionId)}/messages/with-attachments`;
  return (await request('POST', path, form)).data;
}

/** Object URLs of downloaded attachments, by download path: fetched once. */
const attachmentUrls = new Map();

/** An attachment's bytes (with the token) as a `blob:` URL for this page. */
export function attachmentUrl(path) {
  if (!attachmentUrls.has(path)) {
    const loading = fetch(path, { headers: { Authorization: `Bearer ${token.get()}` } }).then(async (response) => {
      if (!response.ok) throw new ApiError(`The file could not be fetched (HTTP ${response.status}).`, { status: response.status });
      return URL.createObjectURL(await response.blob());
    });
    loading.catch(() => attachmentUrls.delete(path));
    attachmentUrls.set(path, loading);
  }
  return attachmentUrls.get(path);
}

export function eventsUrl(sessionId) {
  return `/v1/sessions/${enc(sessionId)}/events`;
}

/** A v4 UUID, also where crypto.randomUUID is missing (a non-secure origin). */
export function newUuid() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Closes the session. With releaseActiveClaim, a message delivered to the
 * agent and not answered is released first and cancelled with the rest. */
export async function closeSession(sessionId, releaseActiveClaim = false) {
  const body = releaseActiveClaim ? { release_active_claim: true } : {};
  return (await request('POST', `/v1/sessions/${enc(sessionId)}/close`, body)).data;
}

/** The session's permission requests: pending first, then newest first. */
export async function listPermissions(sessionId) {
  return (await request('GET', `/v1/sessions/${enc(sessionId)}/permission-requests`)).data.permission_requests;
}

export async function getPermission(sessionId, requestId) {
  return (await request('GET', `/v1/sessions/${enc(sessionId)}/permission-requests/${enc(requestId)}`)).data;
}

/** Answers as the owner: `answer` is {behavior: 'allow'|'deny', answers?,
 * suggestion?, mode?, message?} (or just the behavior). */
export async function answerPermission(sessionId, requestId, answer) {
  const path = `/v1/sessions/${enc(sessionId)}/permission-requests/${enc(requestId)}/answer`;
  const body = typeof answer === 'string' ? { behavior: answer } : answer;
  return (await request('POST', path, body)).data;
}

/** A one-time code that pairs a Lark chat with the session (valid 10 minutes,
 * once): {code, command (the `/link <code>` line to send the bot), expires_at}. */
export async function larkPairCode(sessionId) {
  return (await request('POST', `/v1/sessions/${enc(sessionId)}/lark-link/codes`)).data;
}

/** Which Lark chat feeds the session: {session_id, chat_id (null when none),
 * approvers, terminal_turns}. */
export async function getLarkLink(sessionId) {
  return (await request('GET', `/v1/sessions/${enc(sessionId)}/lark-link`)).data;
}

/** Links (again) a chat: replaces its approvers and its terminal_turns. */
export async function putLarkLink(sessionId, link) {
  return (await request('PUT', `/v1/sessions/${enc(sessionId)}/lark-link`, link)).data;
}
