"""Command line: `python -m analytics analyze LOGDIR --out REPORTDIR` and `to-parquet IN OUT`.

    python -m analytics analyze LOGDIR... --out REPORTDIR [--master local[*]|spark://host:7077]
                                          [--k K] [--d D] [--driver-memory 4g]
    python -m analytics to-parquet IN... OUT [--master ...] [--overwrite]

`analyze` prints stage messages on stderr while Spark works, then a summary
table on stdout and the path of the report's index.html. LOGDIR may hold JSON
lines (any depth of subdirectories) or Parquet from `to-parquet`. With `--d`
the measured width is compared with the model's fixed point; k defaults to
the number of writing nodes per topic (nodes that created `message` events).

Exit status: 0 done, 1 the logs could not be read, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from analytics.spark import DEFAULT_MASTER

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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "to-parquet" and len(args.paths) < 2:
        print("to-parquet needs at least one input and an output", file=sys.stderr)
        return 2
    if args.command == "analyze" and args.k is not None and args.d is None:
        print("--k needs --d: the logs do not record parents per event", file=sys.stderr)
        return 2
    inputs = args.logdir if args.command == "analyze" else args.paths[:-1]
    missing = [p for p in inputs if "://" not in p and not os.path.exists(p)]
    if missing:  # say so before paying ~10 s for a JVM
        print(f"error: no such log path: {', '.join(missing)}", file=sys.stderr)
        return 1
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
    except (FileNotFoundError, AnalysisException) as error:
        # A missing path or an existing output: say so, no JVM stack trace.
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
