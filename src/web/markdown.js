// Agent answers as Markdown (CommonMark + GFM tables and task lists), made
// safe: `marked` turns the text into HTML, DOMPurify keeps only the tags and
// attributes Markdown needs, and the result is a detached DocumentFragment.
// This module must never put unsanitized HTML into the page: nothing in an
// answer may run, load, or change anything outside its own bubble.
// People's own messages never come here; they stay plain text.

import { Marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.mjs';

const escapeHtml = (s) =>
  String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // An answer never loads an image (a request the person did not ask for,
    // maybe to a tracker): it becomes a link to it, named by its alt text.
    image({ href, text }) {
      return `<a href="${escapeHtml(href)}">${escapeHtml(`Image: ${text || href}`)}</a>`;
    },
  },
});

// What Markdown produces, and nothing that can load, run, float above the
// page (dialog, popover), take input, or restyle anything (style, class).
const ALLOWED_TAGS = [
  'a', 'b', 'blockquote', 'br', 'code', 'del', 'details', 'em', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6',
  'hr', 'i', 'input', 'kbd', 'li', 'ol', 'p', 'pre', 's', 'span', 'strong', 'sub', 'summary', 'sup',
  'table', 'tbody', 'td', 'th', 'thead', 'tr', 'ul',
];
const ALLOWED_ATTR = ['href', 'title', 'align', 'start', 'type', 'checked', 'disabled', 'class'];
const LANGUAGE_CLASS = /^language-[\w+#.-]{1,40}$/;

const purify = DOMPurify(window);
purify.addHook('uponSanitizeAttribute', (node, data) => {
  // `class` only as marked writes it on code (`language-rust`), for the label.
  if (data.attrName === 'class' && !(node.nodeName === 'CODE' && LANGUAGE_CLASS.test(data.attrValue))) {
    data.keepAttr = false;
  }
});
purify.addHook('afterSanitizeAttributes', (node) => {
  if (node.nodeName === 'A' && node.hasAttribute('href')) {
    // Links leave the page in a new tab that cannot reach back into it.
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
  if (node.nodeName === 'INPUT') {
    // A task-list box shows a state; it is never a control (any other input
    // in raw HTML becomes a disabled box too).
    node.setAttribute('type', 'checkbox');
    node.setAttribute('disabled', '');
    node.setAttribute('aria-label', node.hasAttribute('checked') ? 'done' : 'not done');
  }
});

const PURIFY_CONFIG = {
  ALLOWED_TAGS,
  ALLOWED_ATTR,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};

/** The answer's Markdown as a sanitized fragment, code blocks and tables made readable. */
export function renderMarkdown(text) {
  const html = marked.parse(String(text ?? ''), { async: false });
  const fragment = purify.sanitize(html, PURIFY_CONFIG);
  for (const pre of fragment.querySelectorAll('pre')) decorateCodeBlock(pre);
  for (const table of fragment.querySelectorAll('table')) wrapScrolling(table, 'table-scroll', 'Table');
  return fragment;
}

/** The answer as one line of plain text (for announcements and notifications). */
export function plainText(text, max = 300) {
  const words = renderMarkdown(text).textContent.replace(/\s+/g, ' ').trim();
  return words.length > max ? `${words.slice(0, max - 1)}…` : words;
}

function wrapScrolling(node, className, label) {
  const box = document.createElement('div');
  box.className = className;
  // A region that scrolls sideways must be reachable by keyboard.
  box.tabIndex = 0;
  box.setAttribute('role', 'region');
  box.setAttribute('aria-label', label);
  node.replaceWith(box);
  box.append(node);
  return box;
}

/** A fenced block: a bar with its language and a Copy button above the scrolling code. */
function decorateCodeBlock(pre) {
  const code = pre.querySelector('code');
  const language = code && [...code.classList].find((c) => LANGUAGE_CLASS.test(c))?.slice('language-'.length);
  const label = language ? `Code (${language})` : 'Code';
  const box = document.createElement('div');
  box.className = 'code-block';
  const bar = document.createElement('div');
  bar.className = 'code-bar';
  const name = document.createElement('span');
  name.className = 'code-lang';
  name.textContent = language || 'code';
  const copy = document.createElement('button');
  copy.type = 'button';
  copy.className = 'quiet code-copy';
  copy.textContent = 'Copy';
  copy.setAttribute('aria-label', `Copy ${label.toLowerCase()}`);
  const status = document.createElement('span');
  status.className = 'code-status';
  status.setAttribute('role', 'status');
  copy.addEventListener('click', () => copyText(box, status, (code || pre).textContent));
  bar.append(name, status, copy);
  pre.replaceWith(box);
  const scroller = wrapScrolling(pre, 'code-scroll', label);
  box.append(bar, scroller);
}

async function copyText(box, status, text) {
  let said;
  try {
    if (!navigator.clipboard) throw new Error('no clipboard');
    await navigator.clipboard.writeText(text);
    said = 'Copied';
  } catch {
    // No Clipboard API (a page not served over HTTPS or localhost) or refused:
    // select the code, so one keystroke copies it.
    const range = document.createRange();
    range.selectNodeContents(box.querySelector('pre'));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    said = 'Selected: press Ctrl+C to copy';
  }
  status.textContent = said;
  box.dataset.copied = said === 'Copied' ? 'yes' : 'selected';
  clearTimeout(box.resetTimer);
  box.resetTimer = setTimeout(() => {
    status.textContent = '';
  }, 3000);
}
