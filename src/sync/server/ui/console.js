// The precedent console: plain JavaScript, no build step. Every piece of data is put on
// the page with textContent or DOM attributes, never as HTML (docs/ui.md, "Safety").
'use strict';

const TOKEN_KEY = 'precedent-token';
const main = () => document.getElementById('main');

// ---- DOM helpers: el('td', {class: 'num'}, 'text', child) ----
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}
const short = (h) => (typeof h === 'string' ? h.slice(0, 12) : '');
const factLink = (h) => el('a', { href: '#/facts/' + encodeURIComponent(h), class: 'hash', title: h }, short(h));
const time = (ms) => (ms === null || ms === undefined ? '' : new Date(Number(ms)).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z'));
function age(ms) {
  if (!ms) return '0s';
  const s = Math.round(ms / 1000);
  if (s < 120) return s + 's';
  if (s < 7200) return Math.round(s / 60) + 'm';
  return Math.round(s / 3600) + 'h';
}
function table(head, rows, numeric) {
  const num = new Set(numeric || []);
  return el('table', {},
    el('thead', {}, el('tr', {}, head.map((h, i) => el('th', { scope: 'col', class: num.has(i) ? 'num' : null }, h)))),
    el('tbody', {}, rows.map((r) => el('tr', {}, r.map((c, i) => el('td', { class: num.has(i) ? 'num' : null }, c))))));
}
function replace(...nodes) {
  const m = main();
  m.replaceChildren(...nodes);
}
function errorBox(e) {
  return el('p', { class: 'error', role: 'alert' }, String(e.message || e));
}

// ---- the API, with the token from sessionStorage ----
class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function api(path, options) {
  const o = Object.assign({ headers: {} }, options || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) o.headers.Authorization = 'Bearer ' + token;
  if (o.json !== undefined) {
    o.method = o.method || 'POST';
    o.headers['Content-Type'] = 'application/json';
    o.body = JSON.stringify(o.json);
  }
  const r = await fetch(path, o);
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!r.ok) {
    if (r.status === 401) { showLogin('This server needs a token.'); }
    throw new HttpError(r.status, (body && body.message) || ('HTTP ' + r.status));
  }
  return body;
}

// ---- sign in: the token goes to sessionStorage, and to a cookie for EventSource ----
let loginShown = false;
function showLogin(why) {
  loginShown = true;
  const input = el('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true });
  const form = el('form', {
    id: 'login', onsubmit: async (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value);
      try {
        await api('/ui/login', { json: { token: input.value } });
      } catch (e) {
        sessionStorage.removeItem(TOKEN_KEY);
        form.append(errorBox(e));
        return;
      }
      loginShown = false;
      connectEvents(true);
      route();
    },
  }, el('label', { for: 'token' }, 'Token', input), el('button', { type: 'submit' }, 'Sign in'));
  replace(el('h2', {}, 'Sign in'), el('p', {}, why || 'Give a token of this server.'), form);
  input.focus();
}

// ---- views ----
function cards(pairs) {
  return el('div', { class: 'cards' }, pairs.map(([k, v, id]) =>
    el('div', { class: 'card' }, el('div', { class: 'n', id }, v), el('div', { class: 'k' }, k))));
}
function queueTable(queues) {
  return table(
    ['Queue', 'Input', 'Ready', 'Leased', 'Backing off', 'Blocked', 'Dead', 'Poison', 'Oldest ready', 'Alerts'],
    queues.map((q) => [
      el('a', { href: '#/queues/' + encodeURIComponent(q.name) }, q.name),
      q.input_type, q.stats.ready, q.stats.leased, q.stats.delayed, q.stats.blocked,
      q.stats.dead, q.stats.poison, age(q.stats.oldest_ready_ms),
      q.breaches.length ? el('span', { class: 'bad' }, q.breaches.map((b) => b.alert + ' ' + b.value + ' > ' + b.threshold).join(', ')) : 'none',
    ]), [2, 3, 4, 5, 6, 7]);
}
function peerTable(peers) {
  return table(['Peer', 'Pulled through', 'Pushed through', 'Remote seq', 'Lag', 'Last sync', 'Last error'],
    peers.map((p) => [p.url, p.pull_after, p.push_after, p.remote_seq, p.lag, time(p.last_sync_ms),
      p.last_error ? el('span', { class: 'bad' }, p.last_error) : '']), [1, 2, 3, 4]);
}

async function overview() {
  const o = await api('/v1/overview');
  const peers = o.peers.map((p) => [p.url, p.lag, p.last_error ? el('span', { class: 'bad' }, p.last_error) : '']);
  return [
    el('h2', {}, 'Overview'),
    cards([['facts', o.facts, 'count-facts'], ['held', o.held, 'count-held'], ['quarantined', o.quarantined, 'count-quarantined'],
      ['peers', o.peers.length, 'count-peers'], ['queues with alerts', o.queues_breached, 'count-breached']]),
    el('h3', {}, 'Queues'), o.queues.length ? queueTable(o.queues) : el('p', { class: 'muted' }, 'No queues declared.'),
    el('h3', {}, 'Peers'), peers.length ? table(['Peer', 'Lag', 'Last error'], peers, [1]) : el('p', { class: 'muted' }, 'No peers.'),
  ];
}

// A list read a page at a time, with a button for the next page.
async function pagedList(path, toTable, empty) {
  const box = el('div', {});
  let after = null;
  const more = el('button', { type: 'button', class: 'secondary', onclick: () => load() }, 'More');
  async function load() {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api(path + (after ? sep + 'after=' + encodeURIComponent(after) : ''));
    if (!page.items.length && !after) box.replaceChildren(el('p', { class: 'muted' }, empty));
    else box.append(toTable(page.items));
    after = page.next;
    if (after) box.append(more); else more.remove();
  }
  await load();
  return box;
}

async function queues() {
  return [el('h2', {}, 'Queues'), await pagedList('/v1/queues', queueTable, 'No queues declared.')];
}

function chart(minutes) {
  const w = 600, h = 120, pad = 20;
  const max = Math.max(1, ...minutes.map((m) => Math.max(m.completed, m.failed)));
  const bw = (w - pad) / minutes.length;
  const s = svg('svg', { class: 'chart', width: w, height: h + pad, viewBox: `0 0 ${w} ${h + pad}`, role: 'img', 'aria-labelledby': 'chart-title' });
  s.append(svg('title', { id: 'chart-title' }, 'Completions and failures per minute, last hour'));
  minutes.forEach((m, i) => {
    const x = pad + i * bw;
    const ch = (m.completed / max) * h, fh = (m.failed / max) * h;
    const c = svg('rect', { class: 'completed', x: x, y: h - ch, width: Math.max(1, bw / 2 - 1), height: ch });
    c.append(svg('title', {}, `${time(m.minute * 60000)}: ${m.completed} completed`));
    const f = svg('rect', { class: 'failed', x: x + bw / 2, y: h - fh, width: Math.max(1, bw / 2 - 1), height: fh });
    f.append(svg('title', {}, `${time(m.minute * 60000)}: ${m.failed} failed`));
    s.append(c, f);
  });
  s.append(svg('text', { x: 0, y: 10 }, max), svg('text', { x: 0, y: h }, 0),
    svg('text', { x: pad, y: h + 14 }, '-60 min'), svg('text', { x: w - 30, y: h + 14 }, 'now'));
  return el('figure', {}, s, el('figcaption', { class: 'legend' },
    el('span', { class: 'c' }, '■ completed ' + minutes.reduce((a, m) => a + m.completed, 0)),
    el('span', { class: 'f' }, '■ failed ' + minutes.reduce((a, m) => a + m.failed, 0))));
}

let flash = '';
async function queuePage(name) {
  const q = await api('/v1/queues/' + encodeURIComponent(name));
  const s = q.stats;
  // The outcome of the last action stays shown across the re-render it causes.
  const status = el('p', { role: 'status', id: 'action-status' }, flash);
  const reasonInput = el('input', { id: 'discard-reason', name: 'reason', type: 'text', value: 'discarded from the console' });
  async function act(kind, input) {
    try {
      const body = { input };
      if (kind === 'discard') body.reason = reasonInput.value;
      const r = await api('/v1/queues/' + encodeURIComponent(name) + '/' + kind, { json: body });
      flash = kind + ': ' + short(r.input) + ' by ' + short(r[kind]);
      render();
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
  }
  const entries = (state) => (items) => table(['Input', 'Attempts', 'Reason', 'First attempt', state === 'dead' ? 'Dead since' : 'Poison since', 'Input fact', 'Actions'],
    items.map((i) => [factLink(i.input), i.attempts, i.last_error || '', time(i.first_attempt_at_ms), time(i.entry_at_ms),
      el('pre', {}, i.fact ? JSON.stringify(i.fact.fields, null, 1) : ''),
      el('span', { class: 'row' },
        el('button', { type: 'button', class: 'redrive', 'data-input': i.input, 'aria-label': 'Redrive ' + short(i.input), onclick: () => act('redrive', i.input) }, 'Redrive'),
        el('button', { type: 'button', class: 'secondary discard', 'data-input': i.input, 'aria-label': 'Discard ' + short(i.input), onclick: () => act('discard', i.input) }, 'Discard'))]), [1]);
  const base = '/v1/queues/' + encodeURIComponent(name) + '/items?state=';
  return [
    el('h2', {}, 'Queue ', el('code', {}, q.name)),
    el('p', { class: 'muted' }, 'Input ', q.spec.input_type, '; done by ', q.spec.completions.map((c) => c.type_name + '.' + c.role).join(', ')),
    cards([['ready', s.ready, 'q-ready'], ['leased', s.leased, 'q-leased'], ['backing off', s.delayed, 'q-backoff'], ['blocked', s.blocked, 'q-blocked'],
      ['dead', s.dead, 'q-dead'], ['poison', s.poison, 'q-poison'], ['completed', s.completed, 'q-completed'], ['oldest ready', age(s.oldest_ready_ms), 'q-oldest']]),
    q.breaches.length ? el('p', { class: 'bad' }, 'Alerts: ', q.breaches.map((b) => b.alert + ' ' + b.value + ' > ' + b.threshold).join(', ')) : null,
    el('h3', {}, 'Last hour'), chart(q.minutes),
    el('div', { class: 'row' }, el('label', { for: 'discard-reason' }, 'Discard reason', reasonInput)),
    status,
    el('h3', {}, 'Dead letters'), await pagedList(base + 'dead', entries('dead'), 'No dead letters.'),
    el('h3', {}, 'Poison'), await pagedList(base + 'poison', entries('poison'), 'No poison inputs.'),
  ];
}

async function held() {
  return [el('h2', {}, 'Held facts'), await pagedList('/v1/held', (items) => table(['Fact', 'Type', 'Held since', 'Waits for'],
    items.map((h) => [el('code', { title: h.fact.hash }, short(h.fact.hash)), h.fact.type, time(h.held_at_ms),
      el('span', {}, h.missing.map((m) => el('code', { title: m }, short(m) + ' ')))])), 'Nothing is held.')];
}
async function peers() {
  return [el('h2', {}, 'Peers'), await pagedList('/v1/peers', peerTable, 'No peers.')];
}
async function quarantine() {
  return [el('h2', {}, 'Quarantine'), await pagedList('/v1/quarantine', (items) => table(['Id', 'From', 'Received', 'Reason', 'Bytes', 'First bytes'],
    items.map((q) => [q.id, q.peer, time(q.received_ms), q.reason, q.bytes, el('code', {}, q.head)]), [0, 4]), 'The quarantine is empty.')];
}

function factTable(items) {
  return table(['Fact', 'Type', 'Seq', 'Fields'], items.map((r) => [factLink(r.fact.hash), r.fact.type, r.seq,
    el('code', {}, JSON.stringify(r.fact.fields).slice(0, 160))]), [2]);
}
async function facts(params) {
  const prefix = el('input', { id: 'find-prefix', name: 'prefix', type: 'text', value: params.get('prefix') || '', pattern: '[0-9a-fA-F]*' });
  const type = el('input', { id: 'find-type', name: 'type', type: 'text', value: params.get('type') || '' });
  const form = el('form', {
    id: 'find', role: 'search', onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (prefix.value) q.set('prefix', prefix.value);
      if (type.value) q.set('type', type.value);
      location.hash = '#/facts?' + q.toString();
    },
  }, el('label', { for: 'find-prefix' }, 'Hash prefix', prefix), el('label', { for: 'find-type' }, 'Type', type),
  el('button', { type: 'submit' }, 'Find'));
  const q = new URLSearchParams();
  if (params.get('prefix')) q.set('prefix', params.get('prefix'));
  if (params.get('type')) q.set('type', params.get('type'));
  const list = await pagedList('/v1/find?' + q.toString(), factTable, 'No fact matches.');
  return [el('h2', {}, 'Facts'), form, list];
}

function valueText(v) {
  return typeof v === 'string' ? v : JSON.stringify(v);
}
async function factPage(hash) {
  const f = await api('/v1/facts/' + encodeURIComponent(hash), { headers: { Accept: 'application/json' } });
  const preds = [];
  for (const [role, v] of Object.entries(f.predecessors)) {
    for (const h of Array.isArray(v) ? v : [v]) preds.push([role, factLink(h)]);
  }
  const succ = await pagedList('/v1/facts/' + encodeURIComponent(hash) + '/successors',
    (items) => table(['Role', 'Fact', 'Type'], items.map((s) => [s.role, factLink(s.fact.hash), s.fact.type])), 'No successors.');
  return [
    el('h2', {}, f.type, ' ', el('code', { id: 'fact-hash' }, f.hash)),
    el('h3', {}, 'Fields'),
    Object.keys(f.fields).length
      ? table(['Field', 'Value'], Object.entries(f.fields).map(([k, v]) => [el('code', {}, k), el('span', { class: 'value' }, valueText(v))]))
      : el('p', { class: 'muted' }, 'No fields.'),
    el('h3', {}, 'Predecessors'),
    preds.length ? el('div', { id: 'predecessors' }, table(['Role', 'Fact'], preds)) : el('p', { class: 'muted', id: 'predecessors' }, 'None: a root fact.'),
    el('h3', {}, 'Successors'), el('div', { id: 'successors' }, succ),
    el('h3', {}, 'Neighbourhood'),
    el('img', {
      class: 'graph', id: 'graph', src: '/v1/graph/' + encodeURIComponent(f.hash) + '?format=svg&depth=2',
      alt: 'The neighbourhood of ' + short(f.hash) + ' in the fact graph: ancestors above, descendants below',
    }),
  ];
}

async function queryPage() {
  const text = el('textarea', { id: 'query-text', name: 'query', spellcheck: 'false' }, sessionStorage.getItem('precedent-query') || '');
  const givens = el('textarea', { id: 'query-givens', name: 'givens', spellcheck: 'false', placeholder: 'label=HASH, one a line' });
  const out = el('div', { id: 'query-out' });
  const form = el('form', {
    id: 'query', onsubmit: async (ev) => {
      ev.preventDefault();
      sessionStorage.setItem('precedent-query', text.value);
      const g = {};
      for (const line of givens.value.split('\n')) {
        const [k, v] = line.split('=').map((x) => (x || '').trim());
        if (k) g[k] = v;
      }
      try {
        const r = await api('/v1/query', { json: { query: text.value, givens: g, page_size: 1000 } });
        out.replaceChildren(el('p', { class: 'muted' }, r.count + ' result(s)' + (r.next ? ', more not shown' : '')), resultTable(r.results));
      } catch (e) {
        out.replaceChildren(errorBox(e));
      }
    },
  }, el('label', { for: 'query-text' }, 'Query', text), el('label', { for: 'query-givens' }, 'Givens', givens),
  el('button', { type: 'submit' }, 'Run'));
  return [el('h2', {}, 'Query'), form, out];
}
function cell(v) {
  if (typeof v === 'string' && /^[0-9a-f]{64}$/.test(v)) return factLink(v);
  if (v && typeof v === 'object' && typeof v.hash === 'string' && v.type) return el('span', {}, factLink(v.hash), ' ', v.type);
  return el('code', {}, valueText(v));
}
function resultTable(results) {
  const objects = results.length && results.every((r) => r && typeof r === 'object' && !Array.isArray(r) && !r.hash);
  if (objects) {
    const keys = [...new Set(results.flatMap((r) => Object.keys(r)))];
    return table(keys, results.map((r) => keys.map((k) => cell(r[k]))));
  }
  return table(['Result'], results.map((r) => [cell(r)]));
}

// ---- routing: #/PATH?QUERY ----
const routes = [
  [/^\/$/, () => overview()],
  [/^\/queues$/, () => queues()],
  [/^\/queues\/(.+)$/, (m) => queuePage(decodeURIComponent(m[1]))],
  [/^\/held$/, () => held()],
  [/^\/peers$/, () => peers()],
  [/^\/quarantine$/, () => quarantine()],
  [/^\/facts$/, (m, p) => facts(p)],
  [/^\/facts\/([0-9a-fA-F]{64})$/, (m) => factPage(m[1])],
  [/^\/query$/, () => queryPage()],
];
let rendering = 0;
async function render() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  for (const a of document.querySelectorAll('nav a')) {
    const target = a.getAttribute('href').slice(1);
    if (target === path || (target !== '/' && path.startsWith(target + '/'))) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const found = routes.map(([re, f]) => [path.match(re), f]).find(([m]) => m);
  const mine = ++rendering;
  try {
    const nodes = found ? await found[1](found[0], params) : [el('h2', {}, 'Not found'), el('p', {}, 'No page ' + path + '.')];
    if (mine === rendering && !loginShown) replace(...nodes);
  } catch (e) {
    if (mine === rendering && !loginShown) replace(errorBox(e));
  }
  if (mine === rendering) document.body.dataset.rendered = String(mine);
}
function route() {
  render();
}

// ---- live updates: re-render the current view on each change, unless the user is typing ----
let events = null;
let pending = null;
function connectEvents(restart) {
  if (events && !restart) return;
  if (events) events.close();
  const live = document.getElementById('live');
  events = new EventSource('/v1/events');
  events.addEventListener('open', () => { live.textContent = 'live'; live.classList.add('on'); });
  events.addEventListener('error', () => { live.textContent = 'offline'; live.classList.remove('on'); });
  events.addEventListener('change', (ev) => {
    let d = {};
    try { d = JSON.parse(ev.data); } catch (_) { d = {}; }
    document.body.dataset.seq = String(d.seq);
    const a = document.activeElement;
    const typing = a && (a.tagName === 'INPUT' || a.tagName === 'TEXTAREA');
    if (typing || loginShown || location.hash.startsWith('#/query')) return;
    clearTimeout(pending);
    pending = setTimeout(render, 150);
  });
}

window.addEventListener('hashchange', () => { flash = ''; route(); });
document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('signout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin();
  });
  connectEvents(false);
  route();
});
