"""A job's report as one self-contained HTML page: plots as inline SVG, no scripts, no
network needed to open it (a file mailed to someone still works).

Each plot is a <figure> whose `data-series` attribute holds the plotted values as JSON
(bucket starts in Unix seconds, values as plotted), so a test, or anyone, can check
the picture against the database without reading pixels. matplotlib draws through its
object API, never pyplot: the API renders reports in several threads at once.
"""

import html
import io
import json
from collections.abc import Iterable
from typing import Any

from quotaflow.observe.report_data import ReportData, Series, when

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin:28px 0 6px}
.meta{color:#555} table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:0} figure svg{width:100%;height:auto} code{font-size:12px}
"""
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def render(data: ReportData) -> str:
    """The whole page."""
    job = data.job
    counts = job["request_counts"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>quotaflow report {_e(job['id'])}</title><style>{STYLE}</style></head><body>",
        f"<h1>Job {_e(job['id'])}</h1>",
        f"<p class='meta'>{_e(job['status'])} &middot; queue {_e(job['queue'])} &middot; "
        f"{_e(job['endpoint'])} &middot; created {when(job['created_at'])} &middot; "
        f"{counts['total']} requests: {counts['completed']} completed, {counts['failed']} "
        f"failed, {counts['pending']} pending, {counts['cancelled']} cancelled, "
        f"{counts['expired']} expired</p>",
        *_bound(data),
        *(f"<h2>{_e(title)}</h2>\n{figure}" for title, figure in plots(data)),
        "<h2>Split across deployments</h2>", _split(data), _split_table(data),
        "<h2>Errors by code</h2>", _errors(data),
        "<h2>Usage</h2>", _table(("input tokens", "output tokens", "total tokens"),
                                 [tuple(job["usage"][k] for k in (
                                     "input_tokens", "output_tokens", "total_tokens"))]),
        "</body></html>",
    ]
    return "\n".join(parts)


def plots(data: ReportData) -> list[tuple[str, str]]:
    """The time plots, each (title, <figure>): the report's, and the console's job page."""
    t0 = _start(data)
    per = f"per minute, in buckets of {data.bucket_s} s"
    return [
        ("Requests per minute admitted, against each deployment's RPM",
         _figure("requests", data, data.requests_per_min, t0, "requests / min",
                 {name: rpm for name, (rpm, _) in data.budgets.items()})),
        ("Tokens per minute admitted (tokens used), against each deployment's TPM",
         _figure("tokens", data, data.tokens_per_min, t0, "tokens / min",
                 {name: tpm for name, (_, tpm) in data.budgets.items()})),
        (f"Completed and failed requests ({per})",
         _figure("outcomes", data, data.outcomes_per_min, t0, "requests / min", {})),
        ("Latency at the provider (sent to answered), p50 and p95",
         _figure("latency", data, data.latency_s, t0, "seconds", {})),
    ]


def _start(data: ReportData) -> float:
    starts = [x for group in (data.requests_per_min, data.outcomes_per_min)
              for series in group for x in series.x[:1]]
    return min(starts, default=0.0)


def _span(data: ReportData) -> float:
    ends = [x for group in (data.requests_per_min, data.outcomes_per_min)
            for series in group for x in series.x]
    return max(ends, default=0.0) - min(ends, default=0.0)


def _figure(name: str, data: ReportData, series: list[Series], t0: float, ylabel: str,
            budgets: dict[str, int]) -> str:
    """One plot and, in its attributes, what it shows."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    figure = Figure(figsize=(11, 3.3), layout="constrained")
    axes = figure.add_subplot()
    unit, scale = ("minutes", 60) if _span(data) > 600 else ("seconds", 1)
    for color, line in zip(_cycle(), series, strict=False):
        axes.plot([(x - t0) / scale for x in line.x], line.y, drawstyle="steps-post",
                  marker="o", markersize=3, color=color, label=line.name)
        if line.name in budgets:
            axes.axhline(budgets[line.name], color=color, linestyle="--", linewidth=1,
                         label=f"{line.name} budget ({budgets[line.name]:,}/min)")
    axes.set_xlabel(f"{unit} since the job's first request")
    axes.set_ylabel(ylabel)
    if name != "latency":
        axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    if series:
        axes.legend(loc="upper right", fontsize=8)
    else:
        axes.text(0.5, 0.5, "nothing to show yet", ha="center", transform=axes.transAxes)
    attrs = {"data-series": json.dumps([s.as_dict() for s in series]),
             "data-budgets": json.dumps(budgets), "data-bucket-s": str(data.bucket_s)}
    return _wrap(name, figure, attrs)


def _split(data: ReportData) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 0.6 + 0.45 * max(1, len(data.split))), layout="constrained")
    axes = figure.add_subplot()
    names = [row["deployment"] for row in data.split]
    done = [row["succeeded"] for row in data.split]
    failed = [row["requests"] - row["succeeded"] for row in data.split]
    axes.barh(names, done, color=COLORS[2], label="completed")
    axes.barh(names, failed, left=done, color=COLORS[1], label="failed")
    axes.invert_yaxis()
    axes.set_xlabel("requests")
    if names:
        axes.legend(loc="lower right", fontsize=8)
    series = [{"name": row["deployment"], "requests": row["requests"],
               "succeeded": row["succeeded"]} for row in data.split]
    return _wrap("split", figure, {"data-series": json.dumps(series)})


def _wrap(name: str, figure: Any, attrs: dict[str, str]) -> str:
    import matplotlib

    buffer = io.StringIO()
    # Text stays text (smaller, selectable); ids are stable from one render to the next.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"qf-{name}"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # no XML prolog or DOCTYPE inside HTML
    shown = " ".join(f'{key}="{_e(value)}"' for key, value in attrs.items())
    return f'<figure class="plot" id="plot-{name}" {shown}>{svg}</figure>'


def _bound(data: ReportData) -> list[str]:
    """Where the job's time went and what would make it faster (quotaflow/observe/bound.py)."""
    if data.bound is None:
        return []
    total = data.bound.total_s or 1.0
    rows = [(name, f"{secs:,.1f}", f"{secs / total:.0%}")
            for name, secs in sorted(data.bound.seconds.items(), key=lambda kv: -kv[1])]
    return ["<h2>What bound this job</h2>",
            f"<p id='bound' data-cause='{_e(data.bound.cause)}'>{_e(data.bound.advice)}</p>",
            _table(("where the time went", "seconds", "share"), rows)]


def _split_table(data: ReportData) -> str:
    rows = [(r["deployment"], r["requests"], r["succeeded"], r["prompt_tokens"],
             r["completion_tokens"],
             "-" if r["mean_latency_s"] is None else f"{r['mean_latency_s']:.3f}")
            for r in data.split]
    return _table(("deployment", "requests", "completed", "input tokens", "output tokens",
                   "mean latency (s)"), rows)


def _errors(data: ReportData) -> str:
    if not data.errors:
        return "<p>No errors.</p>"
    rows = [(e["code"], e["count"], "<br>".join(
        f"line {x['line']} ({_e(str(x['custom_id']))}): <code>{_e(str(x['message']))}</code>"
        for x in e["examples"])) for e in data.errors]
    return _table(("code", "lines", "examples"), rows, raw_last=True)


def _table(head: Iterable[str], rows: Iterable[tuple[Any, ...]], raw_last: bool = False) -> str:
    def cell(value: Any, raw: bool) -> str:
        if isinstance(value, int):
            return f"<td class='n'>{value:,}</td>"
        return f"<td>{value if raw else _e(str(value))}</td>"

    body = "".join("<tr>" + "".join(cell(v, raw_last and i == len(row) - 1)
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return ("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
            + body + "</table>")


def _cycle() -> Iterable[str]:
    while True:
        yield from COLORS


def _e(value: str) -> str:
    return html.escape(value, quote=True)
