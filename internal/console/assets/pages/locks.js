// Locks: who holds what, a page at a time (pagedList), with each holder's
// client id, fencing token, mode, time held and time left.
import { h, since, left, holdersOf, lockHref } from '../util.js';
import { pagedList } from './paged.js';

export function mount(root) {
  return pagedList(root, {
    title: 'Locks',
    route: '#/locks',
    path: '/api/v1/locks',
    key: 'locks',
    kind: 'lock',
    noun: 'locks',
    empty: 'No held or waited-for locks',
    placeholder: 'billing/',
    caption: 'Held and waited-for locks',
    head: [['Lock'], ['Holder'], ['Token', 'num'], ['Mode'], ['Held for', 'num'], ['Time left', 'num'], ['Waiting', 'num']],
    listError: (e, prefix) => (e.status === 403
      ? `Your token may not list ${prefix ? `locks under “${prefix}”` : 'every lock'}: type a prefix it may read. (${e.message})`
      : `Could not list locks: ${e.message}`),
    row,
  });
}

function row(l) {
  const hs = holdersOf(l);
  const cell = (label, cls, f) => h('td', { 'data-label': label, class: cls }, hs.length ? hs.map((x, i) => h('span', { class: i ? 'sub' : '' }, f(x))) : '—');
  return h('tr', { 'data-name': l.name },
    h('td', { 'data-label': 'Lock' }, h('a', { href: lockHref(l.name), class: 'mono' }, l.name),
      l.value ? h('span', { class: 'sub' }, `value: ${l.value}`) : null),
    cell('Holder', 'mono', (x) => x.client_id),
    cell('Token', 'num', (x) => x.fencing_token),
    cell('Mode', '', (x) => x.mode || l.mode || 'exclusive'),
    cell('Held for', 'num', (x) => h('span', { 'data-since': x.granted_at }, since(x.granted_at))),
    cell('Time left', 'num', (x) => h('span', { 'data-until': x.expires_at }, left(x.expires_at))),
    h('td', { 'data-label': 'Waiting', class: 'num' }, String(l.waiters || 0)));
}
