// Permission requests on the chat page: each of the agent's tool-approval
// requests is a card in the transcript (tool, description, the input preview
// as preformatted text, never HTML) with Allow / Deny while pending; it
// updates live when answered anywhere (here, the API, Lark) and says who
// answered. The broker decides: the first answer wins, a late one is told so.

import * as api from './api.js';
import { el, time } from './view.js';

const VIA = { owner: 'the owner (Web page or API)', lark: 'Lark' };

/** The card of one request. `onAnswer(behavior)` sends an answer. */
export function permissionCard(request, { onAnswer, busy = false, error = '' } = {}) {
  const pending = request.state === 'pending';
  const outcome = pending
    ? el('p', { class: 'permission-outcome' }, 'Waiting for your answer.')
    : el(
        'p',
        { class: 'permission-outcome' },
        el('span', { class: `badge badge-${request.state}`, dataset: { permissionState: request.state } }, request.state),
        request.answered_via ? ` by ${VIA[request.answered_via] || request.answered_via}` : '',
        request.answered_at ? [' at ', time(request.answered_at)] : '',
      );
  const actions = pending
    ? el(
        'div',
        { class: 'permission-actions' },
        el('button', { type: 'button', class: 'allow', disabled: busy, dataset: { behavior: 'allow' } }, 'Allow'),
        el('button', { type: 'button', class: 'deny', disabled: busy, dataset: { behavior: 'deny' } }, 'Deny'),
      )
    : null;
  const card = el(
    'li',
    {
      id: `permission-${request.request_id}`,
      class: `permission-card permission-${request.state}`,
      dataset: { requestId: request.request_id, state: request.state },
      'aria-label': `Permission request ${request.request_id}: ${request.tool_name}`,
    },
    el('p', { class: 'permission-title' }, 'The agent asks to use ', el('strong', { text: request.tool_name })),
    request.description ? el('p', { class: 'permission-description', text: request.description }) : null,
    request.input_preview ? el('pre', { class: 'permission-preview', text: request.input_preview }) : null,
    outcome,
    actions,
    error ? el('p', { class: 'error', role: 'alert', text: error }) : null,
  );
  actions?.addEventListener('click', (event) => {
    const behavior = event.target?.dataset?.behavior;
    if (behavior) onAnswer(behavior);
  });
  return card;
}

/** The cards of one open chat, kept in `transcript` (an <ol>). */
export class PermissionCards {
  constructor(sessionId, transcript, { announce }) {
    this.sessionId = sessionId;
    this.transcript = transcript;
    this.announce = announce;
    this.requests = new Map(); // request_id -> request
    this.reads = new Map(); // request_id -> latest read number
    this.disposed = false;
  }

  /** Reads every request again (on load and after the stream reconnects). */
  async load() {
    const requests = await api.listPermissions(this.sessionId);
    if (this.disposed) return;
    // Oldest first, so cards stand in the order they were asked.
    for (const request of [...requests].reverse()) this.show(request, { quiet: true });
  }

  /** An `event: permission` from the stream: re-read that request. */
  async changed(requestId) {
    const n = (this.reads.get(requestId) || 0) + 1;
    this.reads.set(requestId, n);
    const request = await api.getPermission(this.sessionId, requestId);
    if (this.disposed || this.reads.get(requestId) !== n) return;
    this.show(request);
  }

  show(request, { quiet = false, busy = false, error = '' } = {}) {
    const before = this.requests.get(request.request_id);
    this.requests.set(request.request_id, request);
    const card = permissionCard(request, {
      busy,
      error,
      onAnswer: (behavior) => this.answer(request.request_id, behavior),
    });
    const existing = document.getElementById(`permission-${request.request_id}`);
    if (existing) existing.replaceWith(card);
    else this.transcript.append(card);
    if (quiet || before?.state === request.state) return;
    if (request.state === 'pending') this.announce(`The agent asks to use ${request.tool_name}.`);
    else this.announce(`Permission request for ${request.tool_name}: ${request.state}.`);
  }

  async answer(requestId, behavior) {
    const request = this.requests.get(requestId);
    this.show(request, { quiet: true, busy: true });
    try {
      this.show(await api.answerPermission(this.sessionId, requestId, behavior));
    } catch (error) {
      if (this.disposed || error.status === 401) return;
      // Answered elsewhere first (or expired): show what the broker decided.
      const fresh = await api.getPermission(this.sessionId, requestId).catch(() => request);
      if (this.disposed) return;
      const said = error.code === 'permission_already_answered' ? 'Already answered elsewhere.' : error.message;
      this.show(fresh, { error: said });
    }
  }
}
