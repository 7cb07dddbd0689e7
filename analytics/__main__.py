"""Command line: `python -m analytics analyze LOGDIR --out REPORTDIR` and `to-parquet IN OUT`.

    python -m analytics analyze LOGDIR... --out REPORTDIR [--master local[*]|spark://host:7077]
                                          [--k K] [--d D] [--driver-memory 4g]
    python -m analytics to-parquet IN... OUT [--master ...] [--overwrite]

`analyze` prints stage messages on stderr while Spark works, then a summary
table on stdout and the path of the report's index.html. LOGDIR may hold JSON
lines (any depth of subdirectories) or Parquet from `to-parquet`. With `--d`
the measured width is compared with the model's fixed point; k defaults to
the number of writing nodes per topic (nodes that created `message` events).

Exit status: 0 done; 1 Spark could not read or write (an existing output,
an unreadable Parquet file); 2 a user mistake, one line on stderr: bad
arguments, a log path that does not exist, cannot be read or holds no log
file, logs without a single valid record, or the analytics extra not
installed (`pip install 'megnode[analytics]'`: analytics/requirements.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from analytics.requirements import install_hint, missing_modules

# analytics.spark.DEFAULT_MASTER and analytics.jobs.load.LOG_FILE_GLOB's suffixes,
# restated so `--help`, the extra's check and the input checks answer without
# importing pyspark; a test holds them equal.
DEFAULT_MASTER = "local[*]"
LOG_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
PARQUET_SUFFIX = ".parquet"
EXIT_OK, EXIT_SPARK_FAILED, EXIT_USAGE = 0, 1, 2

# The model's argument range (analytics.model: MIN_CONVERGENT_PARENTS,
# MAX_PARENTS, MAX_REPLICAS), restated so `--help` and argument errors answer
# without importing numpy; a test holds the two equal. Checked here, before
# Spark runs, rather than failing after all the Spark work.
MIN_D = 2
MAX_D = 10**4
MAX_K = 10**6


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analytics", description="megnode log analytics on Spark")
    commands = parser.add_subparsers(dest="command", required=True)

    analyze = commands.add_parser("analyze", help="run every analysis and write a report folder")
    analyze.add_argument("logdir", nargs="+", help="log directories or files (JSON lines or Parquet)")
    analyze.add_argument("--out", required=True, help="report folder (created if missing)")
    analyze.add_argument("--k", type=_replicas, metavar="K",
                         help=f"writing replicas, for the model check (1..{MAX_K})")
    analyze.add_argument("--d", type=_parents, metavar="D",
                         help=f"parents per event, enables the model check ({MIN_D}..{MAX_D})")
    _spark_options(analyze)

    convert = commands.add_parser("to-parquet", help="convert JSON-lines logs to Parquet by topic/date")
    convert.add_argument("paths", nargs="+", metavar="PATH", help="inputs..., then the output directory")
    convert.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    _spark_options(convert)
    return parser


def _spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=DEFAULT_MASTER, help=f"Spark master URL (default {DEFAULT_MASTER})")
    parser.add_argument("--driver-memory", help="Spark driver memory, e.g. 4g (large local runs)")


def _int_in(text: str, low: int, high: int, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be in [{low}, {high}]{why}, got {value}")
    return value


def _replicas(text: str) -> int:
    return _int_in(text, 1, MAX_K)


def _parents(text: str) -> int:
    return _int_in(text, MIN_D, MAX_D, " (with d = 1 the width never converges)")


def _input_problem(paths: Sequence[str]) -> str | None:
    """Why these log paths cannot be analysed, before paying ~10 s for a JVM (None: fine).

    Remote URLs (`hdfs://`, `s3a://`) are left to Spark.
    """
    missing = [p for p in paths if "://" not in p and not os.path.exists(p)]
    if missing:
        return f"no such log path: {', '.join(missing)}"
    for path in (p for p in paths if "://" not in p):
        if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
            return f"cannot read the log path {path}: permission denied"
        if os.path.isfile(path):
            if os.path.getsize(path) == 0:
                return f"the log file {path} is empty"
            continue
        unreadable: list[OSError] = []
        found = any(name.endswith((*LOG_FILE_SUFFIXES, PARQUET_SUFFIX))
                    for _root, _dirs, files in os.walk(path, onerror=unreadable.append)
                    for name in files) or path.rstrip("/").endswith(PARQUET_SUFFIX)
        if unreadable:
            error = unreadable[0]
            return f"cannot read {error.filename}: {error.strerror}"
        if not found:
            return (f"no log files in {path} (looked for "
                    f"{', '.join('*' + s for s in (*LOG_FILE_SUFFIXES, PARQUET_SUFFIX))}, "
                    "in subdirectories too)")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    missing_extra = missing_modules()
    if missing_extra and not {"-h", "--help"} & set(argv):
        print(f"error: {install_hint(missing_extra)}", file=sys.stderr)
        return EXIT_USAGE
    args = _parser().parse_args(argv)
    if args.command == "to-parquet" and len(args.paths) < 2:
        print("error: to-parquet needs at least one input and an output", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "analyze" and args.k is not None and args.d is None:
        print("error: --k needs --d: the logs do not record parents per event", file=sys.stderr)
        return EXIT_USAGE
    inputs = args.logdir if args.command == "analyze" else args.paths[:-1]
    problem = _input_problem(inputs)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    # Imported here so `--help` answers without starting the JVM.
    from pyspark.errors import AnalysisException

    from analytics import report
    from analytics.jobs.load import to_parquet
    from analytics.spark import session

    try:
        with session(args.master, driver_memory=args.driver_memory) as spark:
            if args.command == "analyze":
                result = report.analyze(spark, args.logdir, args.out, k=args.k, d=args.d)
                print(report.format_summary(result))
            else:
                *inputs, output = args.paths
                loaded = to_parquet(spark, inputs, output, overwrite=args.overwrite)
                print(f"wrote {loaded.records} records to {output} ({loaded.malformed_total} malformed lines skipped)")
                for reason, count in loaded.malformed.items():
                    print(f"  {reason}: {count}")
    except report.NoRecords as error:  # nothing to analyse: no report, a user's mistake
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (FileNotFoundError, AnalysisException) as error:
        # A missing path or an existing output: say so, no JVM stack trace.
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return EXIT_SPARK_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
