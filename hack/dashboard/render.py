"""Draws a Grafana dashboard's panels from a real Prometheus, headless: every panel's queries over a time
window, laid out by the panels' gridPos, into one PNG. Exits 1 naming the panels whose queries returned no
data (the dashboard would show nothing there). Used by hack/dashboard.sh."""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCRAPE_INTERVAL = 1  # seconds, as hack/dashboard.sh configures Prometheus
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL}s"  # Grafana's $__rate_interval: at least four scrape intervals
UNIT_LABELS = {"s": "seconds", "ops": "per second", "reqps": "calls per second", "short": ""}


def query_range(prometheus: str, expr: str, start: int, end: int) -> list[dict]:
    """The series of one PromQL expression over [start, end], a point every 2 s."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 2})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr!r}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--start", type=int, required=True)
    parser.add_argument("--end", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dashboard = json.load(open(args.dashboard))
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_h = 0.36  # inches per grid row
    fig = plt.figure(figsize=(18, rows * unit_h))
    fig.suptitle(f"{dashboard['title']}: {dashboard['description']}", fontsize=11, y=0.999)
    empty = []
    for p in panels:
        g = p["gridPos"]
        left, width = g["x"] / 24, g["w"] / 24
        bottom = 1 - (g["y"] + g["h"]) / rows
        if p["type"] == "row":
            fig.text(0.005, bottom + 0.2 / rows, p["title"], fontsize=12, weight="bold")
            continue
        ax = fig.add_axes((left + 0.035, bottom + 1.6 / rows, width - 0.05, (g["h"] - 2.4) / rows))
        ax.set_title(p["title"], fontsize=10, loc="left")
        plotted = 0
        for target in p["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$namespace", ".*")
            for series in query_range(args.prometheus, expr, args.start, args.end):
                points = [(float(t) - args.start, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf")]
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, ys, label=legend(target.get("legendFormat", ""), series["metric"]), linewidth=1.2)
                plotted += 1
        if plotted == 0:
            empty.append(p["title"])
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="red")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        ax.set_ylabel(UNIT_LABELS.get(unit, unit), fontsize=8)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if plotted:
            ax.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.6)
    fig.savefig(args.out, dpi=80)
    if empty:
        print(f"render: panels with no data: {', '.join(empty)}", file=sys.stderr)
        return 1
    print(f"render: {sum(p['type'] != 'row' for p in panels)} panels with data", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
