// The console's link to the cluster: which node it talks to, the ACL token,
// and JSON requests that move to another member when a node stops answering.
//
// The token lives in sessionStorage (this tab only; gone when it closes) and
// in memory, and is sent in the Authorization header — never in a URL.
import { noteServerDate } from './util.js';

const TOKEN_KEY = 'dlock.acl-token';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const listeners = new Set();

export const conn = {
  // origins: the API origins the page may use, its own first; more are
  // learned from GET /api/v1/cluster.
  origins: [location.origin],
  current: 0,
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  // state: 'connecting', 'live' (a watch stream is open), 'polling'
  // (answers but no stream on this page), 'down'.
  state: 'connecting',
  node: '',
  needToken: false,
};

export function onChange(fn) { listeners.add(fn); return () => listeners.delete(fn); }
function notify() { for (const fn of listeners) fn(conn); }

export function base() { return conn.origins[conn.current]; }

export function setState(state, node) {
  if (conn.state === state && (node === undefined || node === conn.node)) return;
  conn.state = state;
  if (node !== undefined) conn.node = node;
  notify();
}

export function setToken(t) {
  conn.token = t.trim();
  if (conn.token) sessionStorage.setItem(TOKEN_KEY, conn.token);
  else sessionStorage.removeItem(TOKEN_KEY);
  conn.needToken = false;
  notify();
}

export function needToken() {
  if (!conn.needToken) { conn.needToken = true; notify(); }
}

// failover moves to the next known member.
export function failover() {
  if (conn.origins.length > 1) conn.current = (conn.current + 1) % conn.origins.length;
  setState('connecting');
}

export function headers(extra) {
  const hd = { Accept: 'application/json', ...extra };
  if (conn.token) hd.Authorization = 'Bearer ' + conn.token;
  return hd;
}

// api sends one request. Reads move to the next member when a node does not
// answer or answers 503 (no leader, shutting down); writes are sent once,
// to the current node, since their outcome may be unknown after a failure.
export async function api(path, { method = 'GET', body, signal } = {}) {
  const read = method === 'GET';
  const tries = read ? conn.origins.length : 1;
  let last;
  for (let i = 0; i < tries; i++) {
    const from = base();
    const init = { method, headers: headers(), signal, cache: 'no-store', credentials: 'omit', redirect: 'error' };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(from + path, init);
    } catch (e) {
      if (signal && signal.aborted) throw e;
      last = new ApiError(0, 'unreachable', `${from} does not answer`);
      if (read) failover();
      continue;
    }
    noteServerDate(resp);
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
    if (resp.ok) return data;
    const err = new ApiError(resp.status, (data && data.error && data.error.code) || `http_${resp.status}`,
      (data && data.error && data.error.message) || resp.statusText);
    if (resp.status === 401) needToken();
    if (read && resp.status === 503) {
      last = err;
      failover();
      continue;
    }
    throw err;
  }
  throw last;
}

// learnMembers reads the member list (or takes a GET /api/v1/cluster answer
// already read) and keeps every member's API origin, so
// reads and streams can carry on through another node. Only members count:
// the API's CORS rules admit them and no other origin.
export async function learnMembers(known) {
  const info = known || await api('/api/v1/cluster');
  const current = base();
  const seen = new Set([location.origin]);
  const origins = [location.origin];
  for (const m of (info && info.members) || []) {
    let addr = m.api_addr || '';
    if (!addr) continue;
    addr = addr.replace(/^[a-z]+:\/\//i, '').replace(/\/+$/, '');
    const o = `${location.protocol}//${addr}`;
    if (!seen.has(o)) { seen.add(o); origins.push(o); }
  }
  conn.origins = origins;
  conn.current = Math.max(0, origins.indexOf(current));
  // How many nodes the page could carry on through (shown for tests and
  // the curious: <html data-members="3">).
  document.documentElement.dataset.members = String(origins.length);
  return info;
}
