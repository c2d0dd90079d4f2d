"""The trace viewer page in headless Chromium at two window sizes, on a made-up trace of 29 requests
over 7.901234 s whose last request starts in the final 7,901 µs (where a stepped slider used to
stop, hiding it): every request shows on load; the details panel never covers the timeline and the
controls stay whole at 1100 and 1600 px (measured with getBoundingClientRect in the page); zoom,
pan (buttons, Ctrl+wheel, drag), search by request id and a details panel that leads with TTFT,
queue time and TPOT."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tools.browser import dump_dom, probe, rows, screenshot
from tools.traceview import page as trace_page
from tools.traceview import reader

T0 = 1_767_225_600_000_000_000  # ns
TOTAL_US = 7_901_234
N = 29
SIZES = [(1100, 800), (1600, 900)]
REASONS = ("completed_length", "completed_stop", "cancelled", "disconnected", "failed")  # and one rejected


def _attr(key: str, value) -> dict:
    if isinstance(value, bool):
        v = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [{"stringValue": x} for x in value]}}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def _span(trace: str, span: str, name: str, start_us: int, end_us: int, attrs: dict, parent: str = "",
          events: list[dict] | None = None) -> dict:
    return {"traceId": trace, "spanId": span, "parentSpanId": parent, "name": name, "kind": 2,
            "startTimeUnixNano": str(T0 + start_us * 1000), "endTimeUnixNano": str(T0 + end_us * 1000),
            "attributes": [_attr(k, v) for k, v in attrs.items()], "events": events or []}


def rid(i: int) -> str:
    return f"cmpl-synth{i:04d}"


def synthetic_trace(path: Path) -> Path:
    spans = []
    for i in range(N - 1):  # 28 requests that ran, 0.5 s each, a new one every 0.27 s
        start, trace = i * 270_000, f"{i + 1:032x}"
        q, p, end = start + 3_000, start + 12_000, start + 500_000
        attrs = {"gen_ai.operation.name": "text_completion", "gen_ai.response.id": rid(i),
                 "pegainfer.terminal_reason": REASONS[i % len(REASONS)], "pegainfer.ttft_s": 0.012,
                 "pegainfer.queue_s": 0.003, "pegainfer.decode_s": (end - p) / 1e6, "pegainfer.e2e_s": 0.5,
                 "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 25}
        first = [{"name": "first_token", "timeUnixNano": str(T0 + p * 1000), "attributes": []}]
        spans += [_span(trace, f"{2 * i + 1:016x}", "text_completion tiny", start, end, attrs, events=first),
                  _span(trace, f"{1000 + i:016x}", "queue", start, q, {}, parent=f"{2 * i + 1:016x}"),
                  _span(trace, f"{2000 + i:016x}", "prefill", q, p, {}, parent=f"{2 * i + 1:016x}"),
                  _span(trace, f"{3000 + i:016x}", "decode", p, end, {}, parent=f"{2 * i + 1:016x}")]
    last = {"gen_ai.operation.name": "text_completion", "gen_ai.response.id": rid(N - 1),
            "pegainfer.terminal_reason": "rejected"}  # refused at the very end of the trace
    spans.append(_span("f" * 32, "f" * 16, "text_completion tiny", TOTAL_US - 134, TOTAL_US, last))
    for k in range(40):  # engine steps every 0.19 s, each shared by the requests running then
        start = k * 190_000
        ids = [rid(i) for i in range(N - 1) if i * 270_000 <= start < i * 270_000 + 500_000]
        spans.append(_span("e" * 32, f"{9000 + k:016x}", "engine_step decode", start, start + 2_000,
                           {"pegainfer.step.index": k, "pegainfer.step.phase": "decode",
                            "pegainfer.step.rows": len(ids), "pegainfer.step.request_ids": ids}))
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n"
                            for s in spans))
    return path


@pytest.fixture(scope="module")
def synth_page(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("synth")
    requests, steps = reader.build(reader.load(str(synthetic_trace(d / "trace.jsonl"))))
    assert len(requests) == N and requests[-1].request_id == rid(N - 1)
    out = d / "trace.html"
    out.write_text(trace_page.render(requests, steps, source="synthetic"))
    return out


def test_every_request_shows_on_load_and_the_slider_is_continuous(synth_page: Path, tmp_path: Path):
    dom = dump_dom(synth_page, tmp_path / "profile", SIZES[0])
    parsed = rows(dom)
    assert len(parsed.requests) == N and parsed.text["shown-count"] == f"{N} of {N} requests shown"
    assert not [r for r in parsed.requests if "hidden" in r.get("class", "").split()]
    assert dom.count('step="any"') == 2  # no step grid for the ends to snap to


LAYOUT = """
const box = el => { const b = el.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
const q = s => document.querySelector(s);
const whole = el => { const b = el.getBoundingClientRect();
  const hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
  return b.left >= 0 && b.right <= document.documentElement.clientWidth && (hit === el || el.contains(hit)); };
const lanes = [...document.querySelectorAll('#waterfall tr:not(.hidden) td.lane')].map(box);
const main = q('main');
return {width: document.documentElement.clientWidth, details: box(q('#details')), timeline: box(main),
        top: [box(q('header')), box(q('#controls')), ...[...document.querySelectorAll('#controls .group > *')].map(box)],
        lanes: lanes, overflow: main.scrollWidth - main.clientWidth,
        controls: ['#reset', '#since', '#until', '#zoom-in', '#zoom-out', '#pan-left', '#pan-right', '#search']
          .filter(s => !q(s) || !whole(q(s)))};  // missing, off screen or covered
"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}px")
def test_the_details_panel_never_covers_the_timeline(synth_page: Path, tmp_path: Path, size):
    m = probe(synth_page, LAYOUT, tmp_path / "profile", size)
    assert m["width"] == size[0]
    for lane in [m["timeline"], *m["lanes"], *m["top"]]:  # nor the header, the controls or the legend
        assert not _overlap(m["details"], lane), (m["details"], lane)
    assert m["controls"] == []  # every control there, whole on screen and not covered (reset included)
    assert m["details"][0] >= m["timeline"][2] - 0.5  # beside it, to the right
    assert m["overflow"] <= 0  # the timeline fits its column: no sideways scrolling
    assert len(m["lanes"]) == N + 1  # every request's lane and the engine lane
    shot = tmp_path / f"trace_view_{size[0]}.png"
    screenshot(synth_page, shot, tmp_path / "profile", fragment=f"#request={rid(7)}", size=size)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


INTERACT = """
const q = s => document.querySelector(s), win = () => [+q('#since').value, +q('#until').value];
const count = () => q('#shown-count').textContent, out = {load: win()};
q('#zoom-in').click(); out.zoomed = win();
q('#pan-right').click(); out.panned = win();
q('#zoom-out').click(); q('#zoom-out').click(); out.out = win();
q('#reset').click(); q('#zoom-in').click();
const track = q('#waterfall tr.request-row:not(.hidden) .track'), b = track.getBoundingClientRect();
out.width = b.width; out.before_wheel = win();
track.dispatchEvent(new WheelEvent('wheel', {deltaY: -300, ctrlKey: true, clientX: b.left + b.width / 4,
  clientY: b.top + 4, bubbles: true, cancelable: true}));
out.wheel = win();
out.before_drag = win();
track.dispatchEvent(new MouseEvent('mousedown', {button: 0, clientX: b.left + 200, clientY: b.top + 4, bubbles: true}));
window.dispatchEvent(new MouseEvent('mousemove', {clientX: b.left + 100, clientY: b.top + 4, bubbles: true}));
window.dispatchEvent(new MouseEvent('mouseup', {clientX: b.left + 100, clientY: b.top + 4, bubbles: true}));
out.drag = win(); out.zoomed_count = count();
q('#reset').click(); out.reset = win();
const s = q('#search'); s.value = 'SYNTH0007'; s.dispatchEvent(new Event('input'));
out.search = count();
s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
out.title = q('#details-body h3').textContent;
out.metrics = [...document.querySelectorAll('#details-body .metric')].map(m => [m.dataset.metric,
  m.querySelector('.v').textContent]);
s.value = '#29'; s.dispatchEvent(new Event('input')); out.by_number = count();
s.value = 'no-such-id'; s.dispatchEvent(new Event('input')); out.none = count();
q('#reset').click(); out.after_reset = count();
q('tr.step-row').click(); out.step = [q('#details-body h3').textContent,
  [...document.querySelectorAll('#details-body .metric')].map(m => m.dataset.metric)];
return out;
"""


def test_zoom_pan_search_and_details(synth_page: Path, tmp_path: Path):
    r = probe(synth_page, INTERACT, tmp_path / "profile", SIZES[1])
    total = TOTAL_US
    assert r["load"] == [0, total]
    assert r["zoomed"] == pytest.approx([total / 4, 3 * total / 4])  # half the width, same middle
    assert r["panned"] == pytest.approx([total / 4 + total / 8, 3 * total / 4 + total / 8])
    assert r["out"] == pytest.approx([0, total])  # zooming out stops at the whole trace
    a, b = r["before_wheel"]
    w = b - a
    c, d = r["wheel"]  # Ctrl+wheel up: zoom in by e^0.6 around the pointer, a quarter across
    assert d - c == pytest.approx(w * 2.718281828 ** -0.6, rel=1e-6)
    # the time under the pointer stays put (to a pixel: a MouseEvent's clientX is a whole number)
    assert c + (d - c) / 4 == pytest.approx(a + w / 4, abs=w / r["width"])
    (a, b), (c, d) = r["before_drag"], r["drag"]  # dragged 100 px left: the window moves later in time
    assert c - a == pytest.approx(100 / r["width"] * (b - a), rel=1e-6) and d - c == pytest.approx(b - a)
    assert r["zoomed_count"] != f"{N} of {N} requests shown"  # rows outside the window are hidden
    assert r["reset"] == [0, total]
    assert r["search"] == f"1 of {N} requests shown"
    assert r["title"] == f"#8 {rid(7)}"
    assert [k for k, _ in r["metrics"][:3]] == ["ttft", "queue", "tpot"]
    values = dict(r["metrics"])
    assert values["ttft"] == "12.0 ms" and values["queue"] == "3.0 ms"
    assert values["tpot"] == "20.3 ms"  # decode 0.488 s over 24 tokens after the first
    assert r["by_number"] == f"1 of {N} requests shown" and r["none"] == f"0 of {N} requests shown"
    assert r["after_reset"] == f"{N} of {N} requests shown"
    assert r["step"] == ["engine step 0", ["phase", "duration", "rows"]]


def test_headline_numbers_come_from_the_span(tmp_path: Path):
    requests, _ = reader.build(reader.load(str(synthetic_trace(tmp_path / "t.jsonl"))))
    h = trace_page.headline(requests[0])
    assert h["ttft_s"] == 0.012 and h["queue_s"] == 0.003 and h["tpot_s"] == pytest.approx(0.488 / 24)
    assert trace_page.headline(requests[-1])["tpot_s"] is None  # rejected: no tokens, no TPOT

