"""Message filters: RocketMQ's SQL92 property expressions (compile once, match many) and tag expressions.

``compile_sql92("a > 5 AND b = 'x'").matches(message.properties)`` answers as a RocketMQ 4.9.8 broker with
``enablePropertyFilter=true`` answers for the same expression and properties (spec section 5). The grammar, the
compile-time checks and the evaluation rules follow RocketMQ's ``filter`` module (SelectorParser.jj,
ComparisonExpression, LogicExpression, UnaryExpression); RocketMQ 5.1.3's CONTAINS / STARTSWITH / ENDSWITH are
accepted too (they make those three words keywords, as in 5.1.3).

Evaluation uses SQL's three-valued logic: a missing property is null, ``FALSE AND null`` is FALSE, ``TRUE OR null``
is TRUE, ``NOT null`` is null, and a message matches only when the result is exactly TRUE. A property value that
cannot be converted to the type the comparison needs (``a > 5`` with ``a = "x"``) makes the whole expression fail
for that message, which then does not match (RocketMQ logs the exception and skips the message; ``matches`` just
answers False).

An expression is compiled into one Python function (its literals and property names are passed in as values, never
written into the generated source), so ``matches`` costs one call and a few dictionary lookups.

For a consumer (the API is stable): compile when subscribing, so that a bad expression fails there with
FilterSyntaxError, then keep the messages whose properties match, as a broker does after the ConsumeQueue step::

    flt = compile_sql92(expression)            # FilterSyntaxError (a ValueError) with .position
    kept = [m for m in batch if flt.matches(m.properties)]

``matches`` takes any ``Mapping[str, str]`` (values are strings, as message properties are), never raises for a
value, and is safe to call from many threads; a Sql92Filter pickles as its expression text.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from localmq.errors import FilterSyntaxError

__all__ = ["Sql92Filter", "compile_sql92", "tag_names", "FilterSyntaxError"]

# -- tag expressions ("a || b") ---------------------------------------------------------------------------------

_TAG_CACHE: Dict[str, Optional[frozenset[str]]] = {}


def tag_names(tags: Optional[str]) -> Optional[frozenset[str]]:
    """The tags a tag expression names, as RocketMQ's FilterAPI.buildSubscriptionData reads a subscription: None
    (every tag) for None, "" and exactly "*"; else the set of trimmed, non-empty parts of "a || b". A "*" part of a
    longer expression ("a || *") is a literal tag named "*", and an expression whose parts are all blank (" || ")
    names no tag, so it matches nothing (RocketMQ's broker then compares against an empty set of hashes).

    Raises FilterSyntaxError for an expression that is nothing but separators ("||"), which RocketMQ's client refuses
    ("subString split error")."""
    if tags is None:
        return None
    f = _TAG_CACHE.get(tags, False)
    if f is False:
        if tags == "" or tags == "*":
            f = None
        else:
            parts = tags.split("||")
            while parts and parts[-1] == "":
                parts.pop()  # Java's String.split drops trailing empty strings
            if not parts:
                raise FilterSyntaxError("a tag expression of separators only names nothing", tags, 0)
            f = frozenset(t.strip() for t in parts if t.strip())
        if len(_TAG_CACHE) < 1024:
            _TAG_CACHE[tags] = f
    return f  # type: ignore[return-value]


# -- tokens ---------------------------------------------------------------------------------------------------------

_KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)
_WHITESPACE = " \t\n\r\f"
# JavaCC picks the longest match at each position (a keyword beats an identifier of the same length).
_DECIMAL_RE = re.compile(r"(?:0|[1-9][0-9]*)[lL]?")
_FLOAT_RE = re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_ID_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_STRING_RE = re.compile(r"'(?:''|[^'])*'")
# RocketMQ's grammar wants a line end after a -- comment, but ignores whatever follows a complete expression, so a
# comment that runs to the end of the text works there too
_LINE_COMMENT_RE = re.compile(r"--[^\n\r]*(?:\r\n|\n|\r|\Z)")
_BLOCK_COMMENT_RE = re.compile(r"/\*.*?\*/", re.S)
_OPERATORS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-")

# Nesting allowed: parentheses, NOT and signs within one another (a bound on the parser's recursion and on the
# indentation of the generated function, where Python allows 100 levels), and the depth of the tree, which chains of
# comparisons ("a = 1 = TRUE = ...") also grow (a bound on the code generator's recursion). Chains of AND / OR are
# one node each: they do not nest.
_MAX_NESTING = 64
_MAX_TREE_DEPTH = 256
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MIN_POSITIVE = 5e-324


class _Token:
    __slots__ = ("kind", "text", "pos", "value")

    def __init__(self, kind: str, text: str, pos: int, value: Any = None) -> None:
        self.kind = kind  # a keyword in upper case, an operator, "ID", "STRING", "DECIMAL", "FLOAT" or "EOF"
        self.text = text
        self.pos = pos
        self.value = value


def _tokenize(expression: str) -> List[_Token]:
    tokens: List[_Token] = []
    i, n = 0, len(expression)
    while i < n:
        c = expression[i]
        if c in _WHITESPACE:
            i += 1
            continue
        if expression.startswith("--", i):
            m = _LINE_COMMENT_RE.match(expression, i)
            if m is not None:
                i = m.end()
                continue
        if expression.startswith("/*", i):
            m = _BLOCK_COMMENT_RE.match(expression, i)
            if m is None:
                raise FilterSyntaxError("unterminated /* comment", expression, i)
            i = m.end()
            continue
        if c == "'":
            m = _STRING_RE.match(expression, i)
            if m is None:
                raise FilterSyntaxError("unterminated string literal", expression, i)
            tokens.append(_Token("STRING", m.group(), i, m.group()[1:-1].replace("''", "'")))
            i = m.end()
            continue
        best: Optional[Tuple[str, int]] = None
        for kind, rx in (("DECIMAL", _DECIMAL_RE), ("FLOAT", _FLOAT_RE), ("ID", _ID_RE)):
            m = rx.match(expression, i)
            if m is not None and (best is None or m.end() > best[1]):
                best = (kind, m.end())
        if best is not None:
            kind, end = best
            text = expression[i:end]
            if kind == "ID" and text.upper() in _KEYWORDS:
                kind = text.upper()
            tokens.append(_Token(kind, text, i))
            i = end
            continue
        for op in _OPERATORS:
            if expression.startswith(op, i):
                tokens.append(_Token(op, op, i))
                i += len(op)
                break
        else:
            raise FilterSyntaxError(f"unexpected character {c!r}", expression, i)
    tokens.append(_Token("EOF", "", n))
    return tokens


# -- syntax tree ----------------------------------------------------------------------------------------------------
#
# Every node knows what RocketMQ's expression object would be, because its compile-time checks look at that:
# ``const`` (a ConstantExpression: a literal, not a negated one), ``boolean`` (a BooleanExpression: comparisons,
# AND/OR/NOT, IN, TRUE/FALSE/NULL), ``prop`` (a PropertyExpression). ``jtype`` is the Java type of every non-null
# value the node can produce: "str", "bool", "int" (Integer), "long" (Long), "double" (Double), or "null" for a
# node that is always null.


class _Node:
    __slots__ = ("op", "pos", "args", "value", "jtype", "const", "boolean", "prop", "depth")

    def __init__(
        self,
        op: str,
        pos: int,
        args: Sequence[_Node] = (),
        value: Any = None,
        jtype: str = "bool",
        const: bool = False,
        boolean: bool = True,
        prop: bool = False,
    ) -> None:
        self.op = op
        self.pos = pos
        self.args = tuple(args)
        self.value = value
        self.jtype = jtype
        self.const = const
        self.boolean = boolean
        self.prop = prop
        self.depth: int = 1 + max((a.depth for a in self.args), default=0)


def _literal(pos: int, value: Any, jtype: str) -> _Node:
    return _Node("const", pos, value=value, jtype=jtype, const=True, boolean=jtype in ("bool", "null"))


def _describe(node: _Node) -> str:
    """How an error message names ``node``."""
    if node.op == "prop":
        return f"property {node.value}"
    if node.const:
        return "NULL" if node.value is None else f"{node.jtype} literal {node.value!r}"
    return "a condition" if node.boolean else "an expression"


class _Parser:
    """Recursive descent over RocketMQ's SelectorParser.jj grammar (spec 5.2); builds _Node trees and applies the
    checks RocketMQ makes while building its expression objects."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = _tokenize(expression)
        self.i = 0
        self.level = 0

    # token helpers
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def error(self, message: str, pos: int) -> FilterSyntaxError:
        return FilterSyntaxError(message, self.expression, pos)

    def unexpected(self, wanted: str) -> FilterSyntaxError:
        t = self.peek()
        if t.kind == "EOF":
            return self.error(f"unexpected end of expression, expected {wanted}", t.pos)
        return self.error(f"unexpected {t.text!r}, expected {wanted}", t.pos)

    def expect(self, kind: str, wanted: str) -> _Token:
        if self.peek().kind != kind:
            raise self.unexpected(wanted)
        return self.take()

    # checks RocketMQ applies when it builds its objects
    def as_boolean(self, node: _Node) -> _Node:
        if node.boolean:
            return node
        if node.prop:
            return _Node("boolcast", node.pos, (node,))
        raise self.error(
            f"{_describe(node)} is not a condition (a comparison, AND/OR/NOT, IN, TRUE, FALSE or a property)", node.pos
        )

    def check_ordered(self, node: _Node) -> None:
        if (node.const and node.jtype not in ("int", "long", "double")) or node.boolean:
            raise self.error(
                f"{_describe(node)} cannot be compared with < <= > >= (only numbers and properties can)", node.pos
            )

    def check_equal(self, left: _Node, right: _Node) -> None:
        for n in (left, right):
            if n.const and n.value is None:
                raise self.error("NULL cannot be compared with = or <> (use IS NULL / IS NOT NULL)", n.pos)
        if left.const and right.const and left.boolean and not right.boolean:
            raise self.error(f"{_describe(left)} cannot be compared with {_describe(right)}", right.pos)

    # grammar
    def nest(self, pos: int) -> None:
        self.level += 1
        if self.level > _MAX_NESTING:
            raise self.error(
                f"expression nested too deeply (more than {_MAX_NESTING} parentheses, NOT or signs within one another)",
                pos,
            )

    def parse(self) -> _Node:
        node = self.or_expr()
        # RocketMQ's parser stops after the first complete expression and ignores the rest ("a = 'x' b = 'y'" is
        # "a = 'x'" there); text after the expression is refused here, as it is almost always a mistake
        if self.peek().kind != "EOF":
            raise self.unexpected("AND, OR or the end of the expression")
        node = self.as_boolean(node)
        deep = node
        while deep.depth > _MAX_TREE_DEPTH:  # chains of comparisons nest without recursing in the parser
            deep = max(deep.args, key=lambda a: a.depth)
        if deep is not node:
            raise self.error(
                f"expression nested too deeply (more than {_MAX_TREE_DEPTH} levels of operators)", deep.pos
            )
        return node

    def or_expr(self) -> _Node:
        return self.chain("OR", self.and_expr)

    def and_expr(self) -> _Node:
        return self.chain("AND", self.equality)

    def chain(self, word: str, operand: Callable[[], _Node]) -> _Node:
        # "x AND y AND z" is RocketMQ's ((x AND y) AND z); one n-ary node evaluates the same (left to right, up to
        # the first FALSE) without nesting
        first = operand()
        if self.peek().kind != word:
            return first
        args = [first]
        while self.peek().kind == word:
            self.take()
            right = operand()
            if len(args) == 1:
                args[0] = self.as_boolean(first)
            args.append(self.as_boolean(right))
        return _Node(word.lower(), first.pos, args)

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            k = self.peek().kind
            if k in ("=", "<>"):
                self.take()
                right = self.comparison()
                self.check_equal(left, right)
                left = _Node("eq", left.pos, (left, right))
                if k == "<>":
                    left = _Node("not", left.pos, (left,))
            elif k == "IS" and self.peek(1).kind == "NULL":
                self.i += 2
                left = _Node("isnull", left.pos, (left,))
            elif k == "IS" and self.peek(1).kind == "NOT" and self.peek(2).kind == "NULL":
                self.i += 3
                left = _Node("not", left.pos, (_Node("isnull", left.pos, (left,)),))
            elif k == "IS":
                self.take()
                if self.peek().kind == "NOT":
                    self.take()
                    raise self.unexpected("NULL after IS NOT")
                raise self.unexpected("NULL or NOT NULL after IS")
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            t = self.peek()
            k = t.kind
            negated = False
            if k == "NOT" and self.peek(1).kind in ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.take()
                negated = True
                t = self.peek()
                k = t.kind
            if k in (">", ">=", "<", "<="):
                self.take()
                right = self.unary()
                self.check_ordered(left)
                self.check_ordered(right)
                left = _Node(k, left.pos, (left, right))
            elif k == "BETWEEN":
                self.take()
                low = self.unary()
                self.expect("AND", "AND of BETWEEN ... AND ...")
                high = self.unary()
                left = self.between(left, low, high, negated)
            elif k == "IN":
                self.take()
                self.expect("(", "'(' after IN")
                items = [self.expect("STRING", "a string literal").value]
                while self.peek().kind == ",":
                    self.take()
                    items.append(self.expect("STRING", "a string literal").value)
                self.expect(")", "',' or ')'")
                if not left.prop:
                    raise self.error(f"IN needs a property on its left, not {_describe(left)}", left.pos)
                left = _Node("in", left.pos, (left,), value=(frozenset(items), negated))
            elif k in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.take()
                s = self.expect("STRING", f"a string literal after {k}").value
                left = _Node(k.lower(), left.pos, (left,), value=(s, negated))
            else:
                return left

    def between(self, value: _Node, low: _Node, high: _Node, negated: bool) -> _Node:
        if negated:
            # NOT BETWEEN is "< low OR > high"; RocketMQ does not check the order of its bounds
            lt = self.ordered("<", value, low)
            gt = self.ordered(">", value, high)
            return _Node("or", value.pos, (lt, gt))
        if low.const and high.const:
            if low.value is None or high.value is None:
                raise self.error("BETWEEN bounds cannot be NULL", (low if low.value is None else high).pos)
            try:
                order = _java_compare(high.value, high.jtype, low.value, low.jtype)
            except _EvalError:
                order = -1
            if order < 0:
                raise self.error(
                    f"BETWEEN bounds out of order: {low.value!r} is greater than {high.value!r} (write "
                    f"the lower bound first)",
                    low.pos,
                )
        ge = self.ordered(">=", value, low)
        le = self.ordered("<=", value, high)
        return _Node("and", value.pos, (ge, le))

    def ordered(self, op: str, left: _Node, right: _Node) -> _Node:
        self.check_ordered(left)
        self.check_ordered(right)
        return _Node(op, left.pos, (left, right))

    def unary(self) -> _Node:
        t = self.peek()
        if t.kind in ("+", "-", "NOT"):
            self.nest(t.pos)
            try:
                return self.signed_or_not(t)
            finally:
                self.level -= 1
        return self.primary()

    def signed_or_not(self, t: _Token) -> _Node:
        if t.kind == "+":
            self.take()
            return self.unary()
        if t.kind == "-":
            self.take()
            child = self.unary()
            if child.op == "const" and child.jtype in ("int", "long", "double"):
                # a negated literal is no longer a ConstantExpression for RocketMQ's checks; its value is known
                return _Node("const", t.pos, value=-child.value, jtype=child.jtype, const=False, boolean=False)
            # negating anything but a number gives null (after evaluating it, which may fail)
            return _Node("negate", t.pos, (child,), jtype="null", boolean=False)
        self.take()  # NOT
        child = self.unary()
        return _Node("not", t.pos, (self.as_boolean(child),))

    def primary(self) -> _Node:
        t = self.peek()
        k = t.kind
        if k == "(":
            self.take()
            self.nest(t.pos)
            node = self.or_expr()
            self.level -= 1
            self.expect(")", "')'")
            return node
        if k == "ID":
            self.take()
            return _Node("prop", t.pos, value=t.text, jtype="str", boolean=False, prop=True)
        if k == "STRING":
            self.take()
            return _literal(t.pos, t.value, "str")
        if k == "DECIMAL":
            self.take()
            v = int(t.text.rstrip("lL"))
            if v > _INT64_MAX:
                raise self.error(f"integer literal {t.text} is larger than a long (9223372036854775807)", t.pos)
            return _literal(t.pos, v, "int" if v <= _INT32_MAX else "long")
        if k == "FLOAT":
            self.take()
            d = float(t.text)
            if d > 1.7976931348623157e308 or d < _DOUBLE_MIN_POSITIVE:
                # RocketMQ refuses literals it would read as infinity or as 0 (including 0.0 itself)
                raise self.error(
                    f"float literal {t.text} is outside {_DOUBLE_MIN_POSITIVE}..1.7976931348623157e308", t.pos
                )
            return _literal(t.pos, d, "double")
        if k in ("TRUE", "FALSE"):
            self.take()
            return _literal(t.pos, k == "TRUE", "bool")
        if k == "NULL":
            self.take()
            return _literal(t.pos, None, "null")
        raise self.unexpected("a property, a literal, '(' or NOT")


# -- evaluation helpers (Java's conversions, called by the generated code) ------------------------------------------


class _EvalError(Exception):
    """A conversion RocketMQ's evaluation throws on: the message does not match."""


def _int32(s: str) -> int:
    # Integer.valueOf: an optional sign, then (Unicode) decimal digits; no blanks, no "_"
    if not s.isdecimal() and not (len(s) > 1 and s[0] in "+-" and s[1:].isdecimal()):
        raise _EvalError(s)
    v = int(s)
    if _INT32_MIN <= v <= _INT32_MAX:
        return v
    raise _EvalError(s)


def _int64(s: str) -> int:
    if not s.isdecimal() and not (len(s) > 1 and s[0] in "+-" and s[1:].isdecimal()):
        raise _EvalError(s)
    v = int(s)
    if _INT64_MIN <= v <= _INT64_MAX:
        return v
    raise _EvalError(s)


_JAVA_DOUBLE_RE = re.compile(
    r"([+-]?)(?:(NaN)|(Infinity)|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|(0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)"
)


def _double(s: str) -> float:
    # Double.valueOf: trims chars <= ' ', then Java's literal syntax (NaN, Infinity, hex, an f/d suffix); ASCII only
    if not s.strip("0123456789.eE+-"):
        # only characters of a plain decimal: Python's float() reads exactly what Java's Double.valueOf reads
        try:
            return float(s)
        except ValueError:
            raise _EvalError(s) from None
    m = _JAVA_DOUBLE_RE.fullmatch(s.strip("".join(map(chr, range(33)))))
    if m is None:
        raise _EvalError(s)
    sign, nan, inf, dec, hexa = m.groups()
    if nan:
        return math.nan
    if inf:
        return -math.inf if sign == "-" else math.inf
    return float(sign + dec) if dec else float.fromhex(sign + hexa)


def _java_bool(s: str) -> bool:
    # Boolean.valueOf: "true" in any case, everything else false; never fails
    return len(s) == 4 and s.lower() == "true"


def _dcmp(a: float, b: float) -> int:
    # Double.compareTo: NaN above everything and equal to itself, -0.0 below 0.0
    if a < b:
        return -1
    if a > b:
        return 1
    an, bn = a != a, b != b
    if an or bn:
        return 0 if an and bn else (1 if an else -1)
    if a == 0.0:
        sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
        return 0 if sa == sb else (-1 if sa < sb else 1)
    return 0


_NUMERIC = ("int", "long", "double")


def _java_compare(lv: Any, lt: str, rv: Any, rt: str) -> int:
    """RocketMQ's ``__compare`` with string conversion on, for two non-null values of Java types lt and rt."""
    if lt == rt:
        if lt == "double":
            return _dcmp(lv, rv)
        return int(lv > rv) - int(lv < rv)
    if lt in _NUMERIC and rt in _NUMERIC:
        if "double" in (lt, rt):
            return _dcmp(float(lv), float(rv))
        return int(lv > rv) - int(lv < rv)
    if lt == "str" and rt in _NUMERIC:
        return _java_compare(_CONVERT[rt](lv), rt, rv, rt)
    if rt == "str" and lt in _NUMERIC:
        return _java_compare(lv, lt, _CONVERT[lt](rv), lt)
    if lt == "str" and rt == "bool":
        return _java_compare(_java_bool(lv), "bool", rv, "bool")
    if lt == "bool" and rt == "str":
        raise _EvalError("Boolean compared with String")  # RocketMQ casts the Boolean to String: ClassCastException
    return -1  # Boolean vs number and number vs Boolean: RocketMQ answers "less"


_CONVERT: Dict[str, Callable[[str], Any]] = {"int": _int32, "long": _int64, "double": _double}


# -- code generation ------------------------------------------------------------------------------------------------


class _Codegen:
    """Turns a checked tree into the body of ``def matches(props)``: one local per node result, Python's ``if`` for
    RocketMQ's short-circuits (AND skips its right side after FALSE, OR after TRUE, an ordered comparison skips its
    right side when the left is null), so conversions run (and fail) exactly when RocketMQ's would."""

    def __init__(self) -> None:
        self.lines: List[str] = []
        self.consts: List[Any] = []
        self.n = 0

    def const(self, value: Any) -> str:
        for i, c in enumerate(self.consts):
            if (
                type(c) is type(value)
                and c == value
                and not (isinstance(c, float) and math.copysign(1, c) != math.copysign(1, value))
            ):
                return f"k{i}"
        self.consts.append(value)
        return f"k{len(self.consts) - 1}"

    def var(self) -> str:
        self.n += 1
        return f"r{self.n}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def value(self, node: _Node, depth: int) -> str:
        """Emit code computing ``node``; returns a Python expression (a local or a constant) holding its value."""
        op = node.op
        if op == "const":
            return "None" if node.value is None else self.const(node.value)
        if op == "prop":
            r = self.var()
            self.emit(depth, f"{r} = g({self.const(node.value)})")
            return r
        if op == "negate":
            self.value(node.args[0], depth)
            return "None"
        r = self.var()
        if op == "and" or op == "or":
            # stop at the first FALSE (AND) / TRUE (OR); else null when an operand was null
            stop, other = ("False", "True") if op == "and" else ("True", "False")
            a = self.value(node.args[0], depth)
            self.emit(depth, f"{r} = {stop} if {a} is {stop} else None if {a} is None else {other}")
            for arg in node.args[1:]:
                self.emit(depth, f"if {r} is not {stop}:")
                b = self.value(arg, depth + 1)
                self.emit(depth + 1, f"if {b} is {stop}:")
                self.emit(depth + 2, f"{r} = {stop}")
                self.emit(depth + 1, f"elif {b} is None:")
                self.emit(depth + 2, f"{r} = None")
        elif op == "not":
            a = self.value(node.args[0], depth)
            self.emit(depth, f"{r} = None if {a} is None else not {a}")
        elif op == "boolcast":
            a = self.value(node.args[0], depth)
            self.emit(depth, f"{r} = None if {a} is None else False")  # a String is never a Boolean
        elif op == "isnull":
            a = self.value(node.args[0], depth)
            self.emit(depth, f"{r} = {a} is None")
        elif op == "in":
            a = self.value(node.args[0], depth)
            items, negated = node.value
            self.emit(
                depth, f"{r} = None if {a} is None else ({a} {'not in' if negated else 'in'} {self.const(items)})"
            )
        elif op in ("contains", "startswith", "endswith"):
            a = self.value(node.args[0], depth)
            search, negated = node.value
            if not search or node.args[0].jtype != "str":
                self.emit(depth, f"{r} = False")  # 5.1.3: empty search, null or non-string values: FALSE
            else:
                k = self.const(search)
                test = {
                    "contains": f"{k} in {a}",
                    "startswith": f"{a}.startswith({k})",
                    "endswith": f"{a}.endswith({k})",
                }[op]
                self.emit(depth, f"{r} = False if {a} is None else {'not ' if negated else ''}({test})")
        elif op == "eq":
            left, right = node.args
            a = self.value(left, depth)
            b = self.value(right, depth)
            # one side null: null when it is the left one, FALSE when it is the right one; both null: TRUE
            test = self.compare(a, left, b, right, "==")
            if not _nullable(left) and not _nullable(right):
                self.emit(depth, f"{r} = {test}")
            elif not _nullable(right):
                self.emit(depth, f"{r} = None if {a} is None else {test}")
            else:
                self.emit(depth, f"if {a} is None:")
                self.emit(depth + 1, f"{r} = {b} is None or None")
                self.emit(depth, f"elif {b} is None:")
                self.emit(depth + 1, f"{r} = False")
                self.emit(depth, "else:")
                self.emit(depth + 1, f"{r} = {test}")
        else:  # > >= < <=
            left, right = node.args
            a = self.value(left, depth)
            if _nullable(left):
                self.emit(depth, f"if {a} is None:")
                self.emit(depth + 1, f"{r} = None")
                self.emit(depth, "else:")
                depth += 1
            b = self.value(right, depth)
            if left.jtype == "str" and right.jtype == "str":
                # two strings are compared as doubles (RocketMQ refuses to order strings)
                test = f"_dcmp(_double({a}), _double({b})) {op} 0"
            else:
                test = self.compare(a, left, b, right, op)
            if _nullable(right):
                self.emit(depth, f"{r} = None if {b} is None else {test}")
            else:
                self.emit(depth, f"{r} = {test}")
        return r

    def compare(self, a: str, left: _Node, b: str, right: _Node, op: str) -> str:
        """A Python expression for ``compare(a, b) op 0`` (RocketMQ's __compare) on two non-null values."""
        lt, rt = left.jtype, right.jtype
        if lt == "null" or rt == "null":
            return "None"  # unreachable: that side was null
        if (lt, rt) in (("str", "double"), ("double", "str")):
            k = right if rt == "double" else left
            if k.op == "const" and k.value != 0.0 and math.isfinite(k.value):
                # against a non-zero number, Java's order differs from Python's only for NaN, which Double.compareTo
                # puts above every number: the NaN case falls on the right side of a negated comparison
                x = f"_double({a})" if lt == "str" else f"_double({b})"
                if lt == "str":
                    return {
                        "==": f"{x} == {b}",
                        "<": f"{x} < {b}",
                        "<=": f"{x} <= {b}",
                        ">": f"not {x} <= {b}",
                        ">=": f"not {x} < {b}",
                    }[op]
                return {
                    "==": f"{a} == {x}",
                    "<": f"not {a} >= {x}",
                    "<=": f"not {a} > {x}",
                    ">": f"{a} > {x}",
                    ">=": f"{a} >= {x}",
                }[op]
        fast = {
            ("str", "int"): (f"_int32({a})", b),
            ("int", "str"): (a, f"_int32({b})"),
            ("str", "long"): (f"_int64({a})", b),
            ("long", "str"): (a, f"_int64({b})"),
            ("str", "str"): (a, b),
            ("int", "int"): (a, b),
            ("int", "long"): (a, b),
            ("long", "int"): (a, b),
            ("long", "long"): (a, b),
        }.get((lt, rt))
        if fast is not None and (op == "==" or (lt, rt) != ("str", "str")):
            return f"{fast[0]} {op} {fast[1]}"
        if (lt, rt) == ("bool", "bool"):
            return f"{a} {op} {b}"
        if (lt, rt) == ("str", "bool") and op == "==":
            return f"_java_bool({a}) is {b}"
        return f"_java_compare({a}, {self.const(lt)}, {b}, {self.const(rt)}) {op} 0"


def _nullable(node: _Node) -> bool:
    """Whether ``node`` can be null at run time (every node but a non-NULL literal, negated or not)."""
    return not (node.op == "const" and node.value is not None)


_HELPERS: Dict[str, Any] = {
    "_int32": _int32,
    "_int64": _int64,
    "_double": _double,
    "_java_bool": _java_bool,
    "_dcmp": _dcmp,
    "_java_compare": _java_compare,
    "_EvalError": _EvalError,
}


def _generate(tree: _Node) -> Tuple[Callable[[Mapping[str, str]], bool], str]:
    gen = _Codegen()
    body: List[str] = []
    gen.lines = body
    result = gen.value(tree, 2)
    if not body:
        body.append("            pass")  # a literal TRUE, FALSE or NULL
    names = ", ".join(f"k{i}" for i in range(len(gen.consts)))
    src = ["def _make(K):"]
    if gen.consts:
        src.append(f"    {names}{',' if len(gen.consts) == 1 else ''} = K")
    src += ["    def matches(props):", "        g = props.get", "        try:"]
    src += ["    " + line for line in body]
    src += [
        "        except _EvalError:",
        "            return False",
        f"        return {result} is True",
        "    return matches",
    ]
    source = "\n".join(src) + "\n"
    namespace: Dict[str, Any] = dict(_HELPERS)
    exec(compile(source, "<sql92 filter>", "exec"), namespace)  # noqa: S102 - source built from the tree only
    return namespace["_make"](tuple(gen.consts)), source


# -- public API -----------------------------------------------------------------------------------------------------

_M = TypeVar("_M")


class Sql92Filter:
    """A compiled SQL92 filter expression (build it with ``compile_sql92``). Immutable and thread-safe.

    ``matches(properties) -> bool``: True when the expression is exactly TRUE on a message's properties (a
    ``Mapping[str, str]`` such as ``Message.properties``; a missing key is null). Never raises for a value that
    does not convert: such a message does not match, as in RocketMQ.

    ``expression`` is the text it was compiled from.
    """

    __slots__ = ("expression", "matches", "_source")

    matches: Callable[[Mapping[str, str]], bool]

    def __init__(self, expression: str) -> None:
        """Compile ``expression``; raises FilterSyntaxError (see ``compile_sql92``)."""
        if not isinstance(expression, str):
            raise TypeError(f"a filter expression must be a str, not {type(expression).__name__}")
        tree = _Parser(expression).parse()
        self.expression = expression
        self.matches, self._source = _generate(tree)

    def select(self, property_maps: Iterable[Mapping[str, str]]) -> List[Mapping[str, str]]:
        """The property maps among ``property_maps`` that match, in order."""
        m = self.matches
        return [p for p in property_maps if m(p)]

    def filter_messages(self, messages: Iterable[_M]) -> List[_M]:
        """The messages (objects with a ``properties`` mapping, e.g. ``Message``) whose properties match."""
        m = self.matches
        return [msg for msg in messages if m(msg.properties)]  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"Sql92Filter({self.expression!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sql92Filter) and other.expression == self.expression

    def __hash__(self) -> int:
        return hash(self.expression)

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        return (Sql92Filter, (self.expression,))  # the generated function is rebuilt where it is unpickled


def compile_sql92(expression: str) -> Sql92Filter:
    """Compile a RocketMQ SQL92 filter expression (spec 5.2) once, to match many messages.

    Grammar: OR, AND, NOT; ``= <> > >= < <=``; ``[NOT] BETWEEN a AND b``; ``[NOT] IN ('a', 'b')``;
    ``IS [NOT] NULL``; unary ``+``/``-``; parentheses; string literals (``''`` escapes a quote), integers (int32,
    else int64; optional ``L``), floats (``5.5``, ``5.``, ``.5``, exponents), TRUE, FALSE, NULL; keywords in any
    case; identifiers ``[A-Za-z_$][A-Za-z0-9_$]*``; ``-- ...`` comments (to the end of the line) and ``/* ... */``
    comments. RocketMQ 5.1.3+: ``[NOT] CONTAINS|STARTSWITH|ENDSWITH 'text'``.

    Raises FilterSyntaxError (a ValueError; ``.expression``, ``.position``) for a syntax error and for what
    RocketMQ refuses when it compiles: BETWEEN with constant bounds out of order or NULL, IN without a property on
    its left, ``= NULL``, ``<``/``>`` on a string or boolean literal or on a condition, a float literal that reads
    as 0 or infinity, an integer literal beyond int64, and an expression that is not a condition (``-a``, ``5``).
    Unlike RocketMQ, which ignores text after the first complete expression, text left over is an error.
    TypeError when ``expression`` is not a str.

    Compiled filters are kept (up to 256 expressions, as RocketMQ's parser keeps its last 100): compiling the same
    text again returns the same object.
    """
    f = _COMPILED.get(expression) if isinstance(expression, str) else None
    if f is None:
        f = Sql92Filter(expression)
        if len(_COMPILED) >= 256:
            _COMPILED.clear()
        _COMPILED[expression] = f
    return f


_COMPILED: Dict[str, Sql92Filter] = {}
