"""localmq.filter: RocketMQ's SQL92 filter (grammar, compile-time checks, three-valued evaluation) and tag expressions.

The expectations are written from the spec (rocketmq-semantics.md sections 5.2 and 5.3) and, where it is silent,
from RocketMQ 4.9.8's filter sources (ComparisonExpression, LogicExpression, UnaryExpression, SelectorParser.jj);
the MATCHES rows were also run through RocketMQ's own SelectorParser (rocketmq-filter 4.9.7, whose filter sources
are identical to 4.9.8's) and gave the same answers.
"""

import pickle

import pytest

import localmq
from localmq.errors import FilterSyntaxError, LocalMQError
from localmq.filter import Sql92Filter, compile_sql92, tag_names

# (expression, properties, matches?)
MATCHES = [
    # = and <> on strings
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'x'", {"a": "y"}, False),
    ("a = 'x'", {}, False),  # missing: null, not FALSE ...
    ("a <> 'x'", {}, False),  # ... so <> does not match either
    ("a <> 'x'", {"a": "y"}, True),
    ("a <> 'x'", {"a": "x"}, False),
    ("'x' = a", {"a": "x"}, True),
    ("a = b", {"a": "1", "b": "1"}, True),
    ("a = b", {"a": "1", "b": "01"}, False),  # two strings: compared as strings
    # numbers: the property string converted to the literal's type
    ("a = 10", {"a": "10"}, True),
    ("a = 10", {"a": "+10"}, True),  # Integer.valueOf takes a sign
    ("a = 10", {"a": "010"}, True),
    ("a = 10", {"a": "10.0"}, False),  # not an int: conversion fails
    ("a <> 10", {"a": "10.0"}, False),  # ... and a failure is never a match, under NOT either
    ("a = 10", {"a": " 10"}, False),
    ("a = 10", {"a": "1_0"}, False),
    ("a = 10", {"a": "ten"}, False),
    ("a = 10", {"a": "0xA"}, False),
    ("a = 10", {"a": ""}, False),
    ("a = 10", {"a": "-"}, False),
    ("a = 3", {"a": "\u0663"}, True),  # Integer.valueOf reads any Unicode decimal digit ...
    ("a = 3.0", {"a": "\u0663"}, False),  # ... Double.valueOf only ASCII ones
    ("a <> 10", {"a": "ten"}, False),
    ("a <> 10", {"a": "11"}, True),
    ("a = -10", {"a": "-10"}, True),
    ("a = +10", {"a": "10"}, True),
    ("a = 10L", {"a": "10"}, True),
    ("a = 5", {"a": "2147483648"}, False),  # int32 literal: the value overflows Integer
    ("a <> 5", {"a": "2147483648"}, False),
    ("a = 2147483648", {"a": "2147483648"}, True),  # int64 literal
    ("a > 2147483647", {"a": "2147483648"}, False),  # int32 literal: Integer.valueOf overflows, no match
    ("a = -2147483648", {"a": "-2147483648"}, True),
    ("a = 9223372036854775807", {"a": "9223372036854775807"}, True),
    ("a = 2147483648", {"a": "9223372036854775808"}, False),  # beyond int64
    ("a = 5.5", {"a": "5.5"}, True),
    ("a = 5.5", {"a": "5.50"}, True),
    ("a = 5.", {"a": "5"}, True),
    ("a = .5", {"a": "0.5"}, True),
    ("a = 1E3", {"a": "1000"}, True),
    ("a = 1.5e-3", {"a": "0.0015"}, True),
    ("a = 2.5", {"a": "2.5d"}, True),  # Double.valueOf takes Java's suffixes ...
    ("a = 2.5", {"a": " 2.5 "}, True),  # ... and trims blanks
    ("a = 2.5", {"a": "2,5"}, False),
    ("a = 1.0", {"a": "1"}, True),
    ("a = 1", {"a": "1.0"}, False),
    ("a > 1.5", {"a": "NaN"}, True),  # Double.compareTo puts NaN above every number
    ("a < 1.5", {"a": "NaN"}, False),
    ("a > 1.5", {"a": "nan"}, False),  # "nan" is not Java's NaN: conversion fails
    ("a > 1.5", {"a": "Infinity"}, True),
    ("1.5 < a", {"a": "NaN"}, True),
    ("a >= 1.5", {"a": "NaN"}, True),
    ("a <= 1.5", {"a": "NaN"}, False),
    ("a = 8.0", {"a": "0x1p3"}, True),  # Java's hexadecimal floating literal
    ("a = 1.5", {"a": "1.5f"}, True),
    ("a = 1.5", {"a": "1_5"}, False),
    ("a > 1.5", {"a": "inf"}, False),
    # booleans: Boolean.valueOf ("true" in any case; anything else is false, never a failure)
    ("a = TRUE", {"a": "true"}, True),
    ("a = TRUE", {"a": "TRUE"}, True),
    ("a = true", {"a": "True"}, True),
    ("a = TRUE", {"a": "yes"}, False),
    ("a <> TRUE", {"a": "yes"}, True),
    ("a = FALSE", {"a": "yes"}, True),
    ("a = FALSE", {"a": "false"}, True),
    ("a = FALSE", {}, False),
    ("TRUE = a", {"a": "true"}, False),  # Boolean on the left: RocketMQ fails (ClassCastException) ...
    ("TRUE <> a", {"a": "false"}, False),  # ... whatever the value
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, False),
    ("TRUE = TRUE", {}, True),
    ("TRUE = FALSE", {}, False),
    ("1 = TRUE", {}, False),
    # < <= > >=: string vs number converts the string; two strings both parse as doubles
    ("a > 5", {"a": "6"}, True),
    ("a > 5", {"a": "5"}, False),
    ("a >= 5", {"a": "5"}, True),
    ("a < 5", {"a": "4"}, True),
    ("a < 5", {"a": "-4"}, True),
    ("a <= 5", {"a": "5"}, True),
    ("a <= 5", {"a": "6"}, False),
    ("a > 5", {"a": "5.5"}, False),  # an int literal wants an int
    ("a > 5.0", {"a": "5.5"}, True),
    ("a > 5", {"a": "x"}, False),
    ("a > 5", {}, False),
    ("5 < a", {"a": "6"}, True),
    ("a > -5", {"a": "-4"}, True),
    ("a > b", {"a": "10", "b": "9"}, True),  # as doubles, not as strings ("10" < "9")
    ("a > b", {"a": "1.5", "b": "1"}, True),
    ("a > b", {"a": "x", "b": "1"}, False),
    ("a > b", {"a": "2"}, False),
    ("a >= b", {"a": "1e1", "b": "10"}, True),
    ("3 > 2", {}, True),
    ("3 > 2.5", {}, True),
    ("2 < 2147483648", {}, True),
    # three-valued logic
    ("a = 'x' AND b = 'y'", {"a": "x", "b": "y"}, True),
    ("a = 'x' AND b = 'y'", {"a": "x"}, False),
    ("a = 'x' OR b = 'y'", {"b": "y"}, True),  # null OR TRUE = TRUE
    ("a = 'x' OR b = 'y'", {}, False),
    ("NOT a = 'x'", {"a": "y"}, False),  # NOT binds tighter: (NOT a) = 'x', a Boolean vs a String
    ("NOT (a = 'x')", {"a": "y"}, True),
    ("NOT (a = 'x')", {}, False),  # NOT null = null
    ("NOT (a = 'x' AND b = 'y')", {"a": "z"}, True),  # NOT (FALSE AND null) = NOT FALSE
    ("NOT (a = 'x' OR b = 'y')", {"a": "z"}, False),  # NOT (FALSE OR null) = null
    ("NOT (a = 'x' OR b = 'y')", {"a": "z", "b": "z"}, True),
    ("a > 5 AND b = 'x'", {"a": "x", "b": "y"}, False),
    ("b = 'y' AND a > 5", {"a": "x", "b": "x"}, False),
    ("b = 'x' OR a > 5", {"a": "x", "b": "x"}, True),  # OR stops at TRUE before the failing conversion
    ("a > 5 OR b = 'x'", {"a": "x", "b": "x"}, False),  # a failing conversion fails the whole expression
    ("a = 'x' OR b = 'y' AND c = 'z'", {"a": "x"}, True),  # AND before OR
    ("(a = 'x' OR b = 'y') AND c = 'z'", {"a": "x"}, False),
    ("a = 'x' OR b = 'y' AND c = 'z'", {"b": "y", "c": "z"}, True),
    ("NOT NOT (a = 'x')", {"a": "x"}, True),
    ("a", {"a": "true"}, False),  # a property as a condition: a String is never TRUE ...
    ("NOT a", {"a": "true"}, True),  # ... it is FALSE
    ("NOT a", {}, False),
    # IS [NOT] NULL
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": "x"}, False),
    ("a IS NOT NULL", {"a": "x"}, True),
    ("a IS NOT NULL", {}, False),
    ("a IS NULL OR a = 'x'", {}, True),
    ("(a = 'x') IS NULL", {}, True),
    ("NULL IS NULL", {}, True),
    # a missing property on one side of =: null on the left, FALSE on the right, TRUE for both
    ("a = b", {"a": "1"}, False),
    ("a <> b", {"a": "1"}, True),
    ("a <> b", {"b": "1"}, False),
    ("a = b", {}, True),
    ("'x' <> a", {}, True),
    # BETWEEN = >= low AND <= high; NOT BETWEEN = < low OR > high
    ("a BETWEEN 1 AND 3", {"a": "1"}, True),
    ("a BETWEEN 1 AND 3", {"a": "3"}, True),
    ("a BETWEEN 1 AND 3", {"a": "4"}, False),
    ("a BETWEEN 1 AND 3", {"a": "0"}, False),
    ("a BETWEEN 1 AND 3", {}, False),
    ("a BETWEEN 1.5 AND 3.0", {"a": "2.5"}, True),
    ("a BETWEEN 1.5 AND 3", {"a": "2.5"}, False),  # "<= 3" wants an int: "2.5" does not convert
    ("a BETWEEN 1 AND 1", {"a": "1"}, True),
    ("a BETWEEN -3 AND -1", {"a": "-2"}, True),
    ("a BETWEEN -1 AND -3", {"a": "-2"}, False),  # negated bounds are not constants: not checked, never TRUE
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "0"}, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
    ("a NOT BETWEEN 1 AND 3", {}, False),
    ("a NOT BETWEEN 3 AND 1", {"a": "2"}, True),  # NOT BETWEEN's bounds are not checked
    ("a between 1 and 3 and b = 'x'", {"a": "2", "b": "x"}, True),
    ("a BETWEEN 1 AND 3", {"a": "2.5"}, False),
    # IN / NOT IN
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a IN ('x', 'y')", {"a": "z"}, False),
    ("a IN ('x', 'y')", {}, False),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a NOT IN ('x', 'y')", {"a": "x"}, False),
    ("a NOT IN ('x', 'y')", {}, False),  # missing: null either way
    ("a IN ('1')", {"a": "01"}, False),  # string membership, no conversion
    ("a IN ('a','b','c','d','e','f')", {"a": "f"}, True),
    ("(a) IN ('x')", {"a": "x"}, True),
    ("NOT (a IN ('x'))", {}, False),
    # literals, escapes, comments, case
    ("a = 'it''s'", {"a": "it's"}, True),
    ("a = ''''", {"a": "'"}, True),
    ("a = ''", {"a": ""}, True),
    ("a = 'A B'", {"a": "a b"}, False),  # string comparison is case-sensitive
    ("a = 'x\ny'", {"a": "x\ny"}, True),
    ("a = 'é ✓'", {"a": "é ✓"}, True),
    ("a = 'x' -- a comment\n", {"a": "x"}, True),
    ("-- first\na = 'x'\n", {"a": "x"}, True),
    ("a = 'x' -- to the end", {"a": "x"}, True),
    ("a = 'x' --\r\n AND b = 'y'", {"a": "x"}, False),
    ("a /* a comment */ = 'x'", {"a": "x"}, True),
    ("a = /* '*/ 'x'", {"a": "x"}, True),
    ("a = 'x' /* ** */", {"a": "x"}, True),
    ("a = '--x'", {"a": "--x"}, True),
    ("a = '/* x */'", {"a": "/* x */"}, True),
    ("a = 'x' and B = 'y'", {"a": "x", "B": "y"}, True),
    ("a = 'x' AnD b = 'y'", {"a": "x", "b": "y"}, True),
    ("a Is NoT nUlL", {"a": "x"}, True),
    ("A = 'x'", {"a": "x"}, False),  # property names are looked up as written
    ("$a_1 = 'x'", {"$a_1": "x"}, True),
    ("_ = 'x'", {"_": "x"}, True),
    ("ORDER = 'x'", {"ORDER": "x"}, True),  # a keyword prefix is still an identifier
    ("TAGS = 'x'", {"TAGS": "x"}, True),
    ("\ta\r\n=\f'x'", {"a": "x"}, True),
    # unary + and -
    ("a = - -5", {"a": "5"}, True),
    ("a = -(5)", {"a": "-5"}, True),
    ("-a = -5", {"a": "5"}, False),  # negating a String gives null
    ("-a IS NULL", {"a": "5"}, True),
    ("a = +'x'", {"a": "x"}, True),
    # 5.1.3+ CONTAINS / STARTSWITH / ENDSWITH
    ("a CONTAINS 'b'", {"a": "abc"}, True),
    ("a CONTAINS 'x'", {"a": "abc"}, False),
    ("a CONTAINS 'x'", {}, False),
    ("a NOT CONTAINS 'x'", {"a": "abc"}, True),
    ("a NOT CONTAINS 'x'", {}, False),  # missing: FALSE (not null)
    ("a CONTAINS ''", {"a": "abc"}, False),  # an empty search never matches
    ("a NOT CONTAINS ''", {"a": "abc"}, False),
    ("a STARTSWITH 'ab'", {"a": "abc"}, True),
    ("a NOT STARTSWITH 'ab'", {"a": "abc"}, False),
    ("a ENDSWITH 'bc'", {"a": "abc"}, True),
    ("a NOT ENDSWITH 'x'", {"a": "abc"}, True),
    ("NOT (a CONTAINS 'x')", {}, True),
]

# (expression, position of the error)
SYNTAX_ERRORS = [
    ("", 0),
    ("   ", 3),
    ("a =", 3),
    ("a = 'x", 4),
    ("a = 'x''", 7),
    ("a == 'x'", 3),
    ("a != 'x'", 2),
    ('a = "x"', 4),
    ("a = 'x' AND", 11),
    ("a = 'x' b = 'y'", 8),  # RocketMQ ignores what follows a complete expression; refused here
    ("(a = 'x'", 8),
    ("a = 'x')", 7),
    ("a = 1 /* open", 6),
    ("a.b = 'x'", 1),
    ("a-b = 'x'", 1),
    ("1a = 'x'", 1),
    ("a = 05", 5),
    ("a = 1.2.3", 7),
    ("a = 9223372036854775808", 4),  # beyond int64
    ("a = 0.0", 4),  # RocketMQ refuses float literals that read as 0 ...
    ("a > 1e400", 4),  # ... or as infinity
    ("a IN ()", 6),
    ("a IN ('x',)", 10),
    ("a IN (1, 2)", 6),
    ("a IN 'x'", 5),
    ("5 IN ('x')", 0),  # IN needs a property on its left
    ("'a' IN ('x')", 0),
    ("(a = 'x') IN ('x')", 1),
    ("a BETWEEN 3 AND 1", 10),  # constant bounds out of order
    ("a BETWEEN 1.5 AND 1", 10),
    ("a BETWEEN 1 AND", 15),
    ("a BETWEEN NULL AND 1", 10),
    ("a BETWEEN 'a' AND 'b'", 10),
    ("a = NULL", 4),
    ("NULL = a", 0),
    ("a <> NULL", 5),
    ("a > 'x'", 4),  # only numbers are ordered
    ("'x' < a", 0),
    ("a > TRUE", 4),
    ("a > NULL", 4),
    ("a > (b = 1)", 5),
    ("NOT a > 5", 0),  # (NOT a) > 5: a condition cannot be ordered
    ("a > 1 > 0", 0),
    ("TRUE = 'x'", 7),
    ("a IS 5", 5),
    ("a IS NOT", 8),
    ("5", 0),
    ("'x'", 0),
    ("-a", 0),
    ("a = 1 AND 5", 10),
    ("NOT 5", 4),
    ("a = 'x' OR", 10),
    ("a ~ 'x'", 2),
    ("a = 'x';", 7),
    ("AND = 'x'", 0),
    ("contains = 'x'", 0),  # 5.1.3 made it a keyword (4.9.8: a property)
    ("a CONTAINS 5", 11),
    ("a = 1 /* x */ /", 14),
]


@pytest.mark.parametrize("expression,properties,expected", MATCHES)
def test_matches(expression, properties, expected):
    assert compile_sql92(expression).matches(properties) is expected


@pytest.mark.parametrize("expression,position", SYNTAX_ERRORS)
def test_syntax_error_position(expression, position):
    with pytest.raises(FilterSyntaxError) as e:
        compile_sql92(expression)
    assert e.value.position == position
    assert e.value.expression == expression
    line = str(e.value).splitlines()
    assert f"position {position}" in line[0]
    if "\n" not in expression:
        assert line[2].index("^") - 4 == position


def test_filter_syntax_error_is_a_value_error():
    assert issubclass(FilterSyntaxError, LocalMQError) and issubclass(FilterSyntaxError, ValueError)
    assert localmq.FilterSyntaxError is FilterSyntaxError
    with pytest.raises(ValueError, match="out of order"):
        compile_sql92("a BETWEEN 3 AND 1")


def test_error_caret_on_the_offending_line():
    with pytest.raises(FilterSyntaxError) as e:
        compile_sql92("a = 'x'\nAND b >")
    assert e.value.position == 15
    assert str(e.value).splitlines()[1:] == ["    AND b >", "           ^"]


def test_non_str_expression():
    with pytest.raises(TypeError):
        compile_sql92(None)  # type: ignore[arg-type]


def test_literals_never_reach_generated_source():
    # a literal that looks like code stays a value
    evil = "a = 'x'' or True or ''' OR b IN ('__import__(\"os\")')"
    f = compile_sql92(evil)
    assert f.matches({"a": "x' or True or '"})
    assert not f.matches({"a": "x"})
    assert f.matches({"b": '__import__("os")'})
    assert "__import__" not in f._source and "True or" not in f._source


def test_api_helpers():
    f = compile_sql92("a > 5 AND b = 'x'")
    assert f.expression == "a > 5 AND b = 'x'"
    assert repr(f) == "Sql92Filter(\"a > 5 AND b = 'x'\")"
    maps = [{"a": "6", "b": "x"}, {"a": "4", "b": "x"}, {"a": "x"}, {}, {"a": "60", "b": "x"}]
    assert f.select(maps) == [maps[0], maps[4]]

    class Msg:
        def __init__(self, properties):
            self.properties = properties

    msgs = [Msg(m) for m in maps]
    assert f.filter_messages(msgs) == [msgs[0], msgs[4]]
    g = pickle.loads(pickle.dumps(f))
    assert isinstance(g, Sql92Filter) and g == f and hash(g) == hash(f)
    assert g.matches(maps[0]) and not g.matches(maps[1])
    assert localmq.compile_sql92 is compile_sql92
    assert compile_sql92("a > 5 AND b = 'x'") is f  # compiled once


def test_matches_with_message_properties():
    # the properties a stored message carries (TAGS, KEYS) are properties like any other
    q = localmq.MemoryMessageQueue()
    q.put("t", b"x", tags="created", keys=["k1"], properties={"region": "eu", "n": "7"})
    msg = q.get_message("t", 0, 0).messages[0]
    assert compile_sql92("TAGS = 'created' AND region IN ('eu', 'us') AND n BETWEEN 5 AND 9").matches(msg.properties)
    assert not compile_sql92("KEYS = 'k2'").matches(msg.properties)
    q.close()


# RocketMQ's FilterAPI.buildSubscriptionData: only null, "" and exactly "*" subscribe to everything; the parts of
# a longer expression are trimmed tags, "*" among them a literal tag; blank parts are dropped
@pytest.mark.parametrize(
    "tags,expected",
    [
        (None, None),
        ("*", None),
        ("", None),
        ("a || *", frozenset({"a", "*"})),
        (" * ", frozenset({"*"})),
        (" || ", frozenset()),
        ("a||", frozenset({"a"})),
        ("a", frozenset({"a"})),
        (" a || b ||c ", frozenset({"a", "b", "c"})),
        ("a||a", frozenset({"a"})),
    ],
)
def test_tag_names(tags, expected):
    assert tag_names(tags) == expected
    from localmq.queues.base import tag_names as from_base

    assert from_base is tag_names


@pytest.mark.parametrize("tags", ["||", "||||"])
def test_tag_expression_of_separators_only_is_refused(tags):
    with pytest.raises(localmq.FilterSyntaxError):
        tag_names(tags)
    mq = localmq.MemoryMessageQueue()
    with pytest.raises(localmq.FilterSyntaxError):
        mq.create_consumer("g", "t", tags=tags)  # at subscription, as RocketMQ's client
    mq.close()


@pytest.mark.parametrize("kind", ["memory", "embedded", "local"])
def test_a_star_inside_a_tag_expression_is_a_literal_tag(tmp_path, kind):
    q = (
        localmq.MemoryMessageQueue()
        if kind == "memory"
        else localmq.EmbeddedMessageQueue(str(tmp_path / "e"))
        if kind == "embedded"
        else localmq.open(tmp_path / "s")
    )
    try:
        for tag in ("a", "*", "b", None):
            q.put("t", (tag or "-").encode(), tags=tag)
        if kind == "local":
            assert q.wait_for_dispatch(10)
        assert [bytes(m.body) for m in q.get_message("t", 0, 0, 32, tags="a || *").messages] == [b"a", b"*"]
        assert [bytes(m.body) for m in q.get_message("t", 0, 0, 32, tags="*").messages] == [b"a", b"*", b"b", b"-"]
        assert q.get_message("t", 0, 0, 32, tags=" || ").messages == []  # names no tag: matches nothing
    finally:
        q.close()


def test_long_chains_and_deep_nesting():
    # AND / OR chains are flat: thousands of terms compile and evaluate left to right
    f = compile_sql92(" AND ".join(f"a{i} = '{i}'" for i in range(3000)))
    assert f.matches({f"a{i}": str(i) for i in range(3000)})
    assert not f.matches({f"a{i}": str(i) for i in range(2999)})
    assert compile_sql92(" OR ".join(["a > 5"] * 2999 + ["b = 'x'"])).matches({"a": "x", "b": "x"}) is False
    assert compile_sql92(" OR ".join(["a > 5"] * 2999 + ["b = 'x'"])).matches({"b": "x"})
    # 64 parentheses (or NOT, or signs) within one another are accepted; more are refused, never a RecursionError
    assert compile_sql92("(" * 64 + "a = 1" + ")" * 64).matches({"a": "1"})
    nested = "a = 1"
    for _ in range(64):
        nested = f"a = 1 AND ({nested})"
    assert compile_sql92(nested).matches({"a": "1"})
    assert compile_sql92("NOT " * 63 + "(a = 1)").matches({"a": "2"})
    assert compile_sql92("- " * 64 + "1 = a").matches({"a": "1"})
    for text, position in [
        ("(" * 65 + "a = 1" + ")" * 65, 64),
        ("(" * 5000, 64),
        ("NOT " * 65 + "a", 256),
        ("a = 1" + " = TRUE" * 300, 0),
    ]:
        with pytest.raises(FilterSyntaxError, match="nested too deeply") as e:
            compile_sql92(text)
        assert e.value.position == position


def test_a_consumer_selects_messages_by_sql92(tmp_path):
    with localmq.open(tmp_path, mapped_file_size_commit_log=1 << 20) as st:
        p = st.create_producer(queue_id=0)
        for i in range(10):
            p.send("orders", b"%d" % i, properties={"price": str(i * 10), "region": "eu" if i % 2 else "us"})
        with pytest.raises(FilterSyntaxError):
            st.create_consumer("g", "orders", sql="price >")
        with st.create_consumer("g", "orders", sql="price >= 40 AND region = 'eu'", manual_ack=True) as c:
            got = []
            while len(got) < 3:
                batch = c.poll_batch(10, timeout=5)
                assert batch, got
                got += batch
            assert [m.body for m in got] == [b"5", b"7", b"9"]
            for m in got:
                m.ack()
            c.commit()
            assert c.committed("orders", 0) == 10 and c.filtered_out == 7
