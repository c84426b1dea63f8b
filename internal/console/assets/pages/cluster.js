// Cluster: members, leader, term, each node's health, applied index and
// version, read every 2 s from GET /api/v1/cluster?health=true (the
// answering node probes every member). When the node answering goes away the
// next read goes to another member.
import { api, learnMembers, setState, base } from '../api.js';
import { h, fill } from '../util.js';

const EVERY_MS = 2000;

export function mount(root) {
  let alive = true;
  let timer = null;
  const facts = h('dl', { class: 'facts', id: 'cluster-facts' });
  const tbody = h('tbody');
  const err = h('p', { class: 'error', role: 'alert' });
  const when = h('p', { class: 'note', 'aria-live': 'off' });
  root.append(
    h('h1', { tabindex: '-1' }, 'Cluster'),
    err, facts,
    h('h2', { id: 'members-h' }, 'Members'),
    h('table', { class: 'cards', id: 'members', 'aria-labelledby': 'members-h' },
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Node'), h('th', { scope: 'col' }, 'State'), h('th', { scope: 'col' }, 'Health'),
        h('th', { scope: 'col', class: 'num' }, 'Applied index'), h('th', { scope: 'col', class: 'num' }, 'Last contact'),
        h('th', { scope: 'col' }, 'Version'), h('th', { scope: 'col' }, 'API address'))),
      tbody),
    when);

  async function poll() {
    try {
      const c = await api('/api/v1/cluster?health=true');
      if (!alive) return;
      await learnMembers(c);
      err.textContent = '';
      setState('polling', new URL(base()).host);
      draw(c);
    } catch (e) {
      if (!alive) return;
      setState('down');
      err.textContent = `Could not read the cluster: ${e.message}`;
    }
    if (alive) timer = setTimeout(poll, EVERY_MS);
  }

  function draw(c) {
    fill(facts, [
      ['Leader', c.leader_id || 'none (election under way or quorum lost)'],
      ['Term', String(c.term)],
      ['Answered by', c.node_id],
      ['Commit index', String(c.commit_index)],
      ['Applied index', String(c.applied_index)],
      ['Revision', String(c.revision)],
      ['Last fencing token', String(c.last_fencing_token)],
    ].map(([k, v]) => [h('dt', {}, k), h('dd', { 'data-fact': k }, v)]));
    fill(tbody, (c.members || []).map((m) => {
      const reach = m.reachable === undefined ? h('span', { class: 'pill' }, 'unknown')
        : m.reachable ? h('span', { class: 'pill ok' }, 'reachable') : h('span', { class: 'pill bad' }, 'unreachable');
      const addr = (m.api_addr || '').replace(/^[a-z]+:\/\//i, '');
      return h('tr', { 'data-id': m.id, 'data-state': m.state },
        h('td', { 'data-label': 'Node', class: 'mono' }, m.id, m.id === c.leader_id ? h('span', { class: 'sub' }, 'leader') : null),
        h('td', { 'data-label': 'State' }, m.state, m.suffrage && m.suffrage !== 'voter' ? h('span', { class: 'sub' }, m.suffrage) : null,
          m.removing ? h('span', { class: 'sub', 'data-removing': '' }, 'being removed') : null),
        h('td', { 'data-label': 'Health' }, reach),
        h('td', { 'data-label': 'Applied index', class: 'num' }, m.applied_index ? String(m.applied_index) : '—'),
        h('td', { 'data-label': 'Last contact', class: 'num' }, m.last_contact_ms !== undefined ? `${Math.round(m.last_contact_ms)}ms` : '—'),
        h('td', { 'data-label': 'Version', class: 'mono' }, m.version || '—'),
        h('td', { 'data-label': 'API address', class: 'mono' }, addr ? h('a', { href: `${location.protocol}//${addr}/ui/` }, addr) : '—'));
    }));
    when.textContent = `Read at ${new Date().toLocaleTimeString()}; every ${EVERY_MS / 1000} s.`;
  }

  poll();
  return () => { alive = false; clearTimeout(timer); };
}
