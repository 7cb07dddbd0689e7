"""The log schema's rules as Spark column expressions.

`node.logschema.validate_record` checks one parsed record in Python; the
loader cannot afford a Python round trip per line (Python workers cost an
order of magnitude more per row than the JVM), so this module restates the same
rules as Spark SQL expressions built from the same tables. Both give the same
reason for the same line; the test suite checks that on a set of broken lines.

JSON lines are parsed with Spark's VARIANT type (`try_parse_json`) rather than
`from_json` with a schema, because `from_json` converts silently: it reads
`"node": 12` as the string "12" and `"ts_ms": 1.5` as null, so wrong types could
not be told apart from absent fields. `schema_of_variant` reports the JSON type
of each field exactly.

Two details of Spark's JSON parser need care:
- It stops after the first complete value and ignores what follows, so
  `{...}{...}` (two records glued by a lost newline) would parse as the first.
  Each line is therefore parsed inside `[ line ,"<sentinel>"]`: any trailing
  data breaks the array or changes its length, and the line is `bad_json`,
  as Python's `json.loads` says. (A line that itself contains `,"<sentinel>"]`
  after a complete value would slip through; no writer produces that.)
- JSON `1.0` is a DECIMAL, not an integer, and integers beyond int64 are
  DECIMAL too: both are `wrong_type` here and in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from node import logschema as ls

MALFORMED = "malformed_reason"  # not "reason": that is a schema field (why an event was rejected)
_SENTINEL = "megnode:end-of-line"
_INTEGER_VARIANT_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_SPARK_CAST = {"int": "bigint", "hex": "string", "text": "string"}
_FIELDS_AS_VARIANTS = "struct<" + ", ".join(f"{spec.name}: variant" for spec in ls.FIELDS) + ">"


@dataclass(frozen=True)
class FieldColumns:
    """One field of a line as three columns: is it there, is its JSON type right, its value."""

    present: Column
    type_ok: Column
    value: Column


def _parse(lines: DataFrame, column: str, keep: list[Column]) -> DataFrame:
    """Add _parse_ok and _fields: the line's top-level object as a struct of one VARIANT
    per schema field (null when the line is not an object; a field is null when absent)."""
    wrapped = F.try_parse_json(F.concat(F.lit("["), F.col(column), F.lit(f',"{_SENTINEL}"]')))
    with_wrapped = lines.select(*keep, wrapped.alias("_wrapped"))
    w = F.col("_wrapped")
    parse_ok = F.coalesce(
        w.isNotNull()
        & (F.try_variant_get(w, "$[1]", "string") == F.lit(_SENTINEL))
        & F.try_variant_get(w, "$[2]", "variant").isNull(),
        F.lit(False),
    )
    # One cast reads every field: cheaper than one path lookup per field.
    fields = F.try_variant_get(w, "$[0]", _FIELDS_AS_VARIANTS)
    return _fenced(with_wrapped, keep, [parse_ok.alias("_parse_ok"), fields.alias("_fields")])


def _fenced(df: DataFrame, keep: list[Column], new: list[Column]) -> DataFrame:
    """`df.select(*keep, *new)`, with the new columns produced by a Generate node.

    Spark pushes a filter down through projections by copying the projected
    expressions into it, and a filter's generated code does not share common
    subexpressions. A filter on the classification would then parse each line
    dozens of times, and its code outgrows the JVM's 64 KB method limit (Spark
    falls back to interpreting it: 100x slower, measured). Columns that come out
    of a generator cannot be copied that way, so the parse stays done once.
    """
    return df.select(*keep, F.inline(F.array(F.struct(*new))))


def typed_field_columns() -> dict[str, FieldColumns]:
    """Every schema field of an already typed (Parquet) row: only presence and values to check."""
    return {
        spec.name: FieldColumns(F.col(spec.name).isNotNull(), F.lit(True), F.col(spec.name))
        for spec in ls.FIELDS
    }


def _value_ok(spec: ls.FieldSpec, value: Column) -> Column:
    if spec.kind == "int":
        return value >= 0
    if spec.kind == "hex":
        # Hex digits only (try_to_binary), lowercase, bounded: twice as fast as a regex.
        return (
            F.try_to_binary(value, F.lit("hex")).isNotNull()
            & (value == F.lower(value))
            & F.length(value).between(1, ls.MAX_HEX_ID_CHARS)
        )
    if spec.name == "channel":
        return value.isin(*ls.CHANNELS)
    return F.length(value).between(1, spec.max_chars)


def _all(conditions: list[Column]) -> Column:
    result = F.lit(True)
    for condition in conditions:
        result = result & condition
    return result


def _any(conditions: list[Column]) -> Column:
    result = F.lit(False)
    for condition in conditions:
        result = result | condition
    return result


def record_reason(fields: dict[str, FieldColumns]) -> Column:
    """The reason a record is invalid (null when valid), checks in the schema's order."""
    v, record_type = fields["v"], fields["type"]
    wrong_type = _any([f.present & ~f.type_ok for f in fields.values()])
    # One branch per record type (a known one by then): cheaper per row than
    # asking, for every field, whether this type requires it.
    branches = [
        (
            record_type.value == F.lit(name),
            ~_all(
                [fields[field].present for field in ls.required_fields(name)]
                + [_any([fields[field].present for field in group]) for group in ls.required_one_of(name)]
            ),
        )
        for name in ls.RECORD_TYPES
    ]
    missing = F.when(*branches[0])
    for condition, value in branches[1:]:
        missing = missing.when(condition, value)
    bad_value = _any(
        [fields[spec.name].present & ~_value_ok(spec, fields[spec.name].value) for spec in ls.FIELDS]
    )
    return (
        F.when(~v.present, F.lit(ls.MISSING_FIELD))
        .when(~v.type_ok, F.lit(ls.WRONG_TYPE))
        .when(v.value != F.lit(ls.SCHEMA_VERSION), F.lit(ls.BAD_VERSION))
        .when(~record_type.present, F.lit(ls.MISSING_FIELD))
        .when(~record_type.type_ok, F.lit(ls.WRONG_TYPE))
        .when(~record_type.value.isin(*ls.RECORD_TYPES), F.lit(ls.UNKNOWN_TYPE))
        .when(wrong_type, F.lit(ls.WRONG_TYPE))
        .when(missing, F.lit(ls.MISSING_FIELD))
        .when(bad_value, F.lit(ls.BAD_VALUE))
    )


def classify_lines(lines: DataFrame, column: str = "value") -> DataFrame:
    """Text lines -> the schema's typed columns plus MALFORMED (null for valid records).

    The other columns of `lines` are kept; so is the line itself. The work is
    split into stages (parse, read the fields, judge), the parse fenced off
    (`_fenced`) so each line is parsed once whatever a caller does with the
    result: written as one expression, the parse would be copied into every
    field's expression.
    """
    keep = [F.col(c) for c in lines.columns]
    parsed = _parse(lines, column, keep)
    per_field = []
    for spec in ls.FIELDS:
        raw = F.when(F.col("_parse_ok"), F.col("_fields")[spec.name])
        per_field.append(F.schema_of_variant(raw).alias(f"_t_{spec.name}"))
        per_field.append(F.try_variant_get(raw, "$", _SPARK_CAST[spec.kind]).alias(spec.name))
    is_object = F.col("_parse_ok") & F.col("_fields").isNotNull()
    # Not fenced: a filter pushed through here repeats cheap per-field reads, not the parse.
    read = parsed.select(*keep, F.col("_parse_ok"), is_object.alias("_is_object"), *per_field)
    fields = {spec.name: _field_from_json_type(spec, F.col(f"_t_{spec.name}")) for spec in ls.FIELDS}
    reason = (
        F.when(F.length(F.col(column)) > ls.MAX_LINE_CHARS, F.lit(ls.TOO_LONG))
        .when(~F.col("_parse_ok"), F.lit(ls.BAD_JSON))
        .when(~F.col("_is_object"), F.lit(ls.NOT_OBJECT))
        .otherwise(record_reason(fields))
    )
    return read.select(*keep, *[F.col(f.name) for f in ls.FIELDS], reason.alias(MALFORMED))


def _field_from_json_type(spec: ls.FieldSpec, json_type: Column) -> FieldColumns:
    present = F.coalesce(json_type != F.lit("VOID"), F.lit(False))  # JSON null == absent
    if spec.kind == "int":
        type_ok = json_type.isin(*_INTEGER_VARIANT_TYPES)
    else:
        type_ok = json_type == F.lit("STRING")
    return FieldColumns(present, type_ok, F.col(spec.name))
