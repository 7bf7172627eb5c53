// DOM building for the chat page. Everything that came from the broker is set
// as text (textContent), never parsed as HTML, except an agent's answer,
// which only markdown.js turns into (sanitized) elements.

import { attachmentUrl, clock } from './api.js';
import { renderMarkdown } from './markdown.js';

/** el('p', {class: 'x', dataset: {a: 1}}, 'text', child) */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key === 'text') node.textContent = value;
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function time(iso, { withDate = true } = {}) {
  if (!iso) return null;
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return el('time', { text: iso });
  const today = new Date().toDateString() === date.toDateString();
  const text =
    withDate && !today
      ? date.toLocaleString([], { dateStyle: 'medium', timeStyle: 'short' })
      : date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  return el('time', { datetime: iso, title: date.toLocaleString() }, text);
}

export function words(key) {
  return key.replace(/_/g, ' ');
}

/** "live steering: unavailable" and its kin, one per capability flag. */
export function capabilityList(capabilities, { compact = false } = {}) {
  const entries = Object.entries(capabilities || {});
  const shown = compact ? entries.filter(([, on]) => !on) : entries;
  return el(
    'ul',
    { class: compact ? 'caps caps-compact' : 'caps', 'aria-label': 'Capabilities' },
    shown.map(([key, on]) =>
      el(
        'li',
        { class: on ? 'cap cap-on' : 'cap cap-off', dataset: { capability: key } },
        `${words(key)}: ${on ? 'available' : 'unavailable'}`,
      ),
    ),
  );
}

export function stateBadge(state) {
  return el('span', { class: `badge badge-${state}` }, state);
}

const AGENT_WORDS = {
  working: 'agent working',
  stalled: 'agent stalled',
  waiting: 'agent waiting',
  away: 'agent away',
  // A permission request waits for a person (the list shows it too).
  asking: 'agent asking you',
};

/** Whether the session's agent is there (presence), with since when, and
 * while it works the tool it runs: "agent working · Bash · 3 min 05 s". A
 * stalled agent (no hook event for the broker's --stall-after) says since
 * when: "agent stalled · for 2 min 05 s". */
export function agentBadge(agent) {
  if (!agent || !AGENT_WORDS[agent.state]) return el('span', { class: 'badge badge-agent-away' }, 'agent unknown');
  if (agent.state === 'stalled') {
    return el(
      'span',
      { class: 'badge agent-badge badge-agent-stalled', dataset: { agentState: agent.state }, title: `since ${agent.since}` },
      AGENT_WORDS.stalled,
      ' · for ',
      elapsed(agent.since),
      agent.tool ? ` · last in ${agent.tool}` : null,
    );
  }
  const tool = agent.state === 'working' && agent.tool && agent.tool_since;
  return el(
    'span',
    {
      class: `badge agent-badge badge-agent-${agent.state}`,
      dataset: tool ? { agentState: agent.state, tool: agent.tool } : { agentState: agent.state },
      title: `since ${agent.since}`,
    },
    AGENT_WORDS[agent.state],
    ...(tool ? [` · ${agent.tool} · `, elapsed(agent.tool_since)] : []),
  );
}

/** One entry of the session list: a link that opens the chat. `empty`: an
 * open session whose agent is away and that never got a message (a leftover,
 * such as a health check's bind), marked so the live session stands out. */
export function sessionItem(session, current, empty = false) {
  const link = el(
    'a',
    {
      class: 'session-link',
      href: `#/s/${encodeURIComponent(session.session_id)}`,
      'aria-current': current ? 'page' : null,
      dataset: { sessionId: session.session_id, state: session.state },
    },
    el(
      'span',
      { class: 'session-title' },
      el('strong', { text: session.goal_id }),
      ' · ',
      el('span', { text: session.agent_id }),
    ),
    el(
      'span',
      { class: 'session-sub muted' },
      `${session.host_surface} · executor ${session.executor_endpoint_id}`,
    ),
    el('span', { class: 'session-id muted', text: session.session_id }),
    el(
      'span',
      { class: 'session-meta' },
      stateBadge(session.state),
      ' ',
      agentBadge(session.agent),
      ' ',
      empty
        ? el('span', { class: 'badge badge-empty', title: 'No message was ever sent here: likely a leftover.' }, 'empty')
        : null,
      empty ? ' ' : null,
      time(session.created_at),
    ),
    capabilityList(session.capabilities, { compact: true }),
  );
  return el('li', { class: 'session-item' }, link);
}

/** The facts shown at the top of an open chat (all content-free). */
export function sessionFacts(session) {
  const rows = [
    ['Session', session.session_id],
    ['Host', `${session.host_surface}, executor ${session.executor_endpoint_id}`],
    ['Opened', time(session.created_at)],
    ['Agent', agentBadge(session.agent)],
  ];
  if (session.closed_at) rows.push(['Closed', time(session.closed_at)]);
  return rows.flatMap(([term, value]) => [el('dt', { text: term }), el('dd', {}, value)]);
}

function originWords(origin) {
  if (origin === 'web') return 'You, from the Web chat';
  if (origin === 'lark') return 'From Lark';
  if (origin === 'terminal') return 'At the terminal';
  return `From ${origin}`;
}

/** Milliseconds from `iso` to `now` (the broker's clock), never negative. */
export function msSince(iso, now = clock.now()) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? 0 : Math.max(0, now - t);
}

/** "4 s", "2 min 05 s", "1 h 03 min". */
export function duration(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, '0')} min`;
}

/** A running clock since `iso`; app.js refreshes every `.elapsed` once a second. */
export function elapsed(iso) {
  return el('span', { class: 'elapsed', dataset: { since: iso } }, duration(msSince(iso)));
}

const STEPS = [
  ['queued', 'Queued'],
  ['claimed', 'Delivered to the agent'],
  ['completed', 'Answered'],
];

/** Queued → delivered to the agent → answered, the current step marked. */
function progress(state) {
  const at = STEPS.findIndex(([s]) => s === state);
  return el(
    'ol',
    { class: 'turn-steps', 'aria-label': 'Progress' },
    STEPS.map(([step, words], i) =>
      el(
        'li',
        {
          class: i < at ? 'step step-done' : i === at ? 'step step-current' : 'step step-todo',
          'aria-current': i === at ? 'step' : null,
          dataset: { step },
        },
        words,
      ),
    ),
  );
}

/**
 * What is happening to a turn, in words. `released`: the page saw the agent
 * hand this turn back ({count, at}), which the turn itself does not record.
 */
function stateWords(turn, released) {
  switch (turn.state) {
    case 'queued':
      return released
        ? [
            'Released by the agent',
            released.at ? [' at ', time(released.at)] : null,
            released.count > 1 ? ` (${released.count} times)` : null,
            ': back in the queue, waiting for the agent',
          ]
        : 'waiting for the agent';
    case 'claimed':
      if (turn.origin === 'terminal') {
        return ['the agent is working on it', turn.claimed_at ? [' for ', elapsed(turn.claimed_at)] : null];
      }
      return [
        released ? 'Delivered to the agent again' : 'Delivered to the agent',
        turn.claimed_at ? ['; working on it for ', elapsed(turn.claimed_at)] : null,
      ];
    case 'completed':
      return turn.claimed_at && turn.completed_at
        ? ['answered in ', duration(msSince(turn.claimed_at, Date.parse(turn.completed_at)))]
        : 'answered';
    case 'cancelled':
      if (turn.cancel_reason === 'interrupted') return 'interrupted at the terminal before the agent answered';
      if (turn.cancel_reason === 'unanswered') return 'the agent gave no answer (a new prompt came first)';
      return turn.cancel_reason === 'session_closed'
        ? 'the session was closed before the agent answered'
        : 'not answered';
    default:
      return turn.state;
  }
}

/** A size for people: 512 B, 12 KB, 3.4 MB. */
export function fileSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${Math.ceil(bytes / 1024)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

/**
 * A turn's files: an image as a thumbnail (its bytes fetched with the token
 * and shown from a blob: URL), anything else as a link that downloads it.
 */
function attachmentList(attachments) {
  if (!Array.isArray(attachments) || attachments.length === 0) return null;
  return el(
    'ul',
    { class: 'attachments' },
    attachments.map((a) => {
      const label = `${a.name} (${a.content_type}, ${fileSize(a.size)})`;
      if (a.content_type.startsWith('image/')) {
        const img = el('img', { class: 'thumb', alt: a.name, title: label, width: 160 });
        attachmentUrl(a.download)
          .then((url) => {
            img.src = url;
          })
          .catch(() => img.replaceWith(el('span', { class: 'attachment-missing', text: `${a.name} could not be shown` })));
        return el('li', { class: 'attachment attachment-image' }, img);
      }
      const link = el('a', { class: 'attachment-link', href: '#', download: a.name, text: label });
      link.addEventListener('click', async (event) => {
        if (link.getAttribute('href') !== '#') return; // fetched: the browser downloads it
        event.preventDefault();
        try {
          link.href = await attachmentUrl(a.download);
          link.click();
        } catch {
          link.textContent = `${label}: could not be downloaded`;
        }
      });
      return el('li', { class: 'attachment attachment-file' }, link);
    }),
  );
}

/** One turn: the message, its progress, and the agent's answer once there. */
export function turnItem(turn, { released = null } = {}) {
  const state = turn.state;
  const unfinished = state === 'queued' || state === 'claimed';
  const stateLine = el(
    'div',
    { class: `turn-state state-${state}`, dataset: released ? { released: released.count } : {} },
    unfinished ? progress(state) : null,
    el('p', { class: 'state-line' }, stateBadge(state), ' ', el('span', { class: 'state-words' }, stateWords(turn, released))),
  );
  const message = el(
    'div',
    { class: 'bubble bubble-user' },
    el(
      'p',
      { class: 'bubble-meta' },
      el('span', { class: 'who' }, originWords(turn.origin)),
      ` · #${turn.seq} · `,
      time(turn.enqueued_at),
    ),
    el('p', { class: 'bubble-text', text: turn.text }),
    attachmentList(turn.attachments),
  );
  let answer = null;
  const response = turn.response;
  if (response && typeof response === 'object') {
    const extra = Object.keys(response).filter((k) => k !== 'message');
    answer = el(
      'div',
      { class: 'bubble bubble-agent' },
      el(
        'p',
        { class: 'bubble-meta' },
        el('span', { class: 'who' }, 'Agent'),
        turn.completed_at ? [' · ', time(turn.completed_at)] : null,
      ),
      el('div', { class: 'markdown response-message' }, renderMarkdown(response.message ?? '')),
      extra.length
        ? el(
            'details',
            { class: 'response-details' },
            el('summary', {}, 'Response details'),
            el('pre', {
              text: JSON.stringify(Object.fromEntries(extra.map((k) => [k, response[k]])), null, 2),
            }),
          )
        : null,
    );
  }
  const reply = turn.reply
    ? el(
        'p',
        { class: `reply reply-${turn.reply.state}` },
        `Lark reply: ${turn.reply.state}`,
        turn.reply.attempts ? ` after ${turn.reply.attempts} attempt(s)` : '',
        turn.reply.error ? ` (${turn.reply.error})` : '',
      )
    : null;
  return el(
    'li',
    {
      class: `turn turn-${state}`,
      id: `turn-${turn.turn_id}`,
      dataset: { turnId: turn.turn_id, seq: turn.seq, state },
    },
    message,
    stateLine,
    answer,
    reply,
  );
}
