"""The analysis report: run every job on a log set, print a summary, write a folder.

`analyze` loads the logs, runs the dissemination, width and model-check jobs,
and writes `<out>/index.html` with every table and the PNG plots beside it.
It returns the tables so the CLI can print the short ones on the terminal and
tests can read the numbers. Stage messages ("[1/5] loading logs ...") go to
`progress` (stderr by default) because Spark can take a while on large sets.

Times on the page are seconds after the run's start (its earliest log
record), not epoch milliseconds: every time point (`*_ms` columns such as
peak_ms, settle_ms, start_ms) becomes `*_s` after the start, and the long
durations (convergence, catch-up) become seconds (TIME_POINT_COLUMNS,
DURATION_COLUMNS). Latencies stay in ms (sub-second; their titles say so).
An empty table says "none". Event counts: "events created" (Input) counts
events whose `created` record is in the logs; the Dissemination table counts
every event seen (created or delivered) and says how many of those have no
`created` record, so the two numbers differ by exactly that line.

Only small, aggregated results ever reach the driver: tables are capped at
MAX_TABLE_ROWS rows and plots at MAX_PLOTTED_SERIES series of at most
MAX_POINTS_PER_SERIES points (width series are reduced to the per-bucket
maximum, so peaks survive the downsampling).
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from node import logschema as ls
from analytics.jobs import catchup, convergence, coverage, dissemination, events, load, modelcheck, rejections, width

STAGES: Final = ("loading logs", "dissemination", "width", "model check", "writing report")
MAX_TABLE_ROWS: Final = 50
MAX_PLOTTED_SERIES: Final = 12
MAX_POINTS_PER_SERIES: Final = 2_000
PLOT_DPI: Final = 110
NUMBER_DECIMALS: Final = 2
TERMINAL_CELL_CHARS: Final = 16  # 64-hex ids would make the terminal summary too wide

MS_PER_S: Final = 1000.0
# Columns holding a node clock's epoch ms, shown as seconds after the run's start.
TIME_POINT_COLUMNS: Final = frozenset({"peak_ms", "settle_ms", "start_ms", "end_ms", "first_ms",
                                       "last_ms", "created_ms", "delivered_ms"})
# Durations long enough to read in seconds (latencies, lags stay in ms).
DURATION_COLUMNS: Final = frozenset({"convergence_ms", "duration_ms", "quiet_before_ms"})
NONE: Final = "none"  # what an empty table says
MODEL_CHECK_NOTE: Final = (
    "Compares the width this run measured (forward extremities sampled by every node: "
    "measured_mean over all samples, steady_mean over each series' steady part) with the "
    "paper's model: predicted = fixed_point_width(d, k), the width k replicas keep when "
    "each adds one event with up to d parents every round, all concurrently (section VIII). "
    "That is the worst case, so steady/predicted near 1 is expected only where the run "
    "writes like the model (the simulation: k > d writers writing every round); a cluster "
    "whose writers mostly see each other's events before writing keeps a width near 1, so "
    "a ratio near 1/k there (0.25 for the demo's cluster, k = 4) is expected, not a failure. "
    "Above 1 would mean the width exceeds the model's bound."
)

T = TypeVar("T")


class NoRecords(ValueError):
    """The logs hold no valid record: nothing to analyse, so no report is written."""


@dataclass(frozen=True)
class Table:
    """A titled table of already computed values."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    note: str = ""


@dataclass(frozen=True)
class Report:
    outdir: Path
    index_html: Path
    plots: tuple[Path, ...]
    summary: tuple[Table, ...]  # the short tables for the terminal
    tables: tuple[Table, ...]  # everything, as in index.html
    texts: tuple[tuple[str, str], ...] = ()  # preformatted blocks (title, text)


class _Stages:
    """Prints "[i/n] name ..." when a stage starts and its duration when it ends."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._index = 0

    def run(self, action: Callable[[], T]) -> T:
        self._index += 1
        name = STAGES[self._index - 1]
        self._out.write(f"[{self._index}/{len(STAGES)}] {name} ...\n")
        self._out.flush()
        started = time.monotonic()
        result = action()
        self._out.write(f"[{self._index}/{len(STAGES)}] {name} done in {time.monotonic() - started:.1f} s\n")
        self._out.flush()
        return result


def in_seconds(df: DataFrame, start_ms: int | None) -> DataFrame:
    """Time points as seconds after `start_ms`, long durations as seconds (renamed `*_s`)."""
    columns = []
    for name in df.columns:
        if name in TIME_POINT_COLUMNS and start_ms is not None:
            columns.append(((F.col(name) - F.lit(start_ms)) / MS_PER_S).alias(name[:-3] + "_s"))
        elif name in DURATION_COLUMNS:
            columns.append((F.col(name) / MS_PER_S).alias(name[:-3] + "_s"))
        else:
            columns.append(F.col(name))
    return df.select(*columns)


def run_start_ms(records: DataFrame) -> int | None:
    """The run's start: its earliest log record's timestamp (None: no records)."""
    return records.agg(F.min("ts_ms")).collect()[0][0]


def table_from(df: DataFrame, title: str, note: str = "", limit: int = MAX_TABLE_ROWS,
               start_ms: int | None = None) -> Table:
    """Collect at most `limit` rows of `df` as a Table (the note says when rows were cut);
    with `start_ms`, times in seconds after it (in_seconds)."""
    df = in_seconds(df, start_ms)
    rows = df.limit(limit + 1).collect()
    if len(rows) > limit:
        note = f"{note} First {limit} rows shown.".strip()
    return Table(title, tuple(df.columns), tuple(tuple(row) for row in rows[:limit]), note)


def analyze(
    spark: SparkSession,
    log_paths: str | Sequence[str],
    outdir: str | Path,
    *,
    k: int | None = None,
    d: int | None = None,
    progress: TextIO | None = None,
) -> Report:
    """Run every analysis on the logs and write the report folder (progress: stderr by default)."""
    out = Path(outdir)
    stages = _Stages(progress if progress is not None else sys.stderr)
    loaded = stages.run(lambda: load.load_logs(spark, log_paths))
    if loaded.report.records == 0:
        loaded.release()
        paths = log_paths if isinstance(log_paths, str) else ", ".join(log_paths)
        raise NoRecords(f"no valid log records in {paths} ({loaded.report.lines} lines read, "
                        f"{loaded.report.malformed_total} malformed); no report written")
    records = loaded.records
    start_ms = run_start_ms(records)
    # Origins, first deliveries and members feed most jobs: compute them once.
    base = events.basis(records)
    spread, spread_plots = stages.run(lambda: _dissemination(base, start_ms))
    widths, width_plots = stages.run(lambda: _width(base, start_ms))
    checks, texts, figure_paths = stages.run(lambda: _model(records, out, k, d))
    input_table = _input_table(loaded.report, records)
    summary = (input_table, spread[0], spread[1], widths[0], *checks)
    tables = (input_table, _malformed_samples(loaded.report), *spread, *widths, *checks)

    def write() -> tuple[Path, ...]:
        out.mkdir(parents=True, exist_ok=True)
        plots = [path for plot in (*spread_plots, *width_plots) if (path := plot(out)) is not None]
        plots.extend(figure_paths)
        _write_html(out / "index.html", tables, texts, plots)
        return tuple(plots)

    plots = stages.run(write)
    base.release()
    loaded.release()
    return Report(out, out / "index.html", plots, summary, tables, texts)


# --------------------------------------------------------------------------- stages

_Plot = Callable[[Path], Path | None]


def _input_table(report: load.LoadReport, records: DataFrame) -> Table:
    counts = records.agg(
        F.countDistinct("node").alias("nodes"),
        F.countDistinct("topic").alias("topics"),
        F.countDistinct(F.when(F.col("type") == ls.CREATED, F.struct("topic", "event"))).alias("events"),
    ).collect()[0]
    rows = [
        ("lines read", report.lines),
        ("valid records", report.records),
        *[(f"malformed: {reason}", count) for reason, count in report.malformed.items()],
        ("nodes", counts["nodes"]),
        ("topics", counts["topics"]),
        ("events created", counts["events"]),
    ]
    return Table("Input", ("what", "count"), tuple(rows))


def _malformed_samples(report: load.LoadReport) -> Table:
    rows = tuple((s.reason, s.file, s.line) for s in report.samples)
    return Table("Malformed lines (samples)", ("reason", "file", "line"), rows)


def _dissemination(base: events.Basis, start_ms: int | None
                   ) -> tuple[tuple[Table, ...], tuple[_Plot, ...]]:
    latencies = dissemination.latencies(base).cache()
    overall = dissemination.latency_summary(latencies).select(F.lit("all").alias("channel"), "*")
    per_channel = overall.unionByName(dissemination.latency_summary(latencies, ("channel",)))
    missing = dissemination.never_delivered(base).cache()
    duplicates = dissemination.duplicate_totals(dissemination.duplicates_per_event(base))
    curve = coverage.coverage_curve(base).collect()
    episodes = catchup.catchup_episodes(base)
    facts = missing.agg(F.count("*").alias("pairs"), F.countDistinct("topic", "event").alias("events")).collect()[0]
    uncreated = events.known_events(base).where(F.col("origin_node").isNull()).count()
    totals = Table(
        "Dissemination",
        ("what", "value"),
        (
            ("events (created or delivered)", duplicates.events),
            ("  of which delivered, no created record", uncreated),
            ("remote deliveries", duplicates.deliveries),
            ("(event, node) never delivered", facts["pairs"]),
            ("events some member never delivered", facts["events"]),
            ("duplicates", duplicates.duplicates),
            ("duplicates per delivery", duplicates.duplicates_per_delivery),
            ("final coverage", curve[-1]["coverage"] if curve else None),
            ("catch-up episodes", episodes.count()),
        ),
        "events counts every event some node created or delivered; Input's \"events created\" "
        "only those whose created record is in the logs. They differ by the events delivered "
        "without one (they have no latency): the joins made through the join handshake (the "
        "joiner signs its join, a member adds it, and neither logs it as created), and events "
        "made by a node whose logs were not collected, or before its logs begin.",
    )
    tables = (
        table_from(per_channel, "Latency by channel (ms)", "created at the author -> first delivery elsewhere."),
        totals,
        table_from(dissemination.latency_summary(latencies, ("node",)), "Latency by node (ms)"),
        table_from(missing, "Never delivered", "Members that never delivered an event.",
                   start_ms=start_ms),
        table_from(dissemination.duplicates_by_channel(base), "Duplicates by channel"),
        table_from(episodes, "Catch-up episodes", f"Runs of sync deliveries <= {catchup.CATCHUP_GAP_MS} ms apart, "
                   f">= {catchup.CATCHUP_MIN_EVENTS} events; start_s, end_s: seconds after the run's "
                   "start.", start_ms=start_ms),
        table_from(rejections.rejections(base), "Rejections", "topic - = peer-level (a frame that could not be "
                   "decoded); reason cut at the first ':'."),
    )
    cdf = latencies.groupBy("channel", "latency_ms").count().orderBy("channel", "latency_ms").collect()
    latencies.unpersist()
    missing.unpersist()
    return tables, (lambda out: _plot_coverage(curve, out), lambda out: _plot_latency_cdf(cdf, out))


def _width(base: events.Basis, start_ms: int | None) -> tuple[tuple[Table, ...], tuple[_Plot, ...]]:
    converged = convergence.convergence(base).cache()
    dummies = width.dummy_counts(base)
    per_topic = (
        width.width_summary(base, ("topic",))
        .join(dummies.groupBy("topic").agg(F.sum("dummies").alias("dummies")), "topic", "left")
        .join(
            converged.groupBy("topic").agg(
                F.sum(F.col("converged").cast("int")).alias("converged_nodes"),
                F.count("*").alias("series"),
                (F.max("convergence_ms") / MS_PER_S).alias("max_convergence_s"),
            ),
            "topic",
            "left",
        )
        .orderBy("topic")
    )
    tables = (
        table_from(per_topic, "Width by topic", "Forward extremities sampled by every node."),
        table_from(width.width_summary(base, ("topic", "node")), "Width by node"),
        table_from(
            converged,
            "Width convergence",
            f"From the peak until the width stays within max({convergence.BAND_MIN}, "
            f"{convergence.BAND_FRACTION} x median) of the median of the last "
            f"{convergence.STEADY_FRACTION:.0%} of the series. first_s, peak_s, settle_s: "
            "seconds after the run's start; convergence_s = settle_s - peak_s.",
            start_ms=start_ms,
        ),
        table_from(dummies, "Dummy events by node"),
    )
    histogram = width.width_histogram(base, ()).collect()
    series = _width_plot_series(base, start_ms)
    dummy_rows = dummies.orderBy(F.desc("dummies")).limit(MAX_TABLE_ROWS).collect()
    converged.unpersist()
    return tables, (
        lambda out: _plot_width_series(series, out),
        lambda out: _plot_width_histogram(histogram, out),
        lambda out: _plot_dummies(dummy_rows, out),
    )


def _model(
    records: DataFrame, out: Path, k: int | None, d: int | None
) -> tuple[tuple[Table, ...], tuple[tuple[str, str], ...], tuple[Path, ...]]:
    tables: list[Table] = []
    texts: list[tuple[str, str]] = []
    paths: tuple[Path, ...] = ()
    columns = ("topic", "k", "d", "samples", "measured_mean", "steady_mean", "predicted", "steady/predicted")
    try:
        if d is not None:
            try:
                checks = modelcheck.model_check(records, d=d, k=k)
            except ValueError as error:  # d or k outside the model's range: say so, keep the report
                tables.append(Table("Model check: width", columns, (), f"Model check skipped: {error}"))
            else:
                rows = tuple(
                    (c.topic, c.k, c.d, c.samples, c.measured_mean, c.steady_mean, c.predicted,
                     c.steady_over_predicted)
                    for c in checks
                )
                note = MODEL_CHECK_NOTE + (
                    f" k = {k}, as given." if k is not None else
                    f" k = nodes that created {'/'.join(modelcheck.WRITE_KINDS)} events in the topic."
                )
                tables.append(Table("Model check: width", columns, rows, note))
        figures = modelcheck.paper_figures(out)
        texts = [("Paper Figure 4 (table)", figures.figure4_table)]
        if figures.figure4_monte_carlo_table:
            texts.append(("Paper Figure 4: Monte-Carlo check", figures.figure4_monte_carlo_table))
        texts.append(("Paper Figure 5 (table)", figures.figure5_table))
        paths = (figures.figure4_png, figures.figure5_png)
    except modelcheck.ModelUnavailable as error:
        texts.append(("Model", f"Model check skipped: {error}"))
    return tuple(tables), tuple(texts), paths


def _width_plot_series(records: events.Records, start_ms: int | None = None
                       ) -> list[tuple[str, list[tuple[float, int]]]]:
    """Up to MAX_PLOTTED_SERIES (topic, node) series, each cut to per-bucket maxima;
    times in seconds after `start_ms` (default: the first width sample), one origin
    for every series so they line up."""
    samples = width.width_samples(records)
    chosen = samples.select("topic", "node").distinct().orderBy("topic", "node").limit(MAX_PLOTTED_SERIES)
    span = samples.agg(F.min("ts_ms").alias("lo"), F.max("ts_ms").alias("hi")).collect()[0]
    if span["lo"] is None:
        return []
    bucket_ms = max(1, (span["hi"] - span["lo"]) // MAX_POINTS_PER_SERIES + 1)
    bucket = F.floor((F.col("ts_ms") - span["lo"]) / bucket_ms)
    rows = (
        samples.join(chosen, ["topic", "node"])
        .groupBy("topic", "node", bucket.alias("bucket"))
        .agg(F.min("ts_ms").alias("ts_ms"), F.max("width").alias("width"))
        .orderBy("topic", "node", "ts_ms")
        .collect()
    )
    origin = span["lo"] if start_ms is None else start_ms
    series: dict[str, list[tuple[float, int]]] = {}
    for row in rows:
        series.setdefault(f"{row['topic'][:8]}/{row['node'][:8]}", []).append(
            ((row["ts_ms"] - origin) / MS_PER_S, row["width"]))
    return list(series.items())


# --------------------------------------------------------------------------- plots


def _figure() -> tuple[Figure, Any]:
    figure = Figure(figsize=(7, 4.2), dpi=PLOT_DPI, layout="constrained")
    FigureCanvasAgg(figure)  # no pyplot: the process-wide backend stays untouched
    return figure, figure.add_subplot(1, 1, 1)


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, format="png")
    return path


def _plot_coverage(curve: list[Any], out: Path) -> Path | None:
    if not curve:
        return None
    figure, axes = _figure()
    axes.step([r["t_ms"] for r in curve], [r["coverage"] for r in curve], where="post")
    axes.set(xlabel="ms after creation", ylabel="fraction of members holding the event",
             title="Coverage over time (mean over events)", ylim=(0, 1.05), xlim=(0, None))
    axes.grid(alpha=0.3)
    return _save(figure, out / "coverage.png")


def _plot_latency_cdf(counts: list[Any], out: Path) -> Path | None:
    if not counts:
        return None
    figure, axes = _figure()
    for channel in sorted({r["channel"] for r in counts}):
        rows = [r for r in counts if r["channel"] == channel]
        total = sum(r["count"] for r in rows)
        running, ys = 0, []
        for r in rows:
            running += r["count"]
            ys.append(running / total)
        axes.step([r["latency_ms"] for r in rows], ys, where="post", label=f"{channel} ({total})")
    axes.set(xlabel="latency (ms)", ylabel="fraction of deliveries", title="Delivery latency CDF by channel",
             ylim=(0, 1.05))
    axes.set_xlim(left=min(0, min(r["latency_ms"] for r in counts)))  # clock skew may be negative
    axes.legend()
    axes.grid(alpha=0.3)
    return _save(figure, out / "latency_cdf.png")


def _plot_width_series(series: list[tuple[str, list[tuple[float, int]]]], out: Path) -> Path | None:
    if not series:
        return None
    figure, axes = _figure()
    for label, points in series:
        axes.plot([p[0] for p in points], [p[1] for p in points], drawstyle="steps-post", label=label)
    axes.set(xlabel="seconds after the run's start", ylabel="forward extremities",
             title="Width over time (topic/node)", xlim=(0, None), ylim=(0, None))
    axes.ticklabel_format(axis="x", useOffset=False, style="plain")  # no "+1.7e12" offset
    axes.legend(fontsize="small", ncol=2)
    axes.grid(alpha=0.3)
    return _save(figure, out / "width_over_time.png")


def _plot_width_histogram(histogram: list[Any], out: Path) -> Path | None:
    if not histogram:
        return None
    figure, axes = _figure()
    axes.bar([r["width"] for r in histogram], [r["samples"] for r in histogram])
    axes.set(xlabel="forward extremities", ylabel="samples", title="Width distribution (all nodes)")
    axes.grid(alpha=0.3, axis="y")
    return _save(figure, out / "width_histogram.png")


def _plot_dummies(rows: list[Any], out: Path) -> Path | None:
    if not rows:
        return None
    figure, axes = _figure()
    axes.bar([f"{r['node'][:8]}" for r in rows], [r["dummies"] for r in rows])
    axes.set(xlabel="node", ylabel="dummy events issued", title="Extremity-depletion dummies by node")
    axes.tick_params(axis="x", labelrotation=60, labelsize="small")
    return _save(figure, out / "dummies.png")


# --------------------------------------------------------------------------- text


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:.{NUMBER_DECIMALS}f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text
    return str(value)


def _shorten(text: str, limit: int | None) -> str:
    """Cut long hex ids (only those: labels stay whole) to `limit` characters."""
    if limit is None or len(text) <= limit or not ls.is_hex_id(text):
        return text
    return text[: limit - 1] + "…"


def format_table(table: Table, max_cell_chars: int | None = None) -> str:
    """A plain-text table: title, header, rule, right-aligned cells (ids cut to max_cell_chars), note."""
    cells = [list(table.columns)] + [[_shorten(format_value(v), max_cell_chars) for v in row] for row in table.rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(table.columns))]
    lines = [table.title, "  ".join(c.rjust(w) for c, w in zip(cells[0], widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells[1:])
    if not table.rows:
        lines.append(NONE)
    if table.note:
        lines.append(table.note)
    return "\n".join(lines)


def format_summary(report: Report) -> str:
    blocks = [format_table(table, TERMINAL_CELL_CHARS) for table in report.summary]
    blocks.append(f"Report: {report.index_html}")
    return "\n\n".join(blocks)


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(format_value(v))}</td>" for v in row) + "</tr>" for row in table.rows
    )
    if not table.rows:
        body = f'<tr><td colspan="{len(table.columns)}">{NONE}</td></tr>'
    note = f"<p class=note>{html.escape(table.note)}</p>" if table.note else ""
    return f"<h2>{html.escape(table.title)}</h2><table><tr>{head}</tr>{body}</table>{note}"


def _write_html(path: Path, tables: Sequence[Table], texts: Sequence[tuple[str, str]], plots: Sequence[Path]) -> None:
    images = "".join(
        f'<figure><a href="{html.escape(p.name)}"><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}">'
        f"</a><figcaption>{html.escape(p.name)}</figcaption></figure>"
        for p in plots
    )
    blocks = "".join(f"<h2>{html.escape(title)}</h2><pre>{html.escape(text)}</pre>" for title, text in texts)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>megnode analytics report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 640px; }} .note {{ color: #555; }}
</style></head><body>
<h1>megnode analytics report</h1>
<p>Generated {html.escape(time.strftime("%Y-%m-%d %H:%M:%S %Z"))}. Log schema v{ls.SCHEMA_VERSION}.</p>
<h2>Plots</h2>{images or "<p>No plots (no data).</p>"}
{"".join(_html_table(t) for t in tables)}
{blocks}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
