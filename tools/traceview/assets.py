"""The trace viewer page's stylesheet and script, inlined into every page (no CDN, no network):
viewer.css (the layout: timeline and details panel side by side, the panel below on a narrow
window) and viewer.js (bars on the time axis, filters, search, zoom and pan, the details panel).
They live beside this module as plain files so that they read, diff and lint as CSS and JS."""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

STYLE = (_HERE / "viewer.css").read_text()
SCRIPT = (_HERE / "viewer.js").read_text()
