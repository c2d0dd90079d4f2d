"""The trace viewer page's inline stylesheet and script (no CDN, no network): the script lays the
bars out on the time axis, applies the terminal-reason and time-window filters, and fills the
details panel when a request or an engine step is clicked."""
from __future__ import annotations

STYLE = """
:root { --queue:#9aa5b1; --prefill:#f59e0b; --decode:#3b82f6; --line:#e5e7eb; --muted:#6b7280;
  --completed_stop:#16a34a; --completed_length:#0d9488; --cancelled:#a855f7; --disconnected:#64748b;
  --rejected:#f97316; --failed:#dc2626; --unknown:#111827; }
* { box-sizing:border-box; }
body { margin:0; font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:#111827;
  background:#f9fafb; }
header { padding:12px 20px 8px; background:#111827; color:#f9fafb; }
header h1 { margin:0 0 2px; font-size:18px; }
header .meta { color:#d1d5db; font-size:12px; }
#reason-counts { margin-top:6px; display:flex; gap:6px; flex-wrap:wrap; }
.badge { display:inline-block; padding:1px 7px; border-radius:9px; color:#fff; font-size:11px; font-weight:600;
  white-space:nowrap; background:var(--unknown); }
#controls { display:flex; gap:18px; align-items:center; flex-wrap:wrap; padding:8px 20px;
  background:#fff; border-bottom:1px solid var(--line); }
#controls .group { display:flex; gap:10px; align-items:center; flex-wrap:wrap; }
#controls .group b { color:var(--muted); font-weight:600; }
#controls label { white-space:nowrap; }
#controls input[type=range] { width:150px; vertical-align:middle; }
#since-label, #until-label { display:inline-block; min-width:64px; }
.legend { display:flex; gap:12px; align-items:center; color:var(--muted); }
.swatch { display:inline-block; width:18px; height:9px; border-radius:2px; vertical-align:middle; margin-right:3px; }
main { margin-right:300px; padding:10px 20px 30px; }
h2 { font-size:14px; margin:16px 0 6px; }
table { border-collapse:collapse; width:100%; background:#fff; }
th, td { padding:3px 6px; border-bottom:1px solid var(--line); text-align:left; white-space:nowrap; }
th { position:sticky; top:0; background:#f3f4f6; font-weight:600; z-index:1; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.rid { font-family:ui-monospace,Menlo,"DejaVu Sans Mono",monospace; font-size:11px; }
th.lane, td.lane { width:100%; min-width:420px; }
.track { position:relative; height:16px; background:#f8fafc; border-radius:3px; overflow:hidden; }
.axis { position:relative; height:16px; }
.axis span { position:absolute; top:0; transform:translateX(-50%); color:var(--muted); font-weight:400;
  font-size:11px; }
.bar { position:absolute; top:2px; height:12px; min-width:2px; border-radius:2px; }
.phase-queue { background:var(--queue); } .phase-prefill { background:var(--prefill); }
.phase-decode { background:var(--decode); } .phase-mixed { background:#8b5cf6; }
.bar.root { top:7px; height:2px; background:#cbd5e1; }
.marker { position:absolute; top:1px; width:3px; height:14px; margin-left:-1px; border-radius:1px; }
.marker.first-token { background:#111827; width:2px; }
.request-row, .step-row { cursor:pointer; }
.request-row:hover td, .step-row:hover td { background:#eef2ff; }
.request-row.selected td, .step-row.selected td { background:#e0e7ff; }
.request-row.in-step td { background:#fef3c7; }
#engine-lane td { background:#f3f4f6; font-weight:600; }
#engine-lane .track { height:30px; background:#fff; }
.step-bar { position:absolute; bottom:0; min-width:1px; opacity:.85; cursor:pointer; }
.step-bar.phase-decode { background:var(--decode); } .step-bar.phase-prefill { background:var(--prefill); }
.step-bar.phase-mixed { background:#8b5cf6; } .step-bar.lit { background:#111827; opacity:1; }
.req-chip { display:inline-block; margin-right:3px; padding:0 5px; border-radius:3px; background:#e5e7eb;
  font-family:ui-monospace,Menlo,"DejaVu Sans Mono",monospace; font-size:11px; }
.hidden { display:none; }
aside#details { position:fixed; top:0; right:0; bottom:0; width:290px; overflow:auto; background:#fff;
  border-left:1px solid var(--line); padding:12px 14px; }
aside#details h2 { margin-top:0; }
#details-body h3 { font-size:13px; margin:0 0 4px; word-break:break-all; }
#details-body p { margin:0 0 8px; color:var(--muted); }
#details-body .kv { padding:3px 0; border-bottom:1px solid var(--line); }
#details-body .k { color:var(--muted); font-size:11px; }
#details-body .v { font-family:ui-monospace,Menlo,"DejaVu Sans Mono",monospace; font-size:12px; word-break:break-all; }
.empty { color:var(--muted); padding:10px 0; }
"""

SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById('trace-data').textContent);
  const all = selector => document.querySelectorAll(selector);
  const total = data.duration_us;
  const since = document.getElementById('since'), until = document.getElementById('until');
  const fmt = us => (Math.abs(us) >= 1e6 ? (us / 1e6).toFixed(2) + ' s' : (us / 1e3).toFixed(1) + ' ms');
  function windowUs() { const a = +since.value, b = +until.value; return a < b ? [a, b] : [b, a]; }
  function place(el, a, b) {
    const s = +el.dataset.startUs, e = el.dataset.endUs === undefined ? s : +el.dataset.endUs, w = b - a || 1;
    el.style.left = ((s - a) / w * 100) + '%';
    if (!el.classList.contains('marker')) el.style.width = (Math.max(e - s, 0) / w * 100) + '%';
  }
  function axis(a, b) {
    const ax = document.getElementById('axis'); ax.innerHTML = '';
    for (let i = 0; i <= 4; i++) {
      const t = document.createElement('span'); t.style.left = (i * 25) + '%';
      if (i === 0) t.style.transform = 'none'; if (i === 4) t.style.transform = 'translateX(-100%)';
      t.textContent = '+' + fmt(a + (b - a) * i / 4); ax.appendChild(t);
    }
  }
  function apply() {
    const [a, b] = windowUs();
    document.getElementById('since-label').textContent = '+' + fmt(a);
    document.getElementById('until-label').textContent = '+' + fmt(b);
    const on = new Set([...all('.reason-filter')].filter(c => c.checked).map(c => c.value));
    let shown = 0; const ids = new Set();
    all('tr.request-row').forEach(tr => {
      const keep = on.has(tr.dataset.terminalReason) && +tr.dataset.endUs >= a && +tr.dataset.startUs <= b;
      tr.classList.toggle('hidden', !keep); if (keep) { shown++; ids.add(tr.dataset.requestId); }
    });
    all('tr.step-row').forEach(tr => {
      const keep = +tr.dataset.endUs >= a && +tr.dataset.startUs <= b &&
        (tr.dataset.requestIds === '' || tr.dataset.requestIds.split(' ').some(r => ids.has(r)));
      tr.classList.toggle('hidden', !keep);
    });
    all('.track [data-start-us]').forEach(el => place(el, a, b));
    axis(a, b);
    document.getElementById('shown-count').textContent = shown + ' of ' + data.request_count + ' requests shown';
  }
  function show(key, v) {
    if (typeof v === 'string') return v;
    if (typeof v !== 'number' || Number.isInteger(v)) return JSON.stringify(v);
    return key.endsWith('_s') ? fmt(v * 1e6) + '  (' + v.toPrecision(6) + ' s)' : String(+v.toPrecision(6));
  }
  function details(title, attrs, extra) {
    const body = document.getElementById('details-body');
    body.innerHTML = '<h3></h3>' + (extra || '');
    body.querySelector('h3').textContent = title;
    Object.keys(attrs).sort().forEach(k => {
      const kv = document.createElement('div'); kv.className = 'kv';
      const key = document.createElement('div'); key.className = 'k'; key.textContent = k;
      const val = document.createElement('div'); val.className = 'v';
      val.textContent = show(k, attrs[k]);
      kv.append(key, val); body.appendChild(kv);
    });
  }
  function clearMarks() {
    all('.selected,.in-step,.lit').forEach(e => e.classList.remove('selected', 'in-step', 'lit'));
  }
  function showRequest(rid) {
    clearMarks(); const r = data.requests[rid]; if (!r) return;
    all('tr.request-row').forEach(tr => tr.classList.toggle('selected', tr.dataset.requestId === rid));
    r.steps.forEach(i => { const b = document.getElementById('step-bar-' + i); if (b) b.classList.add('lit'); });
    details('#' + data.numbers[rid] + ' ' + rid, r.attributes, '<p>' + r.steps.length + ' engine steps</p>');
  }
  function showStep(idx) {
    clearMarks(); const s = data.steps[idx]; if (!s) return;
    const ids = new Set(s.request_ids);
    all('tr.request-row').forEach(tr => tr.classList.toggle('in-step', ids.has(tr.dataset.requestId)));
    all('tr.step-row').forEach(tr => tr.classList.toggle('selected', tr.dataset.stepIndex === String(idx)));
    const b = document.getElementById('step-bar-' + idx); if (b) b.classList.add('lit');
    const who = s.request_ids.map(r => '#' + (data.numbers[r] || '?')).join(' ');
    details('engine step ' + idx, s.attributes,
            '<p>' + s.request_ids.length + ' requests shared this step: ' + who + '</p>');
  }
  all('tr.request-row').forEach(tr => tr.addEventListener('click', () => showRequest(tr.dataset.requestId)));
  all('tr.step-row, .step-bar').forEach(el => el.addEventListener('click', () => showStep(el.dataset.stepIndex)));
  all('.reason-filter').forEach(c => c.addEventListener('change', apply));
  [since, until].forEach(el => el.addEventListener('input', apply));
  document.getElementById('reset').addEventListener('click', () => {
    since.value = 0; until.value = total;
    all('.reason-filter').forEach(c => c.checked = true);
    apply();
  });
  apply();
  // #request=ID or #step=N opens that request or step, so a link can point at one
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get('request')) showRequest(hash.get('request'));
  else if (hash.get('step')) showStep(hash.get('step'));
})();
"""
