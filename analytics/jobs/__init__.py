"""PySpark jobs over the dissemination logs (schema: `node.logschema`).

Each job is a function of a SparkSession, or of the records (a DataFrame, or an
`events.Basis` that caches what many jobs share), returning DataFrames or
frozen dataclasses, so tests can assert numbers and the report can render them:

- `load`          read JSON lines / Parquet, count malformed lines; `to_parquet`
- `events`        shared definitions: members, origins, first deliveries
- `dissemination` latency per (event, node), summaries, never-delivered, duplicates
- `coverage`      fraction of members holding an event t ms after creation
- `catchup`       bursts of anti-entropy deliveries after falling behind
- `rejections`    refused events and frames by topic (null: peer-level) and reason
- `width`         width samples, distribution, dummy events
- `convergence`   time from a width peak until it stays in a band
- `modelcheck`    measured width vs the paper's fixed point; Figures 4 and 5
"""
