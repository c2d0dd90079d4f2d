// The trace viewer page's script (tools/traceview/page.py writes the rows; this lays them out).
// The time window [since, until] is the part of the trace on screen: the sliders, zoom (buttons,
// Ctrl+wheel, keys + and -) and pan (drag a lane, Shift+wheel, buttons, arrow keys) all move it, and
// a request row shows while it overlaps the window (ends included), has a checked terminal reason
// and matches the search. Clicking a request, a step row or a step bar fills the details panel.
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('trace-data').textContent);
  const $ = id => document.getElementById(id);
  const all = selector => document.querySelectorAll(selector);
  const total = data.duration_us;
  const MIN_SPAN_US = Math.min(total, 10);
  const since = $('since'), until = $('until'), search = $('search'), waterfall = $('waterfall');
  const fmt = us => (Math.abs(us) >= 1e6 ? (us / 1e6).toFixed(2) + ' s' : (us / 1e3).toFixed(1) + ' ms');

  // ---- the window on screen ----------------------------------------------------------------------
  function windowUs() {
    let a = +since.value, b = +until.value;
    if (a > b) [a, b] = [b, a];
    return [Math.max(0, a), Math.min(total, b)];
  }
  function setWindow(a, b) {
    const w = Math.min(total, Math.max(MIN_SPAN_US, b - a));
    a = Math.min(Math.max(0, a), total - w);
    since.value = a; until.value = a + w;
    apply();
  }
  function zoom(factor, frac) {
    const [a, b] = windowUs(), w = b - a, at = a + w * frac;
    const nw = Math.min(total, Math.max(MIN_SPAN_US, w * factor));
    setWindow(at - nw * frac, at - nw * frac + nw);
  }
  function pan(frac) { const [a, b] = windowUs(), d = (b - a) * frac; setWindow(a + d, b + d); }
  function trackBox() {  // the lane of the first visible row: where time maps to pixels
    for (const t of all('#waterfall tr:not(.hidden) .track')) { const r = t.getBoundingClientRect(); if (r.width) return r; }
    return null;
  }

  // ---- filtering and layout ----------------------------------------------------------------------
  function place(el, a, b) {
    const s = +el.dataset.startUs, e = el.dataset.endUs === undefined ? s : +el.dataset.endUs, w = b - a || 1;
    el.style.left = ((s - a) / w * 100) + '%';
    if (!el.classList.contains('marker')) el.style.width = (Math.max(e - s, 0) / w * 100) + '%';
  }
  function axis(a, b) {
    const ax = $('axis'); ax.innerHTML = '';
    for (let i = 0; i <= 4; i++) {
      const t = document.createElement('span'); t.style.left = (i * 25) + '%';
      if (i === 0) t.style.transform = 'none'; if (i === 4) t.style.transform = 'translateX(-100%)';
      t.textContent = '+' + fmt(a + (b - a) * i / 4); ax.appendChild(t);
    }
  }
  function matches(tr, q) {
    if (!q) return true;
    const n = tr.dataset.requestNumber;
    return tr.dataset.requestId.toLowerCase().includes(q) || q === n || q === '#' + n;
  }
  function apply() {
    const [a, b] = windowUs(), q = search.value.trim().toLowerCase();
    $('since-label').textContent = '+' + fmt(a);
    $('until-label').textContent = '+' + fmt(b);
    $('zoom-level').textContent = (total / Math.max(b - a, 1e-9)).toFixed(1) + '\u00d7';
    const on = new Set([...all('.reason-filter')].filter(c => c.checked).map(c => c.value));
    let shown = 0; const ids = new Set();
    all('tr.request-row').forEach(tr => {
      const keep = on.has(tr.dataset.terminalReason) && +tr.dataset.endUs >= a && +tr.dataset.startUs <= b &&
        matches(tr, q);
      tr.classList.toggle('hidden', !keep); if (keep) { shown++; ids.add(tr.dataset.requestId); }
    });
    all('tr.step-row').forEach(tr => {
      const keep = +tr.dataset.endUs >= a && +tr.dataset.startUs <= b &&
        (tr.dataset.requestIds === '' ? !q : tr.dataset.requestIds.split(' ').some(r => ids.has(r)));
      tr.classList.toggle('hidden', !keep);
    });
    all('.track [data-start-us]').forEach(el => place(el, a, b));
    axis(a, b);
    $('shown-count').textContent = shown + ' of ' + data.request_count + ' requests shown';
  }

  // ---- the details panel -------------------------------------------------------------------------
  function show(key, v) {
    if (typeof v === 'string') return v;
    if (typeof v !== 'number' || Number.isInteger(v)) return JSON.stringify(v);
    return key.endsWith('_s') ? fmt(v * 1e6) + '  (' + v.toPrecision(6) + ' s)' : String(+v.toPrecision(6));
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text;
    return e;
  }
  function details(title, headline, note, attrs) {
    const body = $('details-body'); body.innerHTML = '';
    body.appendChild(el('h3', '', title));
    if (headline.length) {
      const grid = el('div', 'headline');
      headline.forEach(([key, label, value]) => {
        const m = el('div', 'metric'); m.dataset.metric = key;
        m.append(el('span', 'k', label), el('span', 'v', value)); grid.appendChild(m);
      });
      body.appendChild(grid);
    }
    if (note) body.appendChild(el('p', '', note));
    const keys = Object.keys(attrs).sort(), box = el('details');
    box.appendChild(el('summary', '', 'all attributes (' + keys.length + ')'));
    keys.forEach(k => {
      const kv = el('div', 'kv'); kv.append(el('div', 'k', k), el('div', 'v', show(k, attrs[k]))); box.appendChild(kv);
    });
    body.appendChild(box);
  }
  const sec = s => (s === null || s === undefined ? '\u2013' : fmt(s * 1e6));
  function clearMarks() {
    all('.selected,.in-step,.lit').forEach(e => e.classList.remove('selected', 'in-step', 'lit'));
  }
  function showRequest(rid) {
    clearMarks(); const r = data.requests[rid]; if (!r) return false;
    all('tr.request-row').forEach(tr => tr.classList.toggle('selected', tr.dataset.requestId === rid));
    r.steps.forEach(i => { const b = $('step-bar-' + i); if (b) b.classList.add('lit'); });
    const h = r.headline, tokens = (h.input_tokens ?? '\u2013') + ' / ' + (h.output_tokens ?? '\u2013');
    details('#' + data.numbers[rid] + ' ' + rid, [
      ['ttft', 'TTFT', sec(h.ttft_s)], ['queue', 'queue', sec(h.queue_s)], ['tpot', 'TPOT', sec(h.tpot_s)],
      ['e2e', 'e2e', sec(h.e2e_s)], ['tokens', 'tokens in / out', tokens], ['reason', 'terminal', h.terminal_reason],
    ], r.steps.length + ' engine steps', r.attributes);
    return true;
  }
  function showStep(idx) {
    clearMarks(); const s = data.steps[idx]; if (!s) return;
    const ids = new Set(s.request_ids), a = s.attributes;
    all('tr.request-row').forEach(tr => tr.classList.toggle('in-step', ids.has(tr.dataset.requestId)));
    all('tr.step-row').forEach(tr => tr.classList.toggle('selected', tr.dataset.stepIndex === String(idx)));
    const b = $('step-bar-' + idx); if (b) b.classList.add('lit');
    const who = s.request_ids.map(r => '#' + (data.numbers[r] || '?')).join(' ');
    details('engine step ' + idx, [
      ['phase', 'phase', a['pegainfer.step.phase'] ?? '\u2013'], ['duration', 'duration', sec(s.duration_s)],
      ['rows', 'rows', a['pegainfer.step.rows'] ?? '\u2013'],
    ], s.request_ids.length + ' requests shared this step: ' + who, a);
  }

  // ---- input ---------------------------------------------------------------------------------------
  let drag = null, dragged = false;
  waterfall.addEventListener('mousedown', e => {
    if (e.button !== 0 || !e.target.closest('.lane')) return;
    const box = trackBox(); if (!box) return;
    drag = { x: e.clientX, window: windowUs(), width: box.width }; dragged = false;
  });
  window.addEventListener('mousemove', e => {
    if (!drag) return;
    const dx = e.clientX - drag.x; if (Math.abs(dx) > 3) { dragged = true; waterfall.classList.add('dragging'); }
    if (!dragged) return;
    const [a, b] = drag.window, dt = -dx / drag.width * (b - a);
    setWindow(a + dt, b + dt);
  });
  window.addEventListener('mouseup', () => { drag = null; waterfall.classList.remove('dragging'); });
  waterfall.addEventListener('click', e => { if (dragged) { e.stopPropagation(); dragged = false; } }, true);
  waterfall.addEventListener('wheel', e => {
    const box = trackBox(); if (!box) return;
    if (e.ctrlKey || e.metaKey) {  // a pinch arrives as Ctrl+wheel too
      e.preventDefault();
      zoom(Math.exp(e.deltaY * 0.002), Math.min(1, Math.max(0, (e.clientX - box.left) / box.width)));
    } else if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      e.preventDefault(); pan((e.deltaX || e.deltaY) / box.width);
    }
  }, { passive: false });
  document.addEventListener('keydown', e => {
    if (e.target.closest('input, textarea, select') || e.ctrlKey || e.metaKey || e.altKey) return;
    const act = { '+': () => zoom(0.5, 0.5), '=': () => zoom(0.5, 0.5), '-': () => zoom(2, 0.5),
                  ArrowLeft: () => pan(-0.2), ArrowRight: () => pan(0.2), '0': () => setWindow(0, total),
                  '/': () => search.focus() }[e.key];
    if (act) { e.preventDefault(); act(); }
  });
  $('zoom-in').addEventListener('click', () => zoom(0.5, 0.5));
  $('zoom-out').addEventListener('click', () => zoom(2, 0.5));
  $('pan-left').addEventListener('click', () => pan(-0.25));
  $('pan-right').addEventListener('click', () => pan(0.25));
  search.addEventListener('input', apply);
  search.addEventListener('keydown', e => {  // Enter opens the one request the search leaves
    if (e.key !== 'Enter') return;
    const hits = [...all('tr.request-row:not(.hidden)')];
    if (hits.length === 1) { showRequest(hits[0].dataset.requestId); hits[0].scrollIntoView({ block: 'nearest' }); }
  });
  all('tr.request-row').forEach(tr => tr.addEventListener('click', () => showRequest(tr.dataset.requestId)));
  all('tr.step-row, .step-bar').forEach(x => x.addEventListener('click', () => showStep(x.dataset.stepIndex)));
  all('.reason-filter').forEach(c => c.addEventListener('change', apply));
  [since, until].forEach(x => x.addEventListener('input', apply));
  $('reset').addEventListener('click', () => {
    all('.reason-filter').forEach(c => { c.checked = true; });
    search.value = '';
    setWindow(0, total);
  });
  setWindow(0, total);  // every request on load, whatever the sliders' markup said
  // #request=ID or #step=N opens that request or step, so that a link can point at one
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get('request')) showRequest(hash.get('request'));
  else if (hash.get('step')) showStep(hash.get('step'));
})();
