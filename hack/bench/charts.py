"""Draws the charts of docs/bench from the figures one `make bench` run recorded (hack/bench.sh).

    charts.py FIGURES.jsonl OUT_DIR

Each line of FIGURES is one point, {"chart", "unit", "series", "x", "y"}, written by the Rust benchmarks
(testkit/src/figures.rs) and the Go ones. Each chart becomes OUT_DIR/<chart>.png: a latency distribution
(x: percentile) as cumulative curves, numeric x as lines, labelled x as grouped bars.
"""

import collections
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

TITLES = {
    "sends-throughput": "ACK-tracked sends between two daemons: throughput",
    "sends-latency": "ACK-tracked sends: Send -> ACKED at 1,000 messages/s",
    "watch-latency": "One ConfigMap change: write -> arrival",
    "watch-fanout": "Watch fan-out from one shared watch",
    "barrier": "Replica barrier against replicas",
    "idle-requests": "apiserver requests of an idle daemon",
    "handover-at-scale": "Leadership change among N daemons",
    "handover": "Graceful leader handover",
    "informers-watches": "apiserver watches: an informer in each app, or one consistd",
    "informers-rss": "Memory of the apps (and the sidecar)",
    "informers-apiserver-cpu": "apiserver CPU while the ConfigMaps change",
    "kopf-executions": "Kopf or consistd: handler executions per ConfigMap change, by handler time",
    "kopf-repeats": "Kopf or consistd: executions of a value already handled (goal 0)",
    "kopf-latency-p50": "Kopf or consistd: ConfigMap change -> handler, median",
    "kopf-latency-p99": "Kopf or consistd: ConfigMap change -> handler, p99",
    "kopf-watches": "Kopf or consistd: apiserver watches one app opened",
    "reconcile-grants": "Reconcile queue: leases granted to one app, 10,000 keys",
    "reconcile-memory": "Reconcile queue: memory per key",
    "fencing-window": "Fencing: from a Lease write's answer to the old term's first refusal",
    "fencing-write": "A patch through the daemon: unguarded or fenced at the apiserver",
}
DISTRIBUTIONS = {"sends-latency", "watch-latency", "fencing-write"}
# Charts recorded one sample per round (x: the round): drawn as their distribution.
SAMPLES = {"fencing-window"}
XLABELS = {
    "watch-fanout": "subscribers",
    "barrier": "replicas",
    "idle-requests": "daemons (or client-go candidates)",
    "handover-at-scale": "daemons",
    "reconcile-grants": "leases the app holds at once",
}
# Lines with more points than this carry no figure at each point.
ANNOTATED_POINTS = 12
LOG_X = {"idle-requests", "watch-fanout", "barrier", "handover-at-scale"}
LOG_Y = {"handover-at-scale"}


def number(y):
    """A figure as a reader writes it: 36,555 or 93.5 or 0.645."""
    return f"{y:,.0f}" if abs(y) >= 100 else f"{y:.3g}"


def load(path):
    charts = collections.defaultdict(lambda: {"unit": "", "series": collections.defaultdict(list)})
    for number, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            point = json.loads(line)
            chart = charts[point["chart"]]
            chart["unit"] = point["unit"]
            chart["series"][point["series"]].append((point["x"], float(point["y"])))
        except (ValueError, KeyError) as error:
            sys.exit(f"charts: {path}:{number}: not a figure ({error}): {line!r}")
    return charts


def as_distribution(chart):
    """A chart of one sample per round as percentile points, as `record_distribution` records them."""
    for name, points in chart["series"].items():
        ys = sorted(y for _, y in points)
        last = max(len(ys) - 1, 1)
        chart["series"][name] = [(100 * i / last, y) for i, y in enumerate(ys)]
    return chart


def distribution(ax, chart):
    for name, points in chart["series"].items():
        points.sort()
        ax.plot([y for _, y in points], [x for x, _ in points], label=name)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(chart["unit"] + " (log scale)")
    ax.set_ylabel("percentile")
    ax.set_yticks([0, 25, 50, 75, 90, 99])


def lines(ax, chart, log_x, log_y):
    for name, points in chart["series"].items():
        points.sort()
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        for x, y in points if len(points) <= ANNOTATED_POINTS else []:
            ax.annotate(number(y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    if log_x:
        ax.set_xscale("log")
        xs = sorted({x for points in chart["series"].values() for x, _ in points})
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylabel(chart["unit"] + (" (log scale)" if log_y else ""))
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def bars(ax, chart):
    groups = list(dict.fromkeys(x for points in chart["series"].values() for x, _ in points))
    names = list(chart["series"])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = dict(chart["series"][name])
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ys = [values.get(group, 0.0) for group in groups]
        drawn = ax.bar(xs, ys, width, label=name)
        ax.bar_label(drawn, labels=[number(y) if group in values else "" for group, y in zip(groups, ys)], fontsize=8)
    ax.set_xticks(range(len(groups)), [str(g) for g in groups])
    ax.set_ylabel(chart["unit"])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    charts = load(sys.argv[1])
    if not charts:
        sys.exit(f"charts: no figures in {sys.argv[1]}")
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, chart in sorted(charts.items()):
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        numeric = all(isinstance(x, (int, float)) for points in chart["series"].values() for x, _ in points)
        if name in SAMPLES:
            distribution(ax, as_distribution(chart))
        elif name in DISTRIBUTIONS:
            distribution(ax, chart)
        elif numeric:
            lines(ax, chart, name in LOG_X, name in LOG_Y)
        else:
            bars(ax, chart)
        if name in XLABELS:
            ax.set_xlabel(XLABELS[name])
        ax.set_title(TITLES.get(name, name))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png")
        plt.close(fig)
        print(f"charts: {out / name}.png")


if __name__ == "__main__":
    main()
