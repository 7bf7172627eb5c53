// Getting the person's attention when an answer arrives while they look
// elsewhere: the count of unread answers in the tab title (cleared when the
// tab is shown again) and, only once the person has pressed the button and
// the browser allowed it, a desktop notification naming the session.
// This module never asks for a permission by itself. Turning notifications
// on also subscribes this browser to Web Push (push.js), so they come with
// the page closed too.

import { subscribePush, unsubscribePush } from './push.js';

const PREF_KEY = 'loopx.notifications';
const button = document.getElementById('notify-toggle');
const supported = typeof window.Notification === 'function';

let baseTitle = document.title;
let unread = 0;

function render() {
  document.title = unread ? `(${unread}) ${baseTitle}` : baseTitle;
}

function wanted() {
  try {
    return localStorage.getItem(PREF_KEY) === 'on';
  } catch {
    return false;
  }
}

function setWanted(on) {
  try {
    if (on) localStorage.setItem(PREF_KEY, 'on');
    else localStorage.removeItem(PREF_KEY);
  } catch {
    // storage refused: the choice lasts for this page only
  }
}

function enabled() {
  return supported && Notification.permission === 'granted' && wanted();
}

function renderButton() {
  if (!button) return;
  button.hidden = !supported;
  if (!supported) return;
  const blocked = Notification.permission === 'denied';
  button.setAttribute('aria-pressed', String(enabled()));
  button.textContent = blocked
    ? 'Notifications blocked'
    : enabled()
      ? 'Notifications: on'
      : 'Notify me of answers';
  button.title = blocked
    ? 'The browser blocks notifications for this page; allow them in its site settings.'
    : 'A desktop notification when an answer arrives while this tab is hidden.';
}

button?.addEventListener('click', async () => {
  if (enabled()) {
    setWanted(false);
    unsubscribePush();
  } else if (Notification.permission === 'granted') {
    setWanted(true);
  } else if (Notification.permission === 'default') {
    // The one place the page asks: the person just pressed the button.
    const answer = await Notification.requestPermission();
    setWanted(answer === 'granted');
  }
  renderButton();
  if (enabled()) subscribePush();
});

document.addEventListener('visibilitychange', () => {
  if (document.visibilityState === 'visible' && unread) {
    unread = 0;
    render();
  }
});

renderButton();

export const attention = {
  /** The title without the unread count (the open session's name). */
  setTitle(title) {
    baseTitle = title;
    render();
  },

  /** An answer arrived in `sessionName`; counts and notifies only while the tab is hidden. */
  answered(sessionName, words) {
    if (document.visibilityState === 'visible') return;
    unread += 1;
    render();
    if (!enabled()) return;
    try {
      const note = new Notification(`Answer in ${sessionName}`, {
        body: words.length > 200 ? `${words.slice(0, 199)}…` : words,
        tag: 'loopx-answer',
      });
      note.addEventListener('click', () => {
        window.focus();
        note.close();
      });
    } catch {
      // Some browsers only notify from a service worker; the title still counts.
    }
  },
};
