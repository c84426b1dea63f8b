// A watch stream read with fetch rather than EventSource: EventSource cannot
// send an Authorization header, and the ACL token must not go in the URL.
//
// The stream resumes by itself: when it ends (node killed, no leader, cut off
// as slow) it reconnects — to the next member if the node is gone — from the
// last revision it delivered, skipping that revision's events it already
// has (docs/api.md, Watch). If the node no longer has that history (410
// compacted) it calls onReset, which lists again and says where to go on from.
import { base, headers, failover, setState, needToken, ApiError } from './api.js';

// A silent stream this long (the server sends a heartbeat every 15 s) is
// taken for a dead connection.
const IDLE_MS = 40000;

export class Watch {
  // prefix: names to watch; from: first revision wanted (0: from now);
  // onEvent(ev) per event; onReset() -> Promise<revision> after a compaction;
  // onLive(bool) when the stream opens or breaks.
  constructor({ prefix = '', from = 0, onEvent, onReset, onLive }) {
    this.prefix = prefix;
    // last: the last revision delivered (or listed); seenAtLast: how many of
    // its events were delivered (Infinity: all, as after a list at last).
    this.last = from > 0 ? from - 1 : 0;
    this.seenAtLast = Infinity;
    this.resume = from > 0;
    this.onEvent = onEvent;
    this.onReset = onReset;
    this.onLive = onLive || (() => {});
    this.closed = false;
    this.ac = null;
    this.run();
  }

  close() {
    this.closed = true;
    if (this.ac) this.ac.abort();
  }

  async run() {
    let backoff = 200;
    while (!this.closed) {
      const ok = await this.once();
      if (this.closed) return;
      this.onLive(false);
      if (!ok) {
        failover();
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 3000);
      } else {
        backoff = 200;
      }
    }
  }

  // once opens one stream and reads it to its end; false means the node
  // failed us (try another), true that the stream ended for a reason that
  // calls for an immediate retry.
  async once() {
    const from = base();
    const q = new URLSearchParams({ prefix: this.prefix });
    if (this.resume) q.set('from_revision', String(this.seenAtLast === Infinity ? this.last + 1 : this.last));
    const ac = new AbortController();
    this.ac = ac;
    let idle = null;
    const poke = () => { clearTimeout(idle); idle = setTimeout(() => ac.abort(), IDLE_MS); };
    let resp;
    try {
      poke();
      resp = await fetch(`${from}/api/v1/watch?${q}`, { headers: headers({ Accept: 'text/event-stream' }), signal: ac.signal, cache: 'no-store', credentials: 'omit' });
    } catch {
      clearTimeout(idle);
      return false;
    }
    if (!resp.ok) {
      clearTimeout(idle);
      let code = '';
      try { code = (await resp.json()).error.code; } catch { /* not JSON */ }
      if (resp.status === 410) return this.reset();
      if (resp.status === 401) { needToken(); await sleep(2000); return true; }
      if (resp.status === 403 || resp.status === 400) {
        // Retrying will not help; stay put and say so.
        setState('down', code || String(resp.status));
        await sleep(5000);
        return true;
      }
      return false;
    }
    this.onLive(true);
    setState('live', new URL(from).host);
    const ended = await this.read(resp.body.getReader(), poke);
    clearTimeout(idle);
    if (ended === 'compacted') return this.reset();
    return false;
  }

  async reset() {
    if (!this.onReset) return false;
    let rev;
    try { rev = await this.onReset(); } catch { return false; }
    // The list was read at rev, so the stream goes on from rev+1.
    this.last = rev;
    this.seenAtLast = Infinity;
    this.resume = true;
    return true;
  }

  async read(reader, poke) {
    const dec = new TextDecoder();
    let buf = '';
    let skip = this.seenAtLast === Infinity ? 0 : this.seenAtLast;
    const first = this.last;
    for (;;) {
      let chunk;
      try { chunk = await reader.read(); } catch { return 'broken'; }
      if (chunk.done || this.closed) return 'ended';
      poke();
      buf += dec.decode(chunk.value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const rec = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let event = 'message', data = '', id = 0;
        for (const line of rec.split('\n')) {
          if (line.startsWith(':')) continue;
          const c = line.indexOf(':');
          const field = c < 0 ? line : line.slice(0, c);
          const value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
          if (field === 'event') event = value;
          else if (field === 'data') data += (data ? '\n' : '') + value;
          else if (field === 'id') id = Number(value);
        }
        if (!data) continue;
        let body;
        try { body = JSON.parse(data); } catch { continue; }
        if (event === 'error') {
          const code = body && body.error && body.error.code;
          return code === 'compacted' ? 'compacted' : 'ended';
        }
        const rev = id || body.revision || 0;
        // On resume the stream starts at the last revision delivered; skip
        // the events of it already handed on.
        if (this.resume && rev === first && skip > 0) { skip--; continue; }
        if (rev < first) continue;
        if (rev !== this.last) { this.last = rev; this.seenAtLast = 0; }
        this.seenAtLast++;
        this.resume = true;
        if (this.closed) return 'ended';
        try { this.onEvent(body); } catch (e) { console.error(e); }
      }
    }
  }
}

export function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }
export { ApiError };
