// Elections: each election's leader, its value, since when, and how many
// candidates wait, a page at a time (pagedList over GET /api/v1/elections).
import { ApiError } from '../api.js';
import { h, since, clock } from '../util.js';
import { pagedList } from './paged.js';

export function mount(root) {
  return pagedList(root, {
    title: 'Elections',
    route: '#/elections',
    path: '/api/v1/elections',
    key: 'elections',
    kind: 'election',
    noun: 'elections',
    empty: 'No elections with a leader or candidates',
    placeholder: 'db/',
    caption: 'Elections and their leaders',
    head: [['Election'], ['Leader'], ['Value'], ['Since'], ['Token', 'num'], ['Candidates waiting', 'num']],
    listError: (e) => (e instanceof ApiError && e.status === 404
      ? 'This server cannot list elections; upgrade it, or read one with GET /api/v1/elections/{name}.'
      : `Could not list elections: ${e.message}`),
    row,
  });
}

function row(e) {
  const l = e.leader;
  return h('tr', { 'data-name': e.name },
    h('td', { 'data-label': 'Election', class: 'mono' }, e.name),
    h('td', { 'data-label': 'Leader', class: 'mono' }, l ? l.candidate_id : '— none —'),
    h('td', { 'data-label': 'Value', class: 'mono' }, l ? l.value : ''),
    h('td', { 'data-label': 'Since' }, l ? [clock(l.since), h('span', { class: 'sub', 'data-since': l.since }, since(l.since))] : '—'),
    h('td', { 'data-label': 'Token', class: 'num' }, l ? String(l.fencing_token) : '—'),
    h('td', { 'data-label': 'Candidates waiting', class: 'num' }, String(e.campaigners || 0)));
}
