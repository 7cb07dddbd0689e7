"""The log schema's rules as Spark column expressions.

`analytics.logschema.validate_record` checks one parsed record in Python; the
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

from analytics import logschema as ls

MALFORMED = "malformed_reason"  # not "reason": that is a schema field (why an event was rejected)
_SENTINEL = "megnode:end-of-line"
_INTEGER_VARIANT_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_SPARK_CAST = {"int": "bigint", "hex": "string", "text": "string"}


@dataclass(frozen=True)
class FieldColumns:
    """One field of a line as three columns: is it there, is its JSON type right, its value."""

    present: Column
    type_ok: Column
    value: Column


def parse_json_line(value: Column) -> tuple[Column, Column]:
    """(document, parse_ok) for a text line; document is a VARIANT, null when not parsed."""
    wrapped = F.try_parse_json(F.concat(F.lit("["), value, F.lit(f',"{_SENTINEL}"]')))
    parse_ok = (
        wrapped.isNotNull()
        & (F.try_variant_get(wrapped, "$[1]", "string") == F.lit(_SENTINEL))
        & F.try_variant_get(wrapped, "$[2]", "variant").isNull()
    )
    document = F.when(parse_ok, F.try_variant_get(wrapped, "$[0]", "variant"))
    return document, F.coalesce(parse_ok, F.lit(False))


def json_field_columns(document: Column) -> dict[str, FieldColumns]:
    """Every schema field read out of a parsed JSON object."""
    fields = {}
    for spec in ls.FIELDS:
        path = f"$.{spec.name}"
        json_type = F.schema_of_variant(F.try_variant_get(document, path, "variant"))
        present = F.coalesce(json_type != F.lit("VOID"), F.lit(False))  # JSON null == absent
        if spec.kind == "int":
            type_ok = json_type.isin(*_INTEGER_VARIANT_TYPES)
        else:
            type_ok = json_type == F.lit("STRING")
        value = F.try_variant_get(document, path, _SPARK_CAST[spec.kind])
        fields[spec.name] = FieldColumns(present, type_ok, value)
    return fields


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
        # No regex anchors: Java's `$` also matches before a trailing newline.
        return F.length(value).between(1, ls.MAX_HEX_ID_CHARS) & (
            F.translate(value, ls.HEX_DIGITS, "") == F.lit("")
        )
    if spec.name == "channel":
        return value.isin(*ls.CHANNELS)
    return F.length(value).between(1, spec.max_chars)


def _any(conditions: list[Column]) -> Column:
    result = F.lit(False)
    for condition in conditions:
        result = result | condition
    return result


def record_reason(fields: dict[str, FieldColumns]) -> Column:
    """The reason a record is invalid (null when valid), checks in the schema's order."""
    v, record_type = fields["v"], fields["type"]
    wrong_type = _any([f.present & ~f.type_ok for f in fields.values()])
    missing = _any(
        [
            ~fields[name].present & record_type.value.isin(*types)
            for name, types in _types_requiring().items()
        ]
    )
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


def line_reason(value: Column, document: Column, parse_ok: Column, fields: dict[str, FieldColumns]) -> Column:
    """The reason a JSON line is unusable (null when it is a valid record)."""
    is_object = F.coalesce(F.schema_of_variant(document).startswith("OBJECT"), F.lit(False))
    return (
        F.when(F.length(value) > ls.MAX_LINE_CHARS, F.lit(ls.TOO_LONG))
        .when(~parse_ok, F.lit(ls.BAD_JSON))
        .when(~is_object, F.lit(ls.NOT_OBJECT))
        .otherwise(record_reason(fields))
    )


def classify_lines(lines: DataFrame, column: str = "value") -> DataFrame:
    """Text lines -> the schema's typed columns plus MALFORMED (null for valid records).

    The other columns of `lines` are kept; so is the line itself.
    """
    document, parse_ok = parse_json_line(F.col(column))
    fields = json_field_columns(document)
    reason = line_reason(F.col(column), document, parse_ok, fields)
    typed = [fields[f.name].value.cast(f.dataType).alias(f.name) for f in ls.spark_schema().fields]
    return lines.select(*lines.columns, *typed, reason.alias(MALFORMED))


def _types_requiring() -> dict[str, tuple[str, ...]]:
    """Field name -> record types that require it (the transpose of REQUIRED_BY_TYPE)."""
    result: dict[str, list[str]] = {}
    for record_type in ls.RECORD_TYPES:
        for name in ls.required_fields(record_type):
            result.setdefault(name, []).append(record_type)
    return {name: tuple(types) for name, types in result.items()}
