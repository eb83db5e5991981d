"""Draws the charts of docs/bench from the figures one `make bench` run recorded (hack/bench.sh).

    charts.py FIGURES.jsonl OUT_DIR

Each line of FIGURES is one point, {"chart", "unit", "series", "x", "y"}, written by the Rust benchmarks
(testkit/src/figures.rs) and the Go ones. Each chart becomes OUT_DIR/<chart>.png: a latency distribution
(x: percentile) as cumulative curves, numeric x as lines, labelled x as grouped bars. From the idle
requests per daemon at the sizes measured, it also projects the apiserver's idle load at 1,000 and 10,000
pods (idle-projection.png, and a table on stdout).
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
    "watch-memory-1kib": "Memory per watched 1 KiB ConfigMap, by view, beside client-go's informer",
    "watch-memory-3kib": "Memory per watched 3 KiB ConfigMap, by view, beside client-go's informer",
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
    "kopf-passes": "Kopf, JOSDK or consistd: passes per ConfigMap change, by handler time",
    "kopf-writes": "Kopf, JOSDK or consistd: apiserver writes per ConfigMap change",
    "reconcile-grants": "Reconcile queue: leases granted to one app, 10,000 keys",
    "reconcile-memory": "Reconcile queue: memory per key",
    "fencing-window": "Fencing: from a Lease write's answer to the old term's first refusal",
    "fencing-write": "A patch through the daemon: unguarded or fenced at the apiserver",
    "sharded-passes": "Sharded queue: passes/s over 10,000 keys, 20 ms handler",
    "sharded-latency": "Sharded queue: change -> handler at 200 changes/s",
    "sharded-moves": "Sharded queue under load: until every slot has an owner again",
    "shard-watch-bytes": "Sharded queue, 4 daemons: bytes the apiserver sent each",
    "shard-watch-events": "Sharded queue, 4 daemons: watch events each took in",
    "operator-loc": "The Greeting operator: lines of code",
    "operator-passes": "The Greeting operator: passes per Greeting per change",
    "operator-rss": "The Greeting operator: memory of the operator (and the sidecar)",
}
DISTRIBUTIONS = {"sends-latency", "watch-latency", "fencing-write"}
# Charts recorded one sample per round (x: the round): drawn as their distribution.
SAMPLES = {"fencing-window"}
XLABELS = {
    "watch-fanout": "subscribers",
    "watch-memory-1kib": "ConfigMaps watched",
    "watch-memory-3kib": "ConfigMaps watched",
    "barrier": "replicas",
    "idle-requests": "daemons (or client-go candidates)",
    "handover-at-scale": "daemons",
    "reconcile-grants": "leases the app holds at once",
    "sharded-passes": "replicas",
    "sharded-latency": "replicas",
}
# Lines with more points than this carry no figure at each point.
ANNOTATED_POINTS = 12
LOG_X = {"watch-memory-1kib", "watch-memory-3kib", "idle-requests", "watch-fanout", "barrier", "handover-at-scale"}
LOG_Y = {"handover-at-scale"}
# Pods the idle load is projected to, from the sizes measured.
PROJECTED = (1_000, 10_000)


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


def fit(points):
    """The line a * x + b through (x, total) points by least squares (through the origin for one point)."""
    n = len(points)
    sx, sy = sum(x for x, _ in points), sum(y for _, y in points)
    if n < 2:
        return (sy / sx if sx else 0.0), 0.0
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    a = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return a, (sy - a * sx) / n


def projection(chart, out):
    """Total idle apiserver requests/s against pods: measured (per-daemon figure times daemons), then a
    straight line through them carried on to PROJECTED; drawn, and printed as a table."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    print("| pods | " + " | ".join(f"{name}: requests/s" for name in chart["series"]) + " |")
    print("| --- |" + " --- |" * len(chart["series"]))
    rows = collections.defaultdict(dict)
    for name, points in chart["series"].items():
        totals = sorted((x, x * y) for x, y in points)
        a, b = fit(totals)
        line = ax.plot([x for x, _ in totals], [y for _, y in totals], marker="o", label=f"{name}, measured")
        ahead = [(totals[-1][0], totals[-1][1])] + [(n, a * n + b) for n in PROJECTED]
        ax.plot([x for x, _ in ahead], [y for _, y in ahead], "--", marker="s", color=line[0].get_color(),
                label=f"{name}, projected")
        for x, y in ahead[1:]:
            ax.annotate(number(y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        for x, y in totals:
            rows[x][name] = f"{y:,.1f}"
        for n in PROJECTED:
            rows[n][name] = f"{number(a * n + b)} (projected)"
    for x in sorted(rows):
        print(f"| {x:,g} | " + " | ".join(rows[x].get(name, "") for name in chart["series"]) + " |")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Room above the highest figure for its label.
    ax.set_ylim(top=max(y for line in ax.get_lines() for y in line.get_ydata()) * 3)
    ax.set_xlabel("pods (daemons, or client-go candidates) in one election group (log scale)")
    ax.set_ylabel("apiserver requests/s, all of them (log scale)")
    ax.set_title("Idle apiserver load: measured, and projected to 1,000 and 10,000 pods")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "idle-projection.png")
    plt.close(fig)
    print(f"charts: {out / 'idle-projection'}.png")


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
    if "idle-requests" in charts:
        projection(charts["idle-requests"], out)


if __name__ == "__main__":
    main()
