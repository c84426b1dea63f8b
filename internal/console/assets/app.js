// The console's shell: routing on the URL fragment (#/locks, #/lock/NAME,
// #/elections, #/cluster), the connection line, sign-in with an ACL token,
// and keyboard shortcuts.
import { conn, onChange, setToken, learnMembers } from './api.js';
import { h, fill } from './util.js';
import * as locks from './pages/locks.js';
import * as lock from './pages/lock.js';
import * as elections from './pages/elections.js';
import * as cluster from './pages/cluster.js';

const main = document.getElementById('main');
const connEl = document.getElementById('conn');
const signout = document.getElementById('signout');
let unmount = null;
let routeKey = '';

function route() {
  const hash = location.hash || '#/locks';
  const path = hash.slice(1).split('?')[0];
  const parts = path.split('/').filter(Boolean);
  if (parts[0] === 'lock' && parts.length > 1) return { page: lock, nav: 'locks', arg: decodeURIComponent(parts.slice(1).join('/')) };
  if (parts[0] === 'elections') return { page: elections, nav: 'elections' };
  if (parts[0] === 'cluster') return { page: cluster, nav: 'cluster' };
  return { page: locks, nav: 'locks' };
}

function render(force) {
  const r = route();
  const key = location.hash;
  if (!force && key === routeKey) return;
  const samePage = unmount && unmount.page === r.page && unmount.arg === r.arg;
  routeKey = key;
  for (const a of document.querySelectorAll('.top nav a')) {
    if (a.dataset.page === r.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (conn.needToken) {
    if (unmount) { unmount(); unmount = null; }
    showLogin();
    return;
  }
  if (samePage && !force && unmount.update) {
    unmount.update();
    return;
  }
  if (unmount) unmount();
  fill(main);
  unmount = r.page.mount(main, r.arg) || (() => {});
  unmount.page = r.page;
  unmount.arg = r.arg;
  if (!samePage) {
    const h1 = main.querySelector('h1');
    if (h1 && document.activeElement === document.body) h1.focus?.();
  }
}

function showLogin() {
  const input = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', spellcheck: 'false', required: true });
  const form = h('form', {
    onsubmit: (e) => {
      e.preventDefault();
      setToken(input.value);
      start();
    },
  },
  h('label', { for: 'token' }, 'ACL token (secret id)'), input,
  h('button', { type: 'submit' }, 'Sign in'));
  fill(main, h('section', { class: 'login', 'aria-labelledby': 'login-h' },
    h('h1', { id: 'login-h', tabindex: '-1' }, 'Sign in'),
    h('p', {}, conn.token
      ? 'This token was not accepted (revoked or expired?). Give another one.'
      : 'This cluster requires an ACL token. Paste a token with read and watch permission (dlock acl token create); revoking needs more, see docs/console.md.'),
    h('p', { class: 'note' }, 'The token stays in this browser tab (session storage) and is sent only in the Authorization header to the cluster\'s nodes.'),
    form));
  input.focus();
}

function showConn() {
  connEl.className = 'conn ' + (conn.state === 'live' ? 'live' : conn.state === 'down' ? 'down' : '');
  const node = conn.node ? ` via ${conn.node}` : '';
  connEl.textContent = conn.state === 'live' ? `live${node}`
    : conn.state === 'polling' ? `connected${node}`
      : conn.state === 'down' ? `not connected${node ? ' (' + conn.node + ')' : ''}` : 'reconnecting…';
  connEl.dataset.state = conn.state;
  connEl.dataset.node = conn.node;
  signout.hidden = !conn.token;
}

let wasNeedToken = false;
onChange(() => {
  showConn();
  if (conn.needToken !== wasNeedToken) {
    wasNeedToken = conn.needToken;
    render(true);
  }
});

signout.addEventListener('click', () => {
  setToken('');
  location.hash = '#/locks';
  render(true);
});

// "/" jumps to the filter of the page, as on many consoles; "g l", "g e",
// "g c" go to Locks, Elections, Cluster.
let g = false;
document.addEventListener('keydown', (e) => {
  const t = e.target;
  if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable))) return;
  if (e.key === '/') {
    const f = main.querySelector('input[type="search"]');
    if (f) { e.preventDefault(); f.focus(); f.select(); }
    return;
  }
  if (g) {
    g = false;
    const to = { l: '#/locks', e: '#/elections', c: '#/cluster' }[e.key];
    if (to) { e.preventDefault(); location.hash = to; }
    return;
  }
  if (e.key === 'g') g = true;
});

function start() {
  // Learn the other members now, so the page can carry on when this node
  // goes; failure here is not fatal (the pages say what is wrong).
  learnMembers().catch(() => {});
  render(true);
}

// Members come and go: keep the list the page may fail over to fresh.
setInterval(() => { if (!conn.needToken) learnMembers().catch(() => {}); }, 30000);

window.addEventListener('hashchange', () => render(false));
showConn();
start();
