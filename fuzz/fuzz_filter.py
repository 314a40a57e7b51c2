"""Fuzz target: SQL92 filters (filter.compile_sql92 on any text, then matches on any properties)."""

from common import check, main
from localmq.filter import compile_sql92

SEEDS = [
    b"a > 5 AND b = 'x'",
    b"TAGS IN ('created', 'paid') AND (region = 'eu' OR region IS NULL) AND a BETWEEN 2 AND 7",
    b"NOT (a <> 1.5e3) OR b NOT BETWEEN -2147483648 AND 9223372036854775807L /* c */ -- d\n",
    b"a = 'it''s' AND b IS NOT NULL AND c NOT IN ('x') AND d CONTAINS 'y' AND e = TRUE\x00a\x015\x02b\x01x",
    b"((a = .5 OR a = 5.) AND NOT a = 'x') = FALSE\x00a\x01NaN\x02c\x01 0x1p3 ",
]


def TestOneInput(data):
    text, _, rest = data.partition(b"\x00")
    f = check(compile_sql92, text.decode("utf-8", "replace"))
    if f is None:
        return
    props = {}
    for pair in rest.decode("utf-8", "replace").split("\x02"):
        k, _, v = pair.partition("\x01")
        props[k] = v
    assert f.matches(props) in (True, False)  # a value that does not convert is no match, never an exception
    assert f.matches({}) in (True, False)


def seeds():
    return SEEDS


if __name__ == "__main__":
    main(TestOneInput, seeds)
