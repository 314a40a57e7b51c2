"""SQL92 filter speed: property maps matched per second by a compiled expression, and the compile time.

A round matches every one of PROPERTY_MAPS property dicts (fixed seed; the properties a message carries: TAGS,
KEYS, UNIQ_KEY and four user properties, some missing) with ``Sql92Filter.matches``, one call per map, as a
consumer checks its messages. Three expressions of growing complexity; the match counts are checked against a
plain Python predicate written beside each, so a fast wrong answer cannot pass. The compile benchmark compiles
the most complex expression with ``Sql92Filter(expression)``, which parses, checks and generates code every time
(``compile_sql92`` answers a repeated expression from its cache).

    python -m pytest perf/test_filter_bench.py --benchmark-only -q -p no:cacheprovider
"""

import random

import pytest

from conftest import QUICK

filter_mod = pytest.importorskip("localmq.filter")

PROPERTY_MAPS = 2_000 if QUICK else 100_000
ROUNDS = 2 if QUICK else 9
COMPILES = 50 if QUICK else 2_000


def _maps():
    rng = random.Random(15)
    out = []
    for i in range(PROPERTY_MAPS):
        p = {
            "TAGS": rng.choice(("created", "paid", "shipped")),
            "KEYS": f"order-{i}",
            "UNIQ_KEY": f"7F0000010001{i:020X}",
            "a": str(rng.randrange(10)),
            "b": rng.choice("xyz"),
        }
        if rng.random() < 0.8:
            p["region"] = rng.choice(("eu", "us", "ap", "sa"))
        if rng.random() < 0.7:
            p["price"] = f"{rng.uniform(0, 200):.2f}"
        out.append(p)
    return out


def _in_range(p, low, high):
    return "price" in p and low <= float(p["price"]) <= high


EXPRESSIONS = {
    "simple": ("a > 5 AND b = 'x'", lambda p: int(p["a"]) > 5 and p["b"] == "x"),
    "medium": (
        "TAGS IN ('created', 'paid') AND (region = 'eu' OR region IS NULL) AND a BETWEEN 2 AND 7",
        lambda p: p["TAGS"] in ("created", "paid") and p.get("region") in ("eu", None) and 2 <= int(p["a"]) <= 7,
    ),
    "complex": (
        "(TAGS = 'paid' OR TAGS = 'shipped') AND NOT (region IN ('ap', 'sa')) AND price >= 19.5 "
        "AND price < 150.0 AND a <> 3 AND (b = 'x' OR b = 'y' OR KEYS = 'order-7') /* business rule */",
        lambda p: (
            p["TAGS"] in ("paid", "shipped")
            and p.get("region") in ("eu", "us")
            and _in_range(p, 19.5, 150.0)
            and float(p["price"]) < 150.0
            and p["a"] != "3"
            and (p["b"] in ("x", "y") or p["KEYS"] == "order-7")
        ),
    ),
}


@pytest.fixture(scope="module")
def property_maps():
    return _maps()


def _rate(benchmark, name, expression, maps, count):
    benchmark.extra_info.update(scenario=f"filter_{name}", expression=expression, messages=len(maps), matched=count)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        median = stats.stats.median
        benchmark.extra_info["msgs_per_s"] = round(len(maps) / median)
        print(
            f"\nfilter {name}: {len(maps) / median:,.0f} property maps/s ({median / len(maps) * 1e9:.0f} ns "
            f"each, {count:,} of {len(maps):,} matched): {expression}"
        )


def _bench_matches(benchmark, name, maps):
    expression, reference = EXPRESSIONS[name]
    matches = filter_mod.compile_sql92(expression).matches
    expected = sum(1 for p in maps if reference(p))

    def run():
        n = 0
        for p in maps:
            if matches(p):
                n += 1
        return n

    count = benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    assert count == expected and 0 < count < len(maps)
    _rate(benchmark, name, expression, maps, count)


def test_filter_simple(benchmark, property_maps):
    _bench_matches(benchmark, "simple", property_maps)


def test_filter_medium(benchmark, property_maps):
    _bench_matches(benchmark, "medium", property_maps)


def test_filter_complex(benchmark, property_maps):
    _bench_matches(benchmark, "complex", property_maps)


def test_filter_compile(benchmark):
    expression = EXPRESSIONS["complex"][0]
    compile_sql92 = filter_mod.Sql92Filter  # compile_sql92 would answer from its cache

    def run():
        for _ in range(COMPILES):
            compile_sql92(expression)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(scenario="filter_compile", expression=expression, compiles=COMPILES)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        per = stats.stats.median / COMPILES
        benchmark.extra_info["compile_us"] = round(per * 1e6, 1)
        print(f"\nfilter compile: {per * 1e6:.0f} us per expression ({len(expression)} chars)")
