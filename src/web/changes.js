// What the agent changed (HOOKS.md): the session's latest report of its
// working tree (branch, ahead/behind, the files with their lines added and
// removed), a file's diff with line numbers on a tap, and under each
// answered turn whose tools wrote files, "3 files changed (+40 −12)".
// Everything from the broker is set as text, never parsed as HTML.

import { request } from './api.js';
import { el, time } from './view.js';

const enc = encodeURIComponent;

/** The latest report, or null when the session reported none (404). */
export async function loadChanges(sessionId) {
  try {
    return (await request('GET', `/v1/sessions/${enc(sessionId)}/changes`)).data;
  } catch (error) {
    if (error.status === 404) return null;
    throw error;
  }
}

/** One file of the latest report, with its diff. */
export async function loadFile(sessionId, path) {
  return (await request('GET', `/v1/sessions/${enc(sessionId)}/changes/files/${enc(path)}`)).data;
}

const MINUS = '\u2212';

/** "3 files changed (+40 −12)". */
export function totals(files, added, removed) {
  return `${files} ${files === 1 ? 'file' : 'files'} changed (+${added} ${MINUS}${removed})`;
}

/** A file's counts as shown: "+3 −1", "binary", "+3 −1 · too long to show". */
function counts(file) {
  if (file.binary) return 'binary';
  const lines = `+${file.added} ${MINUS}${file.removed}`;
  return file.truncated ? `${lines} · too long to show` : lines;
}

/** The report: its head line and a list of files, each a button. */
export function changesSummary(changes, onFile) {
  if (!changes) {
    return [
      el(
        'p',
        { class: 'muted' },
        'No changes reported. The hooks report the working tree of a git repository when the agent ends a turn.',
      ),
    ];
  }
  const branch = changes.branch ?? 'detached HEAD';
  const head = el(
    'p',
    { class: 'changes-head' },
    el('strong', { class: 'changes-branch', text: branch }),
    changes.head ? el('code', { class: 'changes-commit', text: changes.head.slice(0, 8) }) : null,
    el('span', { class: 'changes-ab', text: `↑${changes.ahead} ↓${changes.behind}`, title: 'ahead, behind its upstream' }),
    el('span', { class: 'changes-totals', text: totals(changes.files.length, changes.added, changes.removed) }),
    el('span', { class: 'muted' }, 'as of ', time(changes.reported_at)),
  );
  const list = el(
    'ul',
    { class: 'changes-files', 'aria-label': 'Changed files' },
    changes.files.map((file) =>
      el(
        'li',
        { dataset: { path: file.path } },
        el(
          'button',
          { type: 'button', class: 'changes-file quiet', dataset: { status: file.status } },
          el('span', { class: 'changes-status', text: file.status.replace(/_/g, ' ') }),
          el('span', { class: 'changes-path', text: file.path }),
          el('span', { class: `changes-counts${file.binary || file.truncated ? ' changes-marked' : ''}`, text: counts(file) }),
        ),
      ),
    ),
  );
  list.addEventListener('click', (event) => {
    const item = event.target.closest('li[data-path]');
    if (item) onFile(item.dataset.path);
  });
  return [head, list];
}

/** A file's diff as a table: old and new line numbers, then the line. */
export function diffTable(file) {
  const title = el(
    'p',
    { class: 'diff-title' },
    el('code', { text: file.path }),
    ' ',
    el('span', { class: 'muted', text: counts(file) }),
  );
  if (!file.diff) {
    const why = file.binary
      ? 'A binary file: its contents are not shown.'
      : file.truncated
        ? 'Its diff is too long to show here.'
        : 'No lines to show.';
    return [title, el('p', { class: 'muted diff-none', text: why })];
  }
  const rows = [];
  let oldNo = 0;
  let newNo = 0;
  let inHunk = false;
  for (const line of file.diff.replace(/\n$/, '').split('\n')) {
    const hunk = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/.exec(line);
    let kind;
    let left = '';
    let right = '';
    if (hunk) {
      oldNo = Number(hunk[1]);
      newNo = Number(hunk[2]);
      inHunk = true;
      kind = 'hunk';
    } else if (!inHunk) {
      kind = 'meta';
    } else if (line.startsWith('+')) {
      kind = 'add';
      right = newNo++;
    } else if (line.startsWith('-')) {
      kind = 'del';
      left = oldNo++;
    } else if (line.startsWith('\\')) {
      kind = 'meta';
    } else {
      kind = 'ctx';
      left = oldNo++;
      right = newNo++;
    }
    rows.push(
      el(
        'tr',
        { class: `diff-${kind}` },
        el('td', { class: 'diff-no', text: String(left) }),
        el('td', { class: 'diff-no', text: String(right) }),
        el('td', { class: 'diff-line' }, el('code', { text: line })),
      ),
    );
  }
  const table = el(
    'table',
    { class: 'diff' },
    el(
      'thead',
      { class: 'visually-hidden' },
      el('tr', {}, el('th', { scope: 'col' }, 'Old line'), el('th', { scope: 'col' }, 'New line'), el('th', { scope: 'col' }, 'Line')),
    ),
    el('tbody', {}, rows),
  );
  return [title, el('div', { class: 'diff-scroll', tabindex: '0', role: 'region', 'aria-label': `Diff of ${file.path}` }, table)];
}

/** Under an answered turn: what its tools changed, or nothing. */
export function turnChanges(changed) {
  if (!changed || changed.files.length === 0) return null;
  return el(
    'details',
    { class: 'turn-changes' },
    el('summary', {}, totals(changed.files.length, changed.added, changed.removed)),
    el(
      'ul',
      {},
      changed.files.map((f) => el('li', {}, el('code', { text: f.path }), ` +${f.added} ${MINUS}${f.removed}`)),
    ),
  );
}
