"""PNG plots of a serving sweep against concurrency: output throughput, TTFT and TPOT (median and
p99; bars span the repeats' min..max). Every y axis starts at 0, so that a small difference never
looks like a large one. matplotlib with the Agg backend, imported only here."""
from __future__ import annotations

from pathlib import Path

FIGURES = {  # file stem -> (title, y label, [(metric key, legend)])
    "output_throughput": ("Output throughput", "output tokens / s", [("output_throughput", "output tok/s")]),
    "ttft": ("Time to first token", "ms", [("median_ttft_ms", "median"), ("p99_ttft_ms", "p99")]),
    "tpot": ("Time per output token", "ms", [("median_tpot_ms", "median"), ("p99_tpot_ms", "p99")]),
}


class PlotsUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotsUnavailable(f"matplotlib is not installed ({e})") from None
    return plt


def plot_levels(levels: list[dict], out_dir: Path, title_suffix: str = "") -> list[Path]:
    """One PNG per figure; levels are the report's levels (concurrency + across-repeats summary)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem in FIGURES:
        fig = figure(levels, stem, title_suffix)
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def figure(levels: list[dict], stem: str, title_suffix: str = ""):
    """One figure of FIGURES (a matplotlib Figure, not yet saved)."""
    plt = _pyplot()
    title, ylabel, series = FIGURES[stem]
    xs = [lv["concurrency"] for lv in levels]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for key, label in series:
        pts = [(x, lv["summary"][key]) for x, lv in zip(xs, levels) if lv["summary"][key]["median"] is not None]
        if not pts:
            continue
        x = [p[0] for p in pts]
        mid = [p[1]["median"] for p in pts]
        err = [[m - p[1]["min"] for m, p in zip(mid, pts)], [p[1]["max"] - m for m, p in zip(mid, pts)]]
        ax.errorbar(x, mid, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel(ylabel)
    ax.set_title(title + title_suffix)
    ax.set_ylim(bottom=0)  # after the data: the top still fits the largest bar
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    return fig
