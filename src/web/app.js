// The LoopX Web chat: sign in with the owner token, list sessions, open one,
// read its transcript (newest page first, paging back), send messages
// (idempotent by client_message_id), and follow each turn live from the
// session's event stream, falling back to re-reading while it is unavailable.

import * as api from './api.js';
import { openEventStream } from './sse.js';
import { plainText } from './markdown.js';
import { attention } from './attention.js';
import { PermissionCards } from './permissions.js';
import { changesSummary, diffTable, loadChanges, loadFile, turnChanges } from './changes.js';
import { agentBadge, capabilityList, duration, el, fileSize, msSince, sessionFacts, sessionItem, stateBadge, turnItem } from './view.js';

const $ = (id) => document.getElementById(id);
const ui = {
  pageError: $('page-error'),
  forget: $('forget-token'),
  linkDevice: $('link-device'),
  linkPanel: $('link-panel'),
  linkUrl: $('link-url'),
  linkExpiry: $('link-expiry'),
  linkError: $('link-error'),
  linkCopy: $('link-copy'),
  linkDone: $('link-done'),
  tokenView: $('token-view'),
  tokenForm: $('token-form'),
  tokenInput: $('token-input'),
  tokenError: $('token-error'),
  tokenSubmit: $('token-submit'),
  appView: $('app-view'),
  stateFilter: $('state-filter'),
  refresh: $('refresh-sessions'),
  sessionsNote: $('sessions-note'),
  sessionList: $('session-list'),
  chatEmpty: $('chat-empty'),
  chat: $('chat'),
  heading: $('chat-heading'),
  chatHead: $('chat-head'),
  sessionMenu: $('session-menu'),
  chatState: $('chat-state'),
  chatAsking: $('chat-asking'),
  needsYou: $('needs-you'),
  needsYouHeading: $('needs-you-heading'),
  pinned: $('pinned'),
  facts: $('session-facts'),
  capabilities: $('capabilities'),
  liveStatus: $('live-status'),
  scroll: $('transcript-scroll'),
  loadOlder: $('load-older'),
  transcript: $('transcript'),
  transcriptEmpty: $('transcript-empty'),
  closedNote: $('closed-note'),
  continuedNote: $('continued-note'),
  closeSession: $('close-session'),
  closePanel: $('close-panel'),
  closeProblem: $('close-problem'),
  closeConfirm: $('close-confirm'),
  closeRelease: $('close-release'),
  closeCancel: $('close-cancel'),
  closeError: $('close-error'),
  larkLink: $('lark-link'),
  larkLinkChat: $('lark-link-chat'),
  larkApprovers: $('lark-approvers'),
  larkApproversNone: $('lark-approvers-none'),
  larkTerminal: $('lark-terminal'),
  larkLinkError: $('lark-link-error'),
  larkPair: $('lark-pair'),
  pairPanel: $('pair-panel'),
  pairCommand: $('pair-command'),
  pairExpiry: $('pair-expiry'),
  pairAgain: $('pair-again'),
  pairDone: $('pair-done'),
  pairError: $('pair-error'),
  composer: $('composer'),
  text: $('composer-text'),
  send: $('send'),
  attach: $('attach'),
  fileInput: $('file-input'),
  fileList: $('file-list'),
  sendError: $('send-error'),
  announcer: $('announcer'),
  changesToggle: $('changes-toggle'),
  changesView: $('changes-view'),
  changesHeading: $('changes-heading'),
  changesRefresh: $('changes-refresh'),
  changesClose: $('changes-close'),
  changesError: $('changes-error'),
  changesSummary: $('changes-summary'),
  changesDiff: $('changes-diff'),
};

const PAGE_TITLE = document.title;
const PAGE_SIZE = 50;
const POLL_MS = 2500; // re-read cadence while the event stream is down
const IDLE_POLL_EVERY = 4; // ...and, with nothing pending, only every 4th tick
const MAX_TEXT_BYTES = 64 * 1024;
// The broker's attachment limits (src/attachments.rs), checked here first
// so that a person hears at once what the broker would refuse.
const MAX_FILES = 10;
const MAX_FILE_BYTES = 20 * 1024 * 1024;
const MAX_MESSAGE_FILE_BYTES = 50 * 1024 * 1024;

let sessions = [];
let sessionsTruncated = false;
/** Open sessions whose agent is away and that have no message: leftovers. */
let emptySessions = new Set();
let signedIn = false;
/** The open chat, or null. Replaced (never reused) when another opens. */
let chat = null;

// --- small helpers ---

function show(node, visible) {
  node.hidden = !visible;
}

function showError(node, message) {
  node.textContent = message || '';
  node.hidden = !message;
}

function announce(message) {
  // A fresh node per message, so assistive technology reads each one.
  ui.announcer.replaceChildren(el('p', { text: message }));
}

function draftKey(sessionId) {
  return `loopx.draft.${sessionId}`;
}

function loadDraft(sessionId) {
  try {
    const draft = JSON.parse(sessionStorage.getItem(draftKey(sessionId)) || 'null');
    if (draft && typeof draft.text === 'string') return draft;
  } catch {
    // a damaged draft is no draft
  }
  return { text: '', id: null };
}

function saveDraft(sessionId, draft) {
  try {
    if (!draft.text && !draft.id) sessionStorage.removeItem(draftKey(sessionId));
    else sessionStorage.setItem(draftKey(sessionId), JSON.stringify(draft));
  } catch {
    // storage full or refused: the draft lives in the page only
  }
}

// --- signing in ---

function askForToken(message) {
  signedIn = false;
  closeChat();
  ui.appView.hidden = true;
  ui.forget.hidden = true;
  ui.linkDevice.hidden = true;
  ui.linkPanel.hidden = true;
  showError(ui.pageError, '');
  ui.tokenView.hidden = false;
  ui.tokenInput.value = '';
  showError(ui.tokenError, message);
  ui.tokenInput.setAttribute('aria-invalid', message ? 'true' : 'false');
  ui.tokenInput.focus();
}

api.hooks.onUnauthorized = (error) => {
  api.token.forget();
  askForToken(`The broker did not accept the token: ${error.message} Enter it again.`);
};

ui.tokenForm.addEventListener('submit', async (event) => {
  event.preventDefault();
  const value = ui.tokenInput.value.trim();
  if (!value) {
    showError(ui.tokenError, 'Enter the owner token to continue.');
    ui.tokenInput.focus();
    return;
  }
  ui.tokenSubmit.disabled = true;
  showError(ui.tokenError, '');
  api.token.set(value);
  try {
    await api.request('GET', '/v1/sessions?limit=1');
  } catch (error) {
    if (error.status !== 401) {
      // Not a refusal of the token, but nothing works without the broker.
      api.token.forget();
      showError(ui.tokenError, error.message);
    }
    return; // a 401 already asked again, with the broker's words
  } finally {
    ui.tokenSubmit.disabled = false;
  }
  ui.tokenInput.value = '';
  start();
});

ui.forget.addEventListener('click', () => {
  api.token.forget();
  askForToken('');
});

function start() {
  signedIn = true;
  ui.tokenView.hidden = true;
  ui.appView.hidden = false;
  ui.forget.hidden = false;
  // Only the owner token may sign in another device.
  ui.linkDevice.hidden = api.token.isDevice();
  refreshSessions();
  route();
}

// --- the session list ---

async function refreshSessions() {
  ui.refresh.disabled = true;
  ui.sessionsNote.textContent = 'Loading sessions…';
  try {
    const { sessions: list, truncated } = await api.listSessions({ state: ui.stateFilter.value || undefined });
    // Open conversations first, each group newest first (issue 55): the one
    // a person is in is at the top, not under an hour of closed ones.
    const closedLast = (s) => (s.state === 'open' ? 0 : 1);
    sessions = list
      .slice()
      .reverse()
      .sort((a, b) => closedLast(a) - closedLast(b));
    sessionsTruncated = truncated;
    renderSessions();
    markEmptySessions();
    showError(ui.pageError, '');
  } catch (error) {
    if (error.status === 401) return;
    ui.sessionsNote.textContent = '';
    showError(ui.pageError, `Could not list sessions: ${error.message}`);
  } finally {
    ui.refresh.disabled = false;
  }
}

/** Finds the leftovers among the open sessions whose agent is away (one
 * turn read each, for the newest 50), then shows them as empty. */
async function markEmptySessions() {
  const away = sessions.filter((s) => s.state === 'open' && s.agent?.state === 'away').slice(0, 50);
  const found = await Promise.all(
    away.map(async (s) => {
      try {
        const page = await api.listTurns(s.session_id, { limit: 1 });
        return page.turns.length === 0 ? s.session_id : null;
      } catch {
        return null;
      }
    }),
  );
  emptySessions = new Set(found.filter(Boolean));
  if (emptySessions.size > 0) renderSessions();
}

function renderSessions() {
  ui.sessionList.replaceChildren(
    ...sessions.map((s) => sessionItem(s, chat?.id === s.session_id, emptySessions.has(s.session_id))),
  );
  const n = sessions.length;
  const filter = ui.stateFilter.value;
  ui.sessionsNote.textContent =
    (n === 0
      ? `No ${filter ? `${filter} ` : ''}sessions.`
      : `${n} ${filter ? `${filter} ` : ''}session${n === 1 ? '' : 's'}, ${filter ? '' : 'open first, '}newest first.`) +
    (sessionsTruncated ? ' Only the newest are listed.' : '');
}

function updateListedSession(session) {
  // The open chat shows its own messages: no longer a leftover to point at.
  emptySessions.delete(session.session_id);
  const i = sessions.findIndex((s) => s.session_id === session.session_id);
  if (i !== -1) {
    sessions[i] = session;
  } else if (!ui.stateFilter.value || ui.stateFilter.value === session.state) {
    sessions.unshift(session); // opened by its address before the list knew it
  }
  renderSessions();
}

ui.refresh.addEventListener('click', refreshSessions);
ui.stateFilter.addEventListener('change', refreshSessions);

// --- routing: #/s/<session id> opens a chat; anything else shows the list ---

function route() {
  if (!signedIn) return;
  const match = /^#\/s\/(.+)$/.exec(location.hash);
  if (match) {
    openChat(decodeURIComponent(match[1]));
  } else {
    const wasOpen = chat !== null;
    closeChat();
    ui.appView.dataset.view = 'list';
    show(ui.chat, false);
    show(ui.chatEmpty, true);
    renderSessions();
    if (wasOpen) refreshSessions();
  }
}

window.addEventListener('hashchange', () => (linkCode() ? signInWithLink(linkCode()) : route()));

// --- signing in a device with a link (WEB.md "Signing in a phone") ---

/** The owner makes a one-time link for another device and sees it here. */
ui.linkDevice.addEventListener('click', async () => {
  ui.linkDevice.disabled = true;
  showError(ui.linkError, '');
  try {
    const { data } = await api.request('POST', '/v1/devices/links');
    ui.linkUrl.textContent = `${location.origin}/#link=${data.code}`;
    ui.linkExpiry.textContent = `Good once, until ${new Date(data.expires_at).toLocaleTimeString()}.`;
    ui.linkPanel.hidden = false;
    ui.linkCopy.focus();
  } catch (error) {
    if (error.status !== 401) {
      ui.linkPanel.hidden = false;
      showError(ui.linkError, `No link: ${error.message}`);
    }
  } finally {
    ui.linkDevice.disabled = false;
  }
});

ui.linkCopy.addEventListener('click', async () => {
  try {
    await navigator.clipboard.writeText(ui.linkUrl.textContent);
    announce('The sign-in link is copied.');
  } catch {
    announce('Copying was refused: select the link and copy it.');
  }
});

ui.linkDone.addEventListener('click', () => {
  ui.linkPanel.hidden = true;
  ui.linkUrl.textContent = '';
  ui.linkDevice.focus();
});

/** The code of a sign-in link (`#link=<code>`), if the address holds one. */
function linkCode() {
  const match = /^#link=([0-9A-Za-z]{1,64})$/.exec(location.hash);
  return match ? match[1] : null;
}

/** Trades the link's code for this device's own credential, once; the code
 * leaves the address bar and the history first. */
async function signInWithLink(code) {
  history.replaceState(null, '', `${location.pathname}${location.search}`);
  closeChat();
  ui.appView.hidden = true;
  ui.tokenView.hidden = false;
  showError(ui.tokenError, '');
  ui.tokenSubmit.disabled = true;
  announce('Signing this device in…');
  try {
    const device = await api.signInDevice(code, api.deviceName());
    api.token.forget();
    api.token.setDevice(device.token);
    announce(`Signed in as “${device.name}”.`);
    start();
  } catch (error) {
    askForToken(`Could not sign in: ${error.message}`);
  } finally {
    ui.tokenSubmit.disabled = false;
  }
}

// --- one open chat ---

function closeChat() {
  if (!chat) return;
  chat.disposed = true;
  chat.permissions.disposed = true;
  chat.stream?.close();
  clearInterval(chat.pollTimer);
  chat = null;
  attention.setTitle(PAGE_TITLE);
}

function openChat(sessionId) {
  if (chat?.id === sessionId) return;
  closeChat();
  const draft = loadDraft(sessionId);
  chat = {
    id: sessionId,
    disposed: false,
    session: null,
    turns: new Map(), // turn_id -> turn
    reads: new Map(), // turn_id -> latest read number (latest read wins)
    released: loadReleased(sessionId), // turn_id -> {count, at, claimedAt}: hand-backs seen in this tab
    rendered: new Map(), // turn_id -> what its shown rendering was made from
    hasMore: false, // older turns exist before the oldest shown
    stream: null,
    live: 'connecting', // connecting | live | down | unavailable | closed
    pollTick: 0,
    pollTimer: null,
    polling: false,
    sending: false,
    pending: draft.id ? { text: draft.text, id: draft.id } : null, // the composed message's id
    files: [], // File objects to send with the next message
    permissions: null,
    loadingOlder: false,
    changes: null, // the latest report of the working tree, or null
    turnChanges: new Map(), // turn_id -> what its tools changed
  };
  chat.permissions = new PermissionCards(sessionId, {
    transcript: ui.transcript,
    pinned: ui.pinned,
    announce,
    onPending: (n) => showAsking(n),
  });
  ui.appView.dataset.view = 'chat';
  show(ui.chatEmpty, false);
  show(ui.chat, true);
  ui.heading.textContent = 'Loading…';
  showSessionMenu(false);
  ui.chatState.replaceChildren();
  ui.facts.replaceChildren();
  ui.capabilities.replaceChildren();
  ui.transcript.replaceChildren();
  ui.pinned.replaceChildren();
  showAsking(0);
  show(ui.transcriptEmpty, false);
  show(ui.loadOlder, false);
  showError(ui.sendError, '');
  ui.text.value = draft.text;
  renderFiles(chat);
  // Nothing can be sent until the session is known to be open.
  show(ui.closedNote, false);
  show(ui.closeSession, false);
  show(ui.closePanel, false);
  show(ui.larkPair, false);
  show(ui.pairPanel, false);
  showError(ui.pairError, '');
  show(ui.larkLink, false);
  showError(ui.larkLinkError, '');
  showChanges(false);
  ui.changesSummary.replaceChildren();
  ui.text.disabled = true;
  ui.send.disabled = true;
  ui.composer.classList.remove('composer-closed');
  setLive(chat, 'connecting', 'Live updates: connecting…');
  renderSessions();
  loadChat(chat);
}

async function loadChat(c) {
  try {
    const [session, page] = await Promise.all([api.getSession(c.id), api.listTurns(c.id, { limit: PAGE_SIZE })]);
    if (c.disposed) return;
    applySession(c, session);
    c.hasMore = page.has_more;
    for (const turn of page.turns) upsertTurn(c, turn, { quiet: true });
    await c.permissions.load();
    if (c.disposed) return;
    loadLarkLink(c);
    refreshChanges(c);
    renderPaging(c);
    scrollToBottom();
    if (session.state === 'open') {
      ui.text.focus();
      connectStream(c);
    } else {
      ui.heading.focus();
    }
    c.pollTimer = setInterval(() => pollTick(c), POLL_MS);
    showError(ui.pageError, '');
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    ui.heading.textContent = 'Session unavailable';
    setLive(c, 'down', '');
    showError(ui.pageError, `Could not open the session: ${error.message}`);
  }
}

/** On a phone the session's header is one line; "More" opens the rest
 * (close, pair, capabilities, details). Wider screens always show it all. */
function showSessionMenu(open) {
  ui.chatHead.toggleAttribute('data-open', open);
  ui.sessionMenu.setAttribute('aria-expanded', String(open));
  ui.sessionMenu.textContent = open ? 'Less' : 'More';
}

ui.sessionMenu.addEventListener('click', () => showSessionMenu(!ui.chatHead.hasAttribute('data-open')));

/** "waiting for you" while any request waits for the person (the agent's
 * `asking`, derived here from the pending requests), and their pinned list. */
function showAsking(n) {
  show(ui.chatAsking, n > 0);
  show(ui.needsYou, n > 0);
  ui.chat.toggleAttribute('data-asking', n > 0);
  ui.chatAsking.dataset.pending = String(n);
  ui.needsYouHeading.textContent = n === 1 ? 'The agent waits for you' : `The agent waits for you (${n} requests)`;
}

/** How to bring back an agent that is away (it may have exited): messages
 * wait for it (HOOKS.md "The terminal's real life"). */
const RESUME = {
  'claude-code': '“claude --resume”',
  'codex-cli': '“codex resume”',
};

/** How a message sent now reaches the agent (the presence's `delivery`). */
function deliveryNote(agent, hostSurface) {
  if (agent?.state === 'away' && RESUME[hostSurface]) {
    return `; messages wait for the agent (if it exited: ${RESUME[hostSurface]}, or start it in the same pane)`;
  }
  switch (agent?.delivery) {
    case 'typed_now':
      return '; a message sent now is typed in at once';
    case 'end_of_turn':
      return '; a message sent now arrives when its current turn ends';
    case 'later':
      return '; a message sent now waits until the agent is back at work';
    default:
      return '';
  }
}

function applySession(c, session) {
  const wasOpen = c.session?.state === 'open';
  c.session = session;
  ui.heading.textContent = sessionName(session);
  attention.setTitle(`${sessionName(session)} · LoopX chat`);
  ui.chatState.replaceChildren(
    stateBadge(session.state),
    ' ',
    agentBadge(session.agent),
    ' ',
    // How messages travel is a detail: on a phone it waits behind "More".
    el(
      'span',
      { class: 'delivery' },
      session.state === 'open' ? `Messages go to the agent in order${deliveryNote(session.agent, session.host_surface)}.` : 'Read-only.',
    ),
  );
  ui.facts.replaceChildren(
    ...sessionFacts(session),
    el('dt', { text: 'Capabilities' }),
    el('dd', {}, capabilityList(session.capabilities)),
  );
  // What the session cannot do stays in sight; the rest is in the details.
  ui.capabilities.replaceChildren(capabilityList(session.capabilities, { compact: true }));
  const closed = session.state !== 'open';
  if (closed && session.continued_in && wasOpen) {
    followContinuation(c, session.continued_in);
    return;
  }
  showContinuation(session);
  show(ui.closedNote, closed && !session.continued_in);
  show(ui.closeSession, !closed && ui.closePanel.hidden);
  if (closed) show(ui.closePanel, false);
  show(ui.larkPair, !closed && ui.pairPanel.hidden);
  if (closed) show(ui.pairPanel, false);
  if (closed) show(ui.larkLink, false);
  ui.text.disabled = closed;
  ui.send.disabled = closed || c.sending;
  ui.composer.classList.toggle('composer-closed', closed);
  if (closed) {
    c.stream?.close();
    c.stream = null;
    setLive(c, 'closed', 'Live updates: none, the session is closed.');
    if (wasOpen) announce('This session was closed. It is now read-only.');
  }
  updateListedSession(session);
}

// --- one conversation per terminal (HOOKS.md "The terminal's real life") ---

/** The session this page shows went on in another (`/clear`, a restart at
 * the agent's terminal): the page goes there, the draft with it. */
function followContinuation(c, nextId) {
  const draft = loadDraft(c.id);
  if (draft.text && !loadDraft(nextId).text) saveDraft(nextId, { text: draft.text, id: null });
  saveDraft(c.id, { text: '', id: null });
  announce('The agent started a new session at its terminal (after /clear or a restart): this conversation goes on there.');
  location.replace(`#/s/${encodeURIComponent(nextId)}`);
}

/** Where the conversation went on, or came from. */
function showContinuation(session) {
  const link = (id, text) => el('a', { href: `#/s/${encodeURIComponent(id)}`, text });
  if (session.continued_in) {
    ui.continuedNote.replaceChildren(
      'Continued after /clear or a restart at the terminal: ',
      link(session.continued_in, 'the conversation goes on here'),
      '. This part is read-only.',
    );
  } else if (session.continued_from) {
    ui.continuedNote.replaceChildren(
      'Continued after /clear or a restart at the terminal (',
      link(session.continued_from, 'earlier messages'),
      ').',
    );
  }
  show(ui.continuedNote, Boolean(session.continued_in || session.continued_from));
}

// --- closing the session ---

function openClosePanel() {
  show(ui.closeProblem, false);
  show(ui.closeRelease, false);
  show(ui.closeConfirm, true);
  showError(ui.closeError, '');
  show(ui.closeSession, false);
  show(ui.closePanel, true);
  ui.closeConfirm.focus();
}

function hideClosePanel() {
  show(ui.closePanel, false);
  show(ui.closeSession, chat?.session?.state === 'open');
  ui.closeSession.focus();
}

/** Closes the open chat's session. Refused with `claim_active` (the agent
 * holds a message it has not answered), it says so and offers to release
 * that message and close in one step. */
async function closeSession(releaseActiveClaim) {
  const c = chat;
  if (!c) return;
  ui.closeConfirm.disabled = true;
  ui.closeRelease.disabled = true;
  try {
    const session = await api.closeSession(c.id, releaseActiveClaim);
    if (c.disposed) return;
    show(ui.closePanel, false);
    applySession(c, session);
    announce('The session is closed.');
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    if (error.code === 'claim_active') {
      const at = error.body?.error?.claimed_at;
      const since = at ? ` at ${new Date(at).toLocaleTimeString()}` : '';
      ui.closeProblem.textContent =
        `The agent holds a message it has not answered yet (delivered${since}), so the session cannot simply ` +
        'be closed: the agent may still be working on it. If the agent is gone or stuck, release that message ' +
        'and close: it is cancelled with any message still waiting, and a late answer from the agent is refused.';
      show(ui.closeProblem, true);
      show(ui.closeConfirm, false);
      show(ui.closeRelease, true);
      ui.closeRelease.focus();
    } else {
      showError(ui.closeError, `Could not close the session: ${error.message}`);
    }
  } finally {
    ui.closeConfirm.disabled = false;
    ui.closeRelease.disabled = false;
  }
}

ui.closeSession.addEventListener('click', openClosePanel);
ui.closeCancel.addEventListener('click', hideClosePanel);
ui.closeConfirm.addEventListener('click', () => closeSession(false));
ui.closeRelease.addEventListener('click', () => closeSession(true));

// --- pairing a Lark chat ---

/** Asks the broker for a pairing code and shows the `/link <code>` line to
 * send the bot; the code is good once, for ten minutes. */
async function pairLark() {
  const c = chat;
  if (!c) return;
  ui.larkPair.disabled = true;
  ui.pairAgain.disabled = true;
  showError(ui.pairError, '');
  try {
    const made = await api.larkPairCode(c.id);
    if (c.disposed) return;
    ui.pairCommand.textContent = made.command;
    ui.pairExpiry.textContent =
      `Good for one link until ${new Date(made.expires_at).toLocaleTimeString()}. ` +
      'A chat may hold several sessions: /list shows them, /use N picks the one plain messages go to.';
    show(ui.larkPair, false);
    show(ui.pairPanel, true);
    announce(`Pairing code ready: ${made.command}`);
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    showError(ui.pairError, `Could not make a pairing code: ${error.message}`);
  } finally {
    ui.larkPair.disabled = false;
    ui.pairAgain.disabled = false;
  }
}

function hidePairPanel() {
  show(ui.pairPanel, false);
  show(ui.larkPair, chat?.session?.state === 'open');
  ui.larkPair.focus();
  // The code may have been used meanwhile: show the chat it linked.
  if (chat) loadLarkLink(chat);
}

// --- the linked Lark chat: its approvers, and whether it gets terminal turns ---

/** Reads the session's Lark link and shows it (nothing when none). */
async function loadLarkLink(c) {
  try {
    const link = await api.getLarkLink(c.id);
    if (c.disposed) return;
    renderLarkLink(c, link);
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    showError(ui.larkLinkError, `Could not read the Lark link: ${error.message}`);
  }
}

function renderLarkLink(c, link) {
  c.larkLink = link;
  const linked = Boolean(link.chat_id) && c.session?.state === 'open';
  show(ui.larkLink, linked);
  if (!linked) return;
  ui.larkLinkChat.replaceChildren(
    'Linked to the Lark chat ',
    el('code', { text: link.chat_id }),
    link.approvers.length ? '. Who may answer permission requests there:' : '.',
  );
  show(ui.larkApproversNone, link.approvers.length === 0);
  ui.larkApprovers.replaceChildren(
    ...link.approvers.map((approver) => {
      const remove = el('button', {
        type: 'button',
        class: 'quiet',
        text: 'Remove',
        'aria-label': `Remove approver ${approver}`,
      });
      remove.addEventListener('click', () =>
        relinkLark(c, { approvers: link.approvers.filter((a) => a !== approver) }),
      );
      return el('li', {}, el('code', { text: approver }), ' ', remove);
    }),
  );
  ui.larkTerminal.checked = link.terminal_turns;
}

/** Links the same chat again with `change` applied (the whole approver list
 * and the terminal option, as the link route replaces both). */
async function relinkLark(c, change) {
  const link = c.larkLink;
  if (!link?.chat_id) return;
  showError(ui.larkLinkError, '');
  ui.larkTerminal.disabled = true;
  try {
    const body = { chat_id: link.chat_id, approvers: link.approvers, terminal_turns: link.terminal_turns, ...change };
    const saved = await api.putLarkLink(c.id, body);
    if (c.disposed) return;
    renderLarkLink(c, saved);
    announce('Lark link saved.');
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    showError(ui.larkLinkError, `Could not change the Lark link: ${error.message}`);
    renderLarkLink(c, link);
  } finally {
    ui.larkTerminal.disabled = false;
  }
}

ui.larkTerminal.addEventListener('change', () => {
  if (chat) relinkLark(chat, { terminal_turns: ui.larkTerminal.checked });
});

ui.larkPair.addEventListener('click', pairLark);
ui.pairAgain.addEventListener('click', pairLark);
ui.pairDone.addEventListener('click', hidePairPanel);

// --- the transcript ---

function isNearBottom() {
  const s = ui.scroll;
  return s.scrollHeight - s.scrollTop - s.clientHeight < 80;
}

function scrollToBottom() {
  ui.scroll.scrollTop = ui.scroll.scrollHeight;
}

function oldestSeq(c) {
  let min = Infinity;
  for (const t of c.turns.values()) min = Math.min(min, t.seq);
  return min;
}

function newestSeq(c) {
  let max = 0;
  for (const t of c.turns.values()) max = Math.max(max, t.seq);
  return max;
}

/**
 * Puts a turn into the transcript, replacing its earlier rendering in place.
 * A turn older than the oldest shown, while older pages are not loaded yet,
 * waits for "load older" instead of appearing out of place.
 */
function upsertTurn(c, turn, { quiet = false } = {}) {
  if (c.disposed || (turn.session_id !== undefined && turn.session_id !== c.id)) return;
  const before = c.turns.get(turn.turn_id);
  if (!before && c.hasMore && c.turns.size > 0 && turn.seq < oldestSeq(c)) return;
  const stick = isNearBottom();
  c.turns.set(turn.turn_id, turn);
  // The turn itself does not record a release: a claimed turn seen queued
  // again was handed back (the stream also says so, see connectStream).
  if (before?.state === 'claimed' && turn.state === 'queued') noteReleased(c, turn.turn_id, before.claimed_at);
  if ((turn.state === 'completed' || turn.state === 'cancelled') && c.released.delete(turn.turn_id)) saveReleased(c);
  const released = c.released.get(turn.turn_id);
  // Re-reads mostly bring back what is shown: then the answer is not
  // rendered again (which would also reset its code blocks' scroll).
  const key = `${released?.count ?? 0} ${JSON.stringify(turn)}`;
  const existing = document.getElementById(`turn-${turn.turn_id}`);
  if (existing && c.rendered.get(turn.turn_id) === key) return;
  c.rendered.set(turn.turn_id, key);
  const node = turnItem(turn, { released });
  if (existing) {
    existing.replaceWith(node);
  } else {
    const next = [...ui.transcript.children].find((li) => Number(li.dataset.seq) > turn.seq);
    ui.transcript.insertBefore(node, next || null);
  }
  decorateTurn(c, turn.turn_id);
  // The hooks report what the turn changed before it is answered.
  if (!quiet && turn.state === 'completed' && before?.state !== 'completed') refreshChanges(c);
  show(ui.transcriptEmpty, c.turns.size === 0);
  if (stick) scrollToBottom();
  // A turn first seen already answered (enqueued elsewhere and answered
  // before the page read it) is a new answer too.
  if (!quiet && before?.state !== turn.state && (before || turn.state === 'completed')) {
    if (turn.state === 'completed' && turn.response) {
      const words = plainText(turn.response.message);
      announce(`The agent answered message ${turn.seq}: ${words}`);
      attention.answered(sessionName(c.session), words);
    } else if (turn.state === 'queued' && before?.state === 'claimed') {
      announce(`The agent released message ${turn.seq}; it is back in the queue.`);
    } else if (turn.state === 'cancelled') {
      announce(`Message ${turn.seq} was cancelled.`);
    }
  }
}

// --- what the agent changed ---

/** Reads the latest report again: the open view and the answered turns. */
async function refreshChanges(c) {
  try {
    const changes = await loadChanges(c.id);
    if (c.disposed) return;
    c.changes = changes;
    c.turnChanges = new Map((changes?.turns ?? []).map((t) => [t.turn_id, t]));
    for (const turnId of c.turns.keys()) decorateTurn(c, turnId);
    ui.changesSummary.replaceChildren(...changesSummary(changes, (path) => openFile(c, path)));
    showError(ui.changesError, '');
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    showError(ui.changesError, `Could not read the changes: ${error.message}`);
  }
}

/** "3 files changed (+40 −12)" under an answered turn whose tools wrote files. */
function decorateTurn(c, turnId) {
  const item = document.getElementById(`turn-${turnId}`);
  if (!item) return;
  item.querySelector(':scope > .turn-changes')?.remove();
  const turn = c.turns.get(turnId);
  const node = turn?.state === 'completed' ? turnChanges(c.turnChanges.get(turnId)) : null;
  if (node) item.append(node);
}

/** The Changes view instead of the transcript, or back. */
function showChanges(open) {
  show(ui.changesView, open);
  ui.chat.toggleAttribute('data-changes', open);
  ui.changesToggle.setAttribute('aria-expanded', String(open));
  if (!open) {
    show(ui.changesDiff, false);
    ui.changesDiff.replaceChildren();
  }
}

async function openFile(c, path) {
  try {
    const file = await loadFile(c.id, path);
    if (c.disposed) return;
    ui.changesDiff.replaceChildren(...diffTable(file));
    show(ui.changesDiff, true);
    ui.changesDiff.scrollIntoView({ block: 'nearest' });
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    showError(ui.changesError, `Could not read the file's diff: ${error.message}`);
  }
}

ui.changesToggle.addEventListener('click', () => {
  if (!chat) return;
  const open = ui.changesView.hidden;
  showChanges(open);
  if (open) {
    refreshChanges(chat);
    ui.changesHeading.focus();
  }
});
ui.changesRefresh.addEventListener('click', () => chat && refreshChanges(chat));
ui.changesClose.addEventListener('click', () => {
  showChanges(false);
  ui.changesToggle.focus();
});

/** Remembers a hand-back once per claim (the stream and a re-read may both report it). */
function noteReleased(c, turnId, claimedAt) {
  const known = c.released.get(turnId);
  if (known && known.claimedAt === claimedAt) return;
  c.released.set(turnId, { count: (known?.count ?? 0) + 1, at: new Date(api.clock.now()).toISOString(), claimedAt });
  saveReleased(c);
}

// The broker's turn does not say it was released, so the tab keeps what it
// saw (until the turn finishes) to still show it after a reload.
function releasedKey(sessionId) {
  return `loopx.released.${sessionId}`;
}

function loadReleased(sessionId) {
  try {
    const saved = JSON.parse(sessionStorage.getItem(releasedKey(sessionId)) || '{}');
    return new Map(Object.entries(saved).filter(([, r]) => Number.isInteger(r?.count) && typeof r.at === 'string'));
  } catch {
    return new Map(); // damaged: forget it
  }
}

function saveReleased(c) {
  try {
    if (c.released.size) sessionStorage.setItem(releasedKey(c.id), JSON.stringify(Object.fromEntries(c.released)));
    else sessionStorage.removeItem(releasedKey(c.id));
  } catch {
    // storage refused: this page still shows it
  }
}

function sessionName(session) {
  return session ? `${session.goal_id} · ${session.agent_id}` : 'a session';
}

// One clock for every "working on it for …" on the page.
setInterval(() => {
  for (const node of document.querySelectorAll('.elapsed[data-since]')) {
    node.textContent = duration(msSince(node.dataset.since));
  }
}, 250); // a quarter second, so the shown second is never more than that late

function renderPaging(c) {
  show(ui.loadOlder, c.hasMore);
  show(ui.transcriptEmpty, c.turns.size === 0);
}

/** Pages back one page (`before_seq`), keeping what the reader sees in place. */
async function loadOlder() {
  const c = chat;
  if (!c || c.turns.size === 0 || !c.hasMore || c.loadingOlder) return;
  c.loadingOlder = true;
  ui.loadOlder.disabled = true;
  ui.loadOlder.textContent = 'Loading older messages…';
  const heightBefore = ui.scroll.scrollHeight;
  const topBefore = ui.scroll.scrollTop;
  try {
    const page = await api.listTurns(c.id, { beforeSeq: oldestSeq(c), limit: PAGE_SIZE });
    if (c.disposed) return;
    c.hasMore = false; // let the older turns in
    for (const turn of page.turns) upsertTurn(c, turn, { quiet: true });
    c.hasMore = page.has_more;
    renderPaging(c);
    // Keep what the reader was looking at in place.
    ui.scroll.scrollTop = topBefore + (ui.scroll.scrollHeight - heightBefore);
    announce(`Loaded ${page.turns.length} older message${page.turns.length === 1 ? '' : 's'}.`);
    if (!c.hasMore) ui.scroll.focus();
  } catch (error) {
    if (error.status !== 401) showError(ui.pageError, `Could not load older messages: ${error.message}`);
  } finally {
    c.loadingOlder = false;
    ui.loadOlder.disabled = false;
    ui.loadOlder.textContent = 'Load older messages';
  }
}

ui.loadOlder.addEventListener('click', loadOlder);
// Scrolling up near the oldest shown turn pages back by itself (the button
// stays, for the keyboard and for a conversation too short to scroll).
ui.scroll.addEventListener(
  'scroll',
  () => {
    const s = ui.scroll;
    if (chat?.hasMore && s.scrollHeight > s.clientHeight && s.scrollTop < 120) loadOlder();
  },
  { passive: true },
);

/** Re-reads one turn and shows it; the latest read of a turn wins. */
async function refreshTurn(c, turnId) {
  const n = (c.reads.get(turnId) || 0) + 1;
  c.reads.set(turnId, n);
  try {
    const turn = await api.getTurn(c.id, turnId);
    if (c.disposed || c.reads.get(turnId) !== n) return;
    upsertTurn(c, turn);
  } catch (error) {
    if (error.status !== 401 && !c.disposed) showError(ui.pageError, `Could not read a message: ${error.message}`);
  }
}

/**
 * Re-reads what may have changed: every turn from the oldest unfinished one
 * on (or the newest shown), and the session itself.
 */
async function resync(c) {
  let from = newestSeq(c);
  for (const t of c.turns.values()) {
    if (t.state === 'queued' || t.state === 'claimed') from = Math.min(from, t.seq - 1);
  }
  const session = await api.getSession(c.id);
  if (c.disposed) return;
  if (session.state !== c.session?.state) applySession(c, session);
  for (let i = 0; i < 50; i++) {
    const page = await api.listTurns(c.id, { afterSeq: from, limit: 200 });
    if (c.disposed) return;
    for (const turn of page.turns) upsertTurn(c, turn);
    if (!page.has_more || page.turns.length === 0) break;
    from = page.turns[page.turns.length - 1].seq;
  }
  await c.permissions.load();
  renderPaging(c);
}

function hasUnfinished(c) {
  for (const t of c.turns.values()) if (t.state === 'queued' || t.state === 'claimed') return true;
  return false;
}

async function pollTick(c) {
  if (c.disposed || c.polling || c.live === 'live') return;
  if (c.live === 'closed' && !hasUnfinished(c)) return;
  c.pollTick += 1;
  if (!hasUnfinished(c) && c.pollTick % IDLE_POLL_EVERY !== 0) return;
  c.polling = true;
  try {
    await resync(c);
  } catch (error) {
    if (error.status !== 401 && !c.disposed) showError(ui.pageError, `Could not refresh: ${error.message}`);
  } finally {
    c.polling = false;
  }
}

// --- live updates ---

function setLive(c, state, words) {
  c.live = state;
  if (c !== chat) return;
  ui.liveStatus.dataset.live = state;
  ui.liveStatus.textContent = words;
}

function connectStream(c) {
  c.stream = openEventStream({
    url: api.eventsUrl(c.id),
    token: api.token.get(),
    onOpen: ({ resumed }) => {
      if (c.disposed || c.live === 'closed') return;
      setLive(c, 'live', 'Live updates: connected.');
      // A stream without Last-Event-ID starts from now: re-read what may
      // have changed while it was not running.
      if (!resumed) resync(c).catch(() => {});
    },
    onEvent: (event) => {
      if (c.disposed) return;
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return;
      }
      if (event.event === 'turn' && data && typeof data.turn_id === 'string') {
        const known = c.turns.get(data.turn_id);
        if (data.state === 'released' && known) noteReleased(c, data.turn_id, known.claimed_at);
        if (known && known.state === data.state) return;
        refreshTurn(c, data.turn_id);
      } else if (event.event === 'permission' && data && typeof data.request_id === 'string') {
        c.permissions.changed(data.request_id).catch(() => {});
      } else if (event.event === 'agent') {
        api
          .getSession(c.id)
          .then((session) => {
            if (!c.disposed) applySession(c, session);
          })
          .catch(() => {});
      } else if (event.event === 'session') {
        if (data?.state === 'closed') {
          // The broker ends the stream after `closed`: nothing more will come.
          c.stream?.close();
          c.stream = null;
          setLive(c, 'closed', 'Live updates: none, the session is closed.');
        }
        api
          .getSession(c.id)
          .then((session) => {
            if (!c.disposed) applySession(c, session);
            return resync(c);
          })
          .catch(() => {});
      }
    },
    onDown: ({ error, retryInMs, unavailable }) => {
      if (c.disposed || c.live === 'closed') return;
      const seconds = Math.max(1, Math.round(retryInMs / 1000));
      if (unavailable) {
        setLive(
          c,
          'unavailable',
          `Live updates: unavailable (${error.message.replace(/\.$/, '')}). Checking for changes every few seconds instead.`,
        );
      } else {
        setLive(c, 'down', `Live updates: disconnected; reconnecting in ${seconds} s. Checking for changes meanwhile.`);
      }
      c.pollTick = IDLE_POLL_EVERY - 1; // re-read at the next tick
    },
    onUnauthorized: (error) => {
      if (!c.disposed) api.hooks.onUnauthorized(error);
    },
  });
}

// --- sending ---

function byteLength(text) {
  return new TextEncoder().encode(text).length;
}

ui.text.addEventListener('input', () => {
  const c = chat;
  if (!c) return;
  // Editing after a failed send composes a new message: it gets a new id.
  if (c.pending && c.pending.text !== ui.text.value) c.pending = null;
  saveDraft(c.id, { text: ui.text.value, id: c.pending?.id ?? null });
});

ui.text.addEventListener('keydown', (event) => {
  if (event.key === 'Escape') {
    // Leave the composer for the transcript, where arrow keys scroll.
    event.preventDefault();
    ui.scroll.focus();
    return;
  }
  if (event.key !== 'Enter' || event.shiftKey || event.isComposing || event.keyCode === 229) return;
  event.preventDefault();
  ui.composer.requestSubmit();
});

// --- files to send ---

/** Adds files to the next message, refusing (in words) what the broker would. */
function addFiles(c, list) {
  if (!c || c.session?.state !== 'open') return;
  const problems = [];
  for (const file of list) {
    const total = c.files.reduce((sum, f) => sum + f.size, 0);
    if (file.size === 0) problems.push(`${file.name || 'A file'} is empty.`);
    else if (c.files.length >= MAX_FILES) problems.push(`At most ${MAX_FILES} files go with one message.`);
    else if (file.size > MAX_FILE_BYTES) problems.push(`${file.name} is over 20 MiB.`);
    else if (total + file.size > MAX_MESSAGE_FILE_BYTES) problems.push(`${file.name} would take the message over 50 MiB.`);
    else c.files.push(file);
  }
  // Other files make another message: it gets a new id.
  c.pending = null;
  renderFiles(c);
  showError(ui.sendError, [...new Set(problems)].join(' '));
}

function renderFiles(c) {
  ui.fileList.replaceChildren(
    ...c.files.map((file, index) => {
      const remove = el('button', { type: 'button', class: 'quiet file-remove', 'aria-label': `Remove ${file.name}` }, '×');
      remove.addEventListener('click', () => {
        c.files.splice(index, 1);
        c.pending = null;
        renderFiles(c);
        ui.text.focus();
      });
      return el('li', { class: 'file-chip' }, el('span', { text: `${file.name} (${fileSize(file.size)})` }), remove);
    }),
  );
}

ui.attach.addEventListener('click', () => {
  if (chat?.session?.state === 'open') ui.fileInput.click();
});

ui.fileInput.addEventListener('change', () => {
  addFiles(chat, [...ui.fileInput.files]);
  ui.fileInput.value = '';
});

ui.text.addEventListener('paste', (event) => {
  const files = [...(event.clipboardData?.files || [])];
  if (files.length === 0) return;
  event.preventDefault();
  addFiles(chat, files);
});

ui.composer.addEventListener('dragover', (event) => {
  if ([...(event.dataTransfer?.types || [])].includes('Files')) event.preventDefault();
});

ui.composer.addEventListener('drop', (event) => {
  const files = [...(event.dataTransfer?.files || [])];
  if (files.length === 0) return;
  event.preventDefault();
  addFiles(chat, files);
});

ui.composer.addEventListener('submit', async (event) => {
  event.preventDefault();
  const c = chat;
  if (!c || c.sending || c.session?.state !== 'open') return;
  const files = [...c.files];
  const text = ui.text.value.trim() || !files.length ? ui.text.value : `(${files.length} file${files.length > 1 ? 's' : ''} attached)`;
  if (!text.trim()) {
    showError(ui.sendError, 'Write a message first.');
    ui.text.focus();
    return;
  }
  if (byteLength(text) > MAX_TEXT_BYTES) {
    showError(ui.sendError, 'The message is longer than 64 KiB; shorten it to send.');
    return;
  }
  // One id per composed message, reused on every retry of the same text, so
  // the broker never queues it twice.
  if (!c.pending || c.pending.text !== text) c.pending = { text, id: api.newUuid() };
  saveDraft(c.id, { text, id: c.pending.id });
  c.sending = true;
  ui.send.disabled = true;
  ui.send.textContent = 'Sending…';
  ui.text.readOnly = true;
  ui.composer.setAttribute('aria-busy', 'true');
  showError(ui.sendError, '');
  try {
    const receipt = files.length
      ? await api.sendMessageWithFiles(c.id, text, c.pending.id, files)
      : await api.sendMessage(c.id, text, c.pending.id);
    if (c.disposed) return;
    c.pending = null;
    c.files = [];
    renderFiles(c);
    saveDraft(c.id, { text: '', id: null });
    ui.text.value = '';
    // A replayed send may name a turn already shown, perhaps answered: then
    // the re-read below is all it needs.
    if (!c.turns.has(receipt.turn_id)) {
      upsertTurn(
        c,
        {
          turn_id: receipt.turn_id,
          session_id: c.id,
          seq: receipt.seq,
          origin: receipt.origin,
          text,
          state: receipt.state,
          enqueued_at: receipt.enqueued_at,
          claimed_at: null,
          completed_at: null,
          response: null,
          cancel_reason: null,
          attachments: [],
        },
        { quiet: true },
      );
    }
    scrollToBottom();
    refreshTurn(c, receipt.turn_id);
    announce(receipt.duplicate ? 'That message had already been sent; it was not sent twice.' : 'Message sent.');
  } catch (error) {
    if (c.disposed || error.status === 401) return;
    if (error.code === 'session_closed') {
      showError(ui.sendError, `Not sent: ${error.message}`);
      api.getSession(c.id).then((s) => !c.disposed && applySession(c, s)).catch(() => {});
    } else if (error.status === 0 || error.status >= 500 || error.status === 429) {
      showError(ui.sendError, `Not sent yet: ${error.message} Press Send to try again; it will not be sent twice.`);
    } else {
      showError(ui.sendError, `Not sent: ${error.message}`);
    }
  } finally {
    if (!c.disposed) {
      c.sending = false;
      ui.send.textContent = 'Send';
      ui.send.disabled = c.session?.state !== 'open';
      ui.text.readOnly = false;
      ui.composer.removeAttribute('aria-busy');
      if (!ui.text.disabled) ui.text.focus();
    }
  }
});

// --- start ---

// The service worker keeps the page's shell for offline use and lets it be
// installed (sw.js). Where there is none (a plain-HTTP address that is not
// loopback is no secure context), the page works as before.
if ('serviceWorker' in navigator) {
  navigator.serviceWorker.register('/sw.js').catch(() => {});
}

if (linkCode()) signInWithLink(linkCode());
else if (api.token.get()) start();
else askForToken('');
