"""The trace viewer's HTML page: one self-contained file with a waterfall row per request (queue,
prefill and decode bars, first-token marker, terminal reason), an engine lane and an engine-step
table (which requests shared each step), reason filters, a time window that zooms and pans, search
by request id, and a details panel that leads with a request's TTFT, queue time and TPOT.

Rows are written here, so the DOM holds them before any script runs; the inline script
(viewer.js) only lays bars out, filters and zooms. Stable hooks for tests and tools:
tr.request-row[data-request-id][data-terminal-reason][data-request-number], tr.step-row
[data-step-index][data-phase][data-request-ids], #waterfall, #steps, #details, .reason-filter,
#since, #until, #search, #zoom-in, #zoom-out, #pan-left, #pan-right, #reset, #shown-count,
#details-body .metric[data-metric]. The page URL's fragment `#request=ID` or `#step=N` opens that
request or step."""
from __future__ import annotations

import collections
import datetime
import html
import json
from collections.abc import Callable

from tools.traceview.assets import SCRIPT, STYLE
from tools.traceview.reader import PHASES, RequestView, StepView

REASONS = ("completed_stop", "completed_length", "cancelled", "disconnected", "rejected", "failed")
MAX_STEP_ROWS = 5000  # the engine-step table stops here; the lane above still draws every step
LEGEND = (("phase-queue", "", "queue"), ("phase-prefill", "", "prefill"), ("phase-decode", "", "decode"),
          ("phase-mixed", "", "mixed step"), ("", "background:#111827;width:3px", "first token"),
          ("", "background:var(--completed_stop);width:3px", "end (colour of its reason)"))
WATERFALL_HEAD = ('<th class="num">#</th><th>request</th><th>terminal reason</th><th class="num">TTFT</th>'
                  '<th class="num col-e2e">e2e</th><th class="num col-tokens">tokens in/out</th>'
                  '<th class="lane"><div class="axis" id="axis"></div></th>')
STEPS_HEAD = ('<th class="num">step</th><th>phase</th><th class="num">at</th><th class="num">duration</th>'
              '<th class="num">rows</th><th class="num">decode rows</th><th class="num">prefill tokens</th>'
              '<th class="num">KV slots</th><th>requests</th>')


def iso(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="milliseconds")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _attrs(**data) -> str:
    """HTML attributes from keywords (data_x -> data-x), escaped."""
    return " ".join(f'{k.replace("_", "-")}="{_e(v)}"' for k, v in data.items())


def _num(value) -> str:
    return f'<td class="num">{_e(value)}</td>'


def _ms(seconds) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.1f} ms"


def headline(r: RequestView) -> dict:
    """What the details panel leads with: TTFT, queue time, TPOT (decode time per token after the
    first, as vllm bench serve counts it), e2e, token counts; None where the span does not say."""
    a = r.attributes
    out = a.get("gen_ai.usage.output_tokens")
    decode = a.get("pegainfer.decode_s")
    queue = a.get("pegainfer.queue_s")
    if queue is None and "queue" in r.phases:
        start, end = r.phases["queue"]
        queue = (end - start) / 1e9
    return {"ttft_s": a.get("pegainfer.ttft_s"), "queue_s": queue,
            "tpot_s": decode / (out - 1) if decode is not None and isinstance(out, int) and out > 1 else None,
            "e2e_s": a.get("pegainfer.e2e_s"), "input_tokens": a.get("gen_ai.usage.input_tokens"),
            "output_tokens": out, "terminal_reason": r.terminal_reason}


def _badge(reason: str) -> str:
    return f'<span class="badge" style="background:var(--{_e(reason)})">{_e(reason)}</span>'


def render(requests: list[RequestView], steps: list[StepView], *, source: str) -> str:
    t0 = min([r.start_ns for r in requests] + [s.start_ns for s in steps], default=0)
    t1 = max([r.end_ns for r in requests] + [s.end_ns for s in steps], default=t0)
    duration_us = max(1, (t1 - t0) // 1000)

    def us(ns: int) -> int:
        return (ns - t0) // 1000

    counts = collections.Counter(r.terminal_reason for r in requests)
    reasons = [r for r in [*REASONS, *sorted(set(counts) - set(REASONS))] if counts[r]]
    number = {r.request_id: n for n, r in enumerate(requests, 1)}
    out = ['<!doctype html><html lang="en"><head><meta charset="utf-8">',
           f"<title>pegainfer trace: {len(requests)} requests</title><style>{STYLE}</style></head><body>",
           '<header id="summary"><h1>pegainfer trace</h1>',
           f'<div class="meta">{_e(source)} &middot; {iso(t0)} &rarr; {iso(t1)} ({(t1 - t0) / 1e9:.2f} s) &middot; '
           f'<span id="request-count">{len(requests)}</span> requests &middot; '
           f'<span id="step-count">{len(steps)}</span> engine steps</div><div id="reason-counts">',
           *(f'<span class="badge" style="background:var(--{_e(r)})" data-reason="{_e(r)}">{_e(r)}: {counts[r]}</span>'
             for r in reasons),
           '</div></header>', _controls(reasons, counts, duration_us),
           f'<div id="layout"><main id="timeline"><table id="waterfall"><thead><tr>{WATERFALL_HEAD}</tr></thead><tbody>', _engine_lane(steps, us),
           *(_request_row(r, number[r.request_id], us) for r in requests)]
    if not requests:
        out.append('<tr><td colspan="7" class="empty">no requests in this selection</td></tr>')
    out += ['</tbody></table><section id="engine"><h2>Engine steps: which requests shared each step</h2>',
            f'<table id="steps"><thead><tr>{STEPS_HEAD}</tr></thead><tbody>',
            *(_step_row(s, number, us) for s in steps[:MAX_STEP_ROWS])]
    if len(steps) > MAX_STEP_ROWS:
        out.append(f'<tr><td colspan="9" class="empty">{len(steps) - MAX_STEP_ROWS} more steps not listed '
                   '(narrow the window with --since/--until)</td></tr>')
    out.append('</tbody></table></section></main><aside id="details"><h2>Details</h2><div id="details-body">'
               '<p class="empty">Click a request row, an engine step row or a bar in the engine lane.</p>'
               '</div></aside></div>')
    data = {"duration_us": duration_us, "request_count": len(requests), "numbers": number,
            "requests": {r.request_id: {"attributes": r.attributes, "steps": r.steps, "headline": headline(r)}
                         for r in requests},
            "steps": {str(s.index): {"attributes": s.attributes, "request_ids": s.request_ids,
                                     "duration_s": (s.end_ns - s.start_ns) / 1e9} for s in steps}}
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    out.append(f'<script type="application/json" id="trace-data">{payload}</script><script>{SCRIPT}</script>')
    out.append("</body></html>")
    return "\n".join(out)


def _controls(reasons: list[str], counts: collections.Counter, duration_us: int) -> str:
    checks = "".join(f'<label><input type="checkbox" class="reason-filter" value="{_e(r)}" checked> '
                     f'<span class="swatch" style="background:var(--{_e(r)})"></span>{_e(r)} ({counts[r]})</label>'
                     for r in reasons)
    # step="any": a stepped slider snaps its ends onto the step grid, which hid the requests past the
    # last grid point (a 7,901,234 µs trace, step 7,901: "to" stopped at 7,901,000)
    slider = f'type="range" min="0" max="{duration_us}" step="any"'
    legend = "".join(f'<span><span class="swatch {cls}" style="{style}"></span>{text}</span>'
                     for cls, style, text in LEGEND)
    button = '<button id="{}" type="button" title="{}">{}</button>'.format
    return (f'<section id="controls"><div class="group" id="reason-filters"><b>terminal reason</b>{checks}</div>'
            '<div class="group" id="find"><b>search</b><input id="search" type="search" '
            'placeholder="request id or #number" aria-label="search by request id" autocomplete="off"></div>'
            f'<div class="group" id="window"><b>time window</b>'
            f'<label>from <input id="since" {slider} value="0"> <span id="since-label"></span></label>'
            f'<label>to <input id="until" {slider} value="{duration_us}"> <span id="until-label"></span></label>'
            f'<span class="zoom">{button("zoom-in", "zoom in (+, Ctrl+wheel)", "+")}'
            f'{button("zoom-out", "zoom out (-)", "&minus;")}'
            f'{button("pan-left", "pan left (&larr;, drag a lane, Shift+wheel)", "&larr;")}'
            f'{button("pan-right", "pan right (&rarr;)", "&rarr;")} <span id="zoom-level"></span></span>'
            f'{button("reset", "show everything (0)", "reset")}<span id="shown-count"></span>'
            '<span class="hint">drag a lane or Shift+wheel to pan, Ctrl+wheel to zoom</span></div>'
            f'<div class="group legend">{legend}</div></section>')


def _engine_lane(steps: list[StepView], us: Callable[[int], int]) -> str:
    rows_max = max((s.attributes.get("pegainfer.step.rows", 1) for s in steps), default=1) or 1
    bars = []
    for s in steps:
        height = max(15, round(100 * s.attributes.get("pegainfer.step.rows", 1) / rows_max))
        title = f"step {s.index} {s.phase}: {len(s.request_ids)} requests, {(s.end_ns - s.start_ns) / 1e6:.2f} ms"
        bars.append(f'<div class="step-bar phase-{_e(s.phase)}" id="step-bar-{s.index}" style="height:{height}%" '
                    f'{_attrs(data_step_index=s.index, data_start_us=us(s.start_ns), data_end_us=us(s.end_ns))} '
                    f'title="{_e(title)}"></div>')
    return ('<tr id="engine-lane" class="engine-row"><td colspan="4">engine steps (bar height: batch rows)</td>'
            '<td class="col-e2e"></td><td class="col-tokens"></td>'  # hidden with their columns on narrow windows
            f'<td class="lane"><div class="track">{"".join(bars)}</div></td></tr>')


def _request_row(r: RequestView, n: int, us: Callable[[int], int]) -> str:
    a = r.attributes
    bars = [f'<div class="bar root" {_attrs(data_start_us=us(r.start_ns), data_end_us=us(r.end_ns))}></div>']
    for name in PHASES:
        if name in r.phases:
            start, end = r.phases[name]
            bars.append(f'<div class="bar phase-{name}" {_attrs(data_phase=name, data_start_us=us(start))} '
                        f'data-end-us="{us(end)}" title="{name}: {(end - start) / 1e6:.2f} ms"></div>')
    if r.first_token_ns is not None:
        bars.append(f'<div class="marker first-token" data-start-us="{us(r.first_token_ns)}" '
                    f'title="first token at {iso(r.first_token_ns)}"></div>')
    bars.append(f'<div class="marker terminal" data-start-us="{us(r.end_ns)}" '
                f'style="background:var(--{_e(r.terminal_reason)})" '
                f'title="{_e(r.terminal_reason)} at {iso(r.end_ns)}"></div>')
    row = _attrs(data_request_id=r.request_id, data_terminal_reason=r.terminal_reason, data_request_number=n,
                 data_trace_id=r.trace_id, data_start_us=us(r.start_ns), data_end_us=us(r.end_ns))
    title = f"{r.request_id} trace {r.trace_id} span {r.span_id}"
    tokens = f"{a.get('gen_ai.usage.input_tokens', '')}/{a.get('gen_ai.usage.output_tokens', '')}"
    return (f'<tr class="request-row" {row}>{_num(n)}<td class="rid" title="{_e(title)}">{_e(r.request_id)}</td>'
            f'<td>{_badge(r.terminal_reason)}</td>{_num(_ms(a.get("pegainfer.ttft_s")))}'
            f'<td class="num col-e2e">{_e(_ms(a.get("pegainfer.e2e_s")))}</td>'
            f'<td class="num col-tokens">{_e(tokens)}</td>'
            f'<td class="lane"><div class="track">{"".join(bars)}</div></td></tr>')


def _step_row(s: StepView, number: dict[str, int], us: Callable[[int], int]) -> str:
    a = s.attributes
    chips = "".join(f'<span class="req-chip" {_attrs(data_request_id=rid, title=rid)}>#{number.get(rid, "?")}</span>'
                    for rid in s.request_ids)
    row = _attrs(data_step_index=s.index, data_phase=s.phase, data_request_ids=" ".join(s.request_ids),
                 data_start_us=us(s.start_ns), data_end_us=us(s.end_ns))
    cells = [s.index, f"+{us(s.start_ns) / 1e3:.1f} ms", f"{(s.end_ns - s.start_ns) / 1e6:.2f} ms",
             *(a.get(f"pegainfer.step.{k}", "") for k in ("rows", "decode_rows", "prefill_tokens", "kv_slots_used"))]
    return (f'<tr class="step-row" {row}>{_num(cells[0])}<td>{_e(s.phase)}</td>{"".join(map(_num, cells[1:]))}'
            f'<td>{chips}</td></tr>')
