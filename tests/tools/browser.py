"""Headless Chromium for the viewer tests: --dump-dom (the DOM after the page's scripts ran) at a
given window size, a probe (a copy of the page with a test script run after the page's own, which
measures or clicks and writes JSON into the DOM for --dump-dom to bring back) and --screenshot,
with a throwaway profile and nothing that reaches the network. Debian: apt-get install -y chromium.
Without it the browser tests skip, except under CI (CI set), where they fail."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        message = "chromium not found (Debian: apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return exe


def _run(args: list[str], profile: Path, url: str) -> str:
    proc = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args, url], capture_output=True,
                          text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def dump_dom(page: Path, profile: Path, size: tuple[int, int] = (1400, 900)) -> str:
    return _run(["--dump-dom", f"--window-size={size[0]},{size[1]}", "--hide-scrollbars"], profile,
                page.resolve().as_uri())


def probe(page: Path, script: str, profile: Path, size: tuple[int, int] = (1400, 900)) -> dict:
    """Run `script` (a JS function body that returns a JSON-able value) in the page after its own
    script, at this window size; its return value, read back from the dumped DOM."""
    copy = profile.parent / f"{page.stem}-probe-{size[0]}x{size[1]}.html"
    wrapped = (f"<script>(function () {{ let out; try {{ out = (function () {{ {script} }})(); }} "
               "catch (e) { out = {probe_error: String(e && e.stack || e)}; } "
               "const pre = document.createElement('pre'); pre.id = 'probe-result'; "
               "pre.textContent = JSON.stringify(out); document.body.appendChild(pre); })();</script>")
    copy.write_text(page.read_text().replace("</body>", wrapped + "</body>"))
    dom = dump_dom(copy, profile, size)
    found = re.search(r'<pre id="probe-result">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    result = json.loads(html.unescape(found[1]))
    assert not (isinstance(result, dict) and "probe_error" in result), result
    return result


def screenshot(page: Path, out: Path, profile: Path, fragment: str = "", size: tuple[int, int] = (1400, 900)) -> None:
    _run([f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", "--hide-scrollbars"], profile,
         page.resolve().as_uri() + fragment)


class Rows(HTMLParser):
    """The attributes of tr.request-row and tr.step-row elements, and the text of elements by id."""

    def __init__(self, text_ids: tuple[str, ...] = ("shown-count", "request-count", "step-count")) -> None:
        super().__init__()
        self.requests: list[dict[str, str]] = []
        self.steps: list[dict[str, str]] = []
        self.styled_bars = 0
        self.text: dict[str, str] = {}
        self._text_ids = text_ids
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "tr" and "request-row" in classes:
            self.requests.append(a)
        elif tag == "tr" and "step-row" in classes:
            self.steps.append(a)
        if "bar" in classes and "left:" in a.get("style", ""):
            self.styled_bars += 1
        if a.get("id") in self._text_ids:
            self._open = a["id"]
            self.text[self._open] = ""

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.text[self._open] += data

    def handle_endtag(self, tag: str) -> None:
        self._open = None


def rows(html_text: str) -> Rows:
    parser = Rows()
    parser.feed(html_text)
    return parser
