// What the agent stops to ask, on the chat page (HOOKS.md "Every blocking
// prompt"): a tool's use (Allow / Deny and its "always allow" choices), its
// questions (options, one tap each, or the person's own words) and its plan
// (rendered Markdown; approve with auto-accepted or reviewed edits, or send
// it back with feedback). A pending request is pinned above the composer;
// once settled its card moves into the transcript and says what happened,
// including "answered at the terminal". The broker decides: the first
// answer wins, and a late one re-draws the card from the broker's state.
// Everything from the agent is set as text, except the plan, which only
// markdown.js turns into (sanitized) elements.

import * as api from './api.js';
import { renderMarkdown } from './markdown.js';
import { el, time } from './view.js';

const VIA = { owner: 'the owner (Web page or API)', lark: 'Lark' };
const MODE_WORDS = {
  accept_edits: 'Approved; edits are accepted automatically.',
  default: 'Approved; each edit is reviewed.',
};

/** What the person has picked on a question card so far (kept across re-draws). */
function emptyDraft(request) {
  const questions = request.questions || [];
  return { picked: questions.map(() => new Set()), other: questions.map(() => ''), feedback: null };
}

/** A question's answer from the draft: the person's own words when given,
 * else the chosen labels in the agent's order joined with ", "; '' if none. */
export function answerOf(question, picked, other) {
  if (other.trim()) return other.trim();
  return question.options
    .filter((_, i) => picked.has(i))
    .map((o) => o.label)
    .join(', ');
}

function allAnswers(request, draft) {
  const answers = {};
  (request.questions || []).forEach((q, i) => {
    answers[q.question] = answerOf(q, draft.picked[i], draft.other[i]);
  });
  return answers;
}

const complete = (answers) => Object.values(answers).every((a) => a !== '');

/** "Bash", "2 questions", "a plan": what a request is about, in a few words. */
export function subject(request) {
  if (request.kind === 'question') {
    const n = request.questions?.length || 0;
    return n === 1 ? 'a question' : `${n} questions`;
  }
  if (request.kind === 'plan') return 'a plan';
  return request.tool_name;
}

function title(request) {
  if (request.kind === 'question') return el('p', { class: 'permission-title' }, `The agent asks you ${subject(request)}`);
  if (request.kind === 'plan') return el('p', { class: 'permission-title' }, 'The agent asks you to approve its plan');
  return el('p', { class: 'permission-title' }, 'The agent asks to use ', el('strong', { text: request.tool_name }));
}

/** Settled: who answered, when, and what was chosen. */
function outcome(request) {
  if (request.state === 'pending') return el('p', { class: 'permission-outcome' }, 'Waiting for your answer.');
  if (request.answered_via === 'terminal') {
    return el(
      'p',
      { class: 'permission-outcome permission-terminal' },
      el('span', { class: 'badge badge-terminal', dataset: { permissionState: request.state } }, 'Answered at the terminal'),
      request.answered_at ? [' at ', time(request.answered_at)] : '',
    );
  }
  return el(
    'p',
    { class: 'permission-outcome' },
    el('span', { class: `badge badge-${request.state}`, dataset: { permissionState: request.state } }, request.state),
    request.answered_via ? ` by ${VIA[request.answered_via] || request.answered_via}` : '',
    request.state === 'expired' && !request.answered_via ? ': nobody answered in time' : '',
    request.answered_at ? [' at ', time(request.answered_at)] : '',
  );
}

function chosen(request) {
  const answer = request.answer;
  if (!answer) return null;
  const parts = [];
  if (answer.answers) {
    // In the order the agent asked (the broker keeps them sorted by text).
    const asked = (request.questions || []).map((q) => q.question).filter((q) => q in answer.answers);
    const order = [...asked, ...Object.keys(answer.answers).filter((q) => !asked.includes(q))];
    parts.push(
      el(
        'dl',
        { class: 'permission-answers' },
        order.flatMap((q) => [el('dt', { text: q }), el('dd', { text: answer.answers[q] })]),
      ),
    );
  }
  if (answer.mode) parts.push(el('p', { class: 'permission-chosen', text: MODE_WORDS[answer.mode] || answer.mode }));
  if (Number.isInteger(answer.suggestion)) {
    const label = request.suggestions?.[answer.suggestion]?.label || `choice ${answer.suggestion + 1}`;
    parts.push(el('p', { class: 'permission-chosen' }, 'Chosen: ', el('strong', { text: label })));
  }
  if (answer.message) {
    const lead = request.kind === 'plan' ? 'Sent back to planning: ' : 'Message to the agent: ';
    parts.push(el('p', { class: 'permission-chosen' }, lead, el('q', { text: answer.message })));
  }
  return parts.length ? el('div', { class: 'permission-what', dataset: { chosen: 'yes' } }, parts) : null;
}

function button(text, { cls = '', busy, label = null, onClick, attrs = {} }) {
  const b = el('button', { type: 'button', class: cls, disabled: busy, 'aria-label': label, ...attrs }, text);
  b.addEventListener('click', onClick);
  return b;
}

// --- the three kinds of pending cards ---

function toolBody(request, { busy, send }) {
  const actions = el(
    'div',
    { class: 'permission-actions' },
    button('Allow', { cls: 'allow', busy, attrs: { 'data-behavior': 'allow' }, onClick: () => send({ behavior: 'allow' }) }),
    button('Deny', { cls: 'deny', busy, attrs: { 'data-behavior': 'deny' }, onClick: () => send({ behavior: 'deny' }) }),
  );
  const suggestions = (request.suggestions || []).map((s, i) =>
    button(s.label, {
      cls: 'quiet suggestion',
      busy,
      attrs: { 'data-suggestion': i },
      onClick: () => send({ behavior: 'allow', suggestion: i }),
    }),
  );
  return [actions, suggestions.length ? el('div', { class: 'permission-suggestions' }, suggestions) : null];
}

function questionBody(request, draft, { busy, send }) {
  const sendButton = el('button', { type: 'button', class: 'allow', disabled: true }, 'Send answers');
  const hint = el('p', { class: 'hint', id: `permission-${request.request_id}-hint` });
  const refresh = () => {
    const answers = allAnswers(request, draft);
    const ready = complete(answers);
    sendButton.disabled = busy || !ready;
    const missing = Object.values(answers).filter((a) => a === '').length;
    hint.textContent = ready ? '' : `Answer every question to send (${missing} still open).`;
  };
  sendButton.setAttribute('aria-describedby', hint.id);
  sendButton.addEventListener('click', () => {
    const answers = allAnswers(request, draft);
    if (complete(answers)) send({ behavior: 'allow', answers });
  });
  const fieldsets = (request.questions || []).map((q, qi) => {
    const id = `permission-${request.request_id}-q${qi}`;
    const options = q.options.map((o, oi) => {
      const b = el(
        'button',
        {
          type: 'button',
          class: 'option',
          disabled: busy,
          'aria-pressed': draft.picked[qi].has(oi) ? 'true' : 'false',
          dataset: { option: oi },
        },
        el('span', { class: 'option-label', text: o.label }),
        o.description ? el('span', { class: 'option-description', text: o.description }) : null,
      );
      b.addEventListener('click', () => {
        const picked = draft.picked[qi];
        if (q.multi_select) {
          if (picked.has(oi)) picked.delete(oi);
          else picked.add(oi);
        } else {
          picked.clear();
          picked.add(oi);
        }
        for (const other of b.parentElement.querySelectorAll('button.option')) {
          other.setAttribute('aria-pressed', picked.has(Number(other.dataset.option)) ? 'true' : 'false');
        }
        refresh();
      });
      return b;
    });
    const other = el('input', {
      type: 'text',
      id: `${id}-other`,
      class: 'option-other',
      autocomplete: 'off',
      disabled: busy,
      value: draft.other[qi],
    });
    other.value = draft.other[qi];
    other.addEventListener('input', () => {
      draft.other[qi] = other.value;
      refresh();
    });
    return el(
      'fieldset',
      { class: 'question', dataset: { question: qi, multiSelect: q.multi_select ? 'yes' : 'no' } },
      el(
        'legend',
        {},
        q.header ? [el('span', { class: 'question-header', text: q.header }), ' '] : null,
        el('span', { class: 'question-text', text: q.question }),
      ),
      el('p', { class: 'hint', text: q.multi_select ? 'Choose one or more.' : 'Choose one.' }),
      el('div', { class: 'options', role: 'group', 'aria-label': `Options: ${q.header || q.question}` }, options),
      el(
        'label',
        { class: 'other-label', for: other.id },
        'Other… ',
        el('span', { class: 'visually-hidden', text: `(your own answer to: ${q.question})` }),
      ),
      other,
    );
  });
  refresh();
  return [
    fieldsets,
    el(
      'div',
      { class: 'permission-actions' },
      sendButton,
      button('Dismiss', {
        cls: 'quiet deny',
        busy,
        label: 'Dismiss the questions (deny)',
        onClick: () => send({ behavior: 'deny' }),
      }),
    ),
    hint,
  ];
}

function planBody(request, draft, { busy, send, redraw }) {
  const actions = el(
    'div',
    { class: 'permission-actions' },
    button('Approve, auto-accept edits', {
      cls: 'allow',
      busy,
      onClick: () => send({ behavior: 'allow', mode: 'accept_edits' }),
    }),
    button('Approve, review each edit', {
      cls: 'allow',
      busy,
      onClick: () => send({ behavior: 'allow', mode: 'default' }),
    }),
    draft.feedback === null
      ? button('Keep planning…', {
          cls: 'quiet deny',
          busy,
          onClick: () => {
            draft.feedback = '';
            redraw({ focus: '.plan-feedback textarea' });
          },
        })
      : null,
  );
  let feedback = null;
  if (draft.feedback !== null) {
    const id = `permission-${request.request_id}-feedback`;
    const box = el('textarea', { id, rows: 3, disabled: busy });
    box.value = draft.feedback;
    box.addEventListener('input', () => {
      draft.feedback = box.value;
    });
    feedback = el(
      'div',
      { class: 'plan-feedback' },
      el('label', { for: id }, 'What should the agent change in its plan?'),
      box,
      el(
        'div',
        { class: 'permission-actions' },
        button('Send back to planning', {
          cls: 'deny',
          busy,
          onClick: () => {
            const message = draft.feedback.trim();
            send(message ? { behavior: 'deny', message } : { behavior: 'deny' });
          },
        }),
        button('Cancel', {
          cls: 'quiet',
          busy,
          label: 'Cancel the feedback',
          onClick: () => {
            draft.feedback = null;
            redraw({ focus: 'button.deny' });
          },
        }),
      ),
    );
  }
  return [actions, feedback];
}

/** The plan, rendered from Markdown (sanitized), or the request's own text
 * when the agent sent no plan. Settled: folded away under a summary. */
function planText(request) {
  const body = request.plan
    ? el('div', { class: 'markdown plan-body', tabindex: 0, role: 'region', 'aria-label': 'The plan' }, renderMarkdown(request.plan))
    : el('pre', { class: 'permission-preview', text: request.input_preview || request.description });
  if (request.state === 'pending') return body;
  return el('details', { class: 'plan-settled' }, el('summary', {}, 'The plan'), body);
}

function settledQuestions(request) {
  if (request.answer?.answers) return null; // the answers name them
  return el('ul', { class: 'question-list' }, (request.questions || []).map((q) => el('li', { text: q.question })));
}

/** The card of one request. `send(body)` answers it; `draft` holds what is
 * picked on it so far; `redraw(opts)` draws it again from the draft. */
export function permissionCard(request, { send, redraw = () => {}, draft = emptyDraft(request), busy = false, error = '', note = '' } = {}) {
  const pending = request.state === 'pending';
  const kind = request.kind || 'tool';
  let body = [];
  if (kind === 'question') {
    body = pending ? questionBody(request, draft, { busy, send }) : [settledQuestions(request)];
  } else if (kind === 'plan') {
    body = [planText(request), pending ? planBody(request, draft, { busy, send, redraw }) : null];
  } else {
    body = [
      request.description ? el('p', { class: 'permission-description', text: request.description }) : null,
      request.input_preview ? el('pre', { class: 'permission-preview', text: request.input_preview }) : null,
      pending ? toolBody(request, { busy, send }) : null,
    ];
  }
  return el(
    'li',
    {
      id: `permission-${request.request_id}`,
      class: `permission-card permission-${request.state} permission-kind-${kind}`,
      dataset: { requestId: request.request_id, state: request.state, kind, answeredVia: request.answered_via || '' },
      'aria-label': `${kind === 'tool' ? 'Permission request' : kind === 'plan' ? 'Plan' : 'Questions'} ${request.request_id}: ${subject(request)}`,
      'aria-busy': busy ? 'true' : null,
    },
    title(request),
    body,
    outcome(request),
    pending ? null : chosen(request),
    note ? el('p', { class: 'note', role: 'status', text: note }) : null,
    error ? el('p', { class: 'error', role: 'alert', text: error }) : null,
  );
}

/** The cards of one open chat: pending ones in `pinned` (an <ol> above the
 * composer), settled ones in `transcript` (an <ol>). `onPending(n)` hears
 * how many wait for the person after every change. */
export class PermissionCards {
  constructor(sessionId, { transcript, pinned, announce, onPending = () => {} }) {
    this.sessionId = sessionId;
    this.transcript = transcript;
    this.pinned = pinned;
    this.announce = announce;
    this.onPending = onPending;
    this.requests = new Map(); // request_id -> request
    this.drafts = new Map(); // request_id -> what is picked on its card
    this.reads = new Map(); // request_id -> latest read number
    this.disposed = false;
  }

  pendingCount() {
    let n = 0;
    for (const r of this.requests.values()) if (r.state === 'pending') n += 1;
    return n;
  }

  /** Reads every request again (on load and after the stream reconnects). */
  async load() {
    const requests = await api.listPermissions(this.sessionId);
    if (this.disposed) return;
    // Oldest first, so cards stand in the order they were asked.
    const oldestFirst = [...requests].sort((a, b) => (a.created_at < b.created_at ? -1 : a.created_at > b.created_at ? 1 : 0));
    for (const request of oldestFirst) this.show(request, { quiet: true });
  }

  /** An `event: permission` from the stream: re-read that request. */
  async changed(requestId) {
    const n = (this.reads.get(requestId) || 0) + 1;
    this.reads.set(requestId, n);
    const request = await api.getPermission(this.sessionId, requestId);
    if (this.disposed || this.reads.get(requestId) !== n) return;
    this.show(request);
  }

  draft(request) {
    if (!this.drafts.has(request.request_id)) this.drafts.set(request.request_id, emptyDraft(request));
    return this.drafts.get(request.request_id);
  }

  show(request, { quiet = false, busy = false, error = '', note = '', focus = null } = {}) {
    if (this.disposed) return;
    const before = this.requests.get(request.request_id);
    this.requests.set(request.request_id, request);
    const pending = request.state === 'pending';
    const existing = document.getElementById(`permission-${request.request_id}`);
    // A re-read that brings back what is shown (a reconnect's resync) leaves
    // the card alone: the person may be typing in it.
    const plain = !busy && !error && !note && !focus;
    if (plain && existing && !existing.hasAttribute('aria-busy') && JSON.stringify(before) === JSON.stringify(request)) return;
    if (!pending) this.drafts.delete(request.request_id);
    const card = permissionCard(request, {
      busy,
      error,
      note,
      draft: pending ? this.draft(request) : undefined,
      send: (body) => this.answer(request.request_id, body),
      redraw: (opts) => this.show(this.requests.get(request.request_id), { quiet: true, ...opts }),
    });
    const home = pending ? this.pinned : this.transcript;
    if (existing && existing.parentElement === home) existing.replaceWith(card);
    else {
      existing?.remove();
      // Pinned in the order they were asked (reads may come back in any order).
      const later = pending
        ? [...home.children].find((li) => (this.requests.get(li.dataset.requestId)?.created_at ?? '') > request.created_at)
        : null;
      home.insertBefore(card, later || null);
    }
    if (focus) card.querySelector(focus)?.focus();
    this.onPending(this.pendingCount());
    if (quiet || before?.state === request.state) return;
    if (pending) this.announce(`The agent asks ${request.kind === 'tool' || !request.kind ? `to use ${request.tool_name}` : `you ${subject(request)}`}: see above the message box.`);
    else if (request.answered_via === 'terminal') this.announce(`The request for ${subject(request)} was answered at the terminal.`);
    else this.announce(`Request for ${subject(request)}: ${request.state}.`);
  }

  /** Sends `body` ({behavior, answers?, suggestion?, mode?, message?}). */
  async answer(requestId, body) {
    const request = this.requests.get(requestId);
    this.show(request, { quiet: true, busy: true });
    try {
      this.show(await api.answerPermission(this.sessionId, requestId, body));
    } catch (error) {
      if (this.disposed || error.status === 401) return;
      // Answered elsewhere first (the terminal, Lark) or expired: draw what
      // the broker decided; any other refusal keeps the card answerable.
      const fresh = await api.getPermission(this.sessionId, requestId).catch(() => request);
      if (this.disposed) return;
      if (error.code === 'permission_already_answered' || fresh.state !== 'pending') {
        const note = fresh.answered_via === 'terminal' ? 'Too late: it was answered at the terminal first.' : 'Already answered elsewhere.';
        this.show(fresh, { note });
      } else {
        this.show(fresh, { error: error.message });
      }
    }
  }
}
