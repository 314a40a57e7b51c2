package localmq.spark;

import java.io.Serializable;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A RocketMQ SQL92 property filter (option {@code sql}), a port of localmq's {@code localmq/filter.py}: the same
 * grammar (RocketMQ's SelectorParser.jj, 5.1.3's CONTAINS / STARTSWITH / ENDSWITH), the same compile-time checks
 * and messages, and the same evaluation: SQL's three-valued logic, RocketMQ's comparisons with Java's conversions
 * (a value that does not convert makes the message not match), AND / OR / ordered comparisons short-circuiting as
 * RocketMQ's do. Where filter.py generates Python code, this walks the tree. A message matches when the expression
 * is exactly TRUE on its properties.
 */
final class Sql92Filter implements Serializable {
    private static final long serialVersionUID = 1L;

    /** A filter expression that does not compile (Python's FilterSyntaxError), with its position. */
    static final class SyntaxError extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;
        final String reason;
        final int position;

        SyntaxError(String reason, String expression, int position) {
            super(format(reason, expression, position));
            this.reason = reason;
            this.position = position;
        }

        private static String format(String reason, String expression, int position) {
            int lineStart = expression.lastIndexOf('\n', position - 1) + 1;
            int lineEnd = expression.indexOf('\n', position);
            String line = lineEnd < 0 ? expression.substring(lineStart) : expression.substring(lineStart, lineEnd);
            return reason + " at position " + position + "\n    " + line + "\n    " + " ".repeat(position - lineStart)
                    + "^";
        }
    }

    /** A conversion RocketMQ's evaluation throws on: the message does not match. */
    private static final class EvalError extends RuntimeException {
        private static final long serialVersionUID = 1L;

        EvalError() {
            super(null, null, false, false);
        }
    }

    private static final EvalError EVAL_ERROR = new EvalError();
    private static final Set<String> KEYWORDS = Set.of("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL",
            "IS", "CONTAINS", "STARTSWITH", "ENDSWITH");
    private static final String WHITESPACE = " \t\n\r\f";
    private static final Pattern DECIMAL = Pattern.compile("(?:0|[1-9][0-9]*)[lL]?");
    private static final Pattern FLOAT = Pattern.compile(
            "[0-9]+\\.[0-9]*(?:[eE][+-]?[0-9]+)?|\\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+");
    private static final Pattern ID = Pattern.compile("[A-Za-z_$][A-Za-z0-9_$]*");
    private static final Pattern LINE_COMMENT = Pattern.compile("--[^\\n\\r]*(?:\\r\\n|\\n|\\r|\\z)");
    private static final Pattern BLOCK_COMMENT = Pattern.compile("/\\*.*?\\*/", Pattern.DOTALL);
    private static final String[] OPERATORS = {"<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-"};
    private static final int MAX_NESTING = 64;
    private static final int MAX_TREE_DEPTH = 256;
    private static final double DOUBLE_MIN_POSITIVE = 5e-324;

    final String expression;
    private final Node tree;

    private Sql92Filter(String expression) {
        this.expression = expression;
        this.tree = new Parser(expression).parse();
    }

    /** Compile {@code expression}; raises {@link SyntaxError} as filter.py's compile_sql92 raises. */
    static Sql92Filter compile(String expression) {
        return new Sql92Filter(expression);
    }

    /** Whether the expression is exactly TRUE on {@code props} (a missing property is null). */
    boolean matches(Map<String, String> props) {
        try {
            return Boolean.TRUE.equals(eval(tree, props));
        } catch (EvalError e) {
            return false;
        }
    }

    // -- tokens ---------------------------------------------------------------------------------------------------

    private static final class Token {
        final String kind;  // a keyword in upper case, an operator, "ID", "STRING", "DECIMAL", "FLOAT" or "EOF"
        final String text;
        final int pos;
        final String value;

        Token(String kind, String text, int pos, String value) {
            this.kind = kind;
            this.text = text;
            this.pos = pos;
            this.value = value;
        }
    }

    private static List<Token> tokenize(String e) {
        List<Token> tokens = new ArrayList<>();
        int i = 0;
        int n = e.length();
        while (i < n) {
            char c = e.charAt(i);
            if (WHITESPACE.indexOf(c) >= 0) {
                i++;
                continue;
            }
            if (e.startsWith("--", i)) {
                Matcher m = LINE_COMMENT.matcher(e).region(i, n);
                if (m.lookingAt()) {
                    i = m.end();
                    continue;
                }
            }
            if (e.startsWith("/*", i)) {
                Matcher m = BLOCK_COMMENT.matcher(e).region(i, n);
                if (!m.lookingAt()) {
                    throw new SyntaxError("unterminated /* comment", e, i);
                }
                i = m.end();
                continue;
            }
            if (c == '\'') {
                int end = stringEnd(e, i);
                if (end < 0) {
                    throw new SyntaxError("unterminated string literal", e, i);
                }
                String g = e.substring(i, end);
                tokens.add(new Token("STRING", g, i, g.substring(1, g.length() - 1).replace("''", "'")));
                i = end;
                continue;
            }
            String kind = null;
            int end = -1;
            for (Object[] kr : new Object[][] {{"DECIMAL", DECIMAL}, {"FLOAT", FLOAT}, {"ID", ID}}) {
                Matcher m = ((Pattern) kr[1]).matcher(e).region(i, n);
                if (m.lookingAt() && m.end() > end) {
                    kind = (String) kr[0];
                    end = m.end();
                }
            }
            if (kind != null) {
                String text = e.substring(i, end);
                if (kind.equals("ID") && KEYWORDS.contains(text.toUpperCase(Locale.ROOT))) {
                    kind = text.toUpperCase(Locale.ROOT);
                }
                tokens.add(new Token(kind, text, i, null));
                i = end;
                continue;
            }
            boolean found = false;
            for (String op : OPERATORS) {
                if (e.startsWith(op, i)) {
                    tokens.add(new Token(op, op, i, null));
                    i += op.length();
                    found = true;
                    break;
                }
            }
            if (!found) {
                throw new SyntaxError("unexpected character " + pyRepr(String.valueOf(c)), e, i);
            }
        }
        tokens.add(new Token("EOF", "", n, null));
        return tokens;
    }

    /**
     * The end of the string literal opening at {@code i}, or -1: Python's regex {@code '(?:''|[^'])*'} (a quote
     * closes it unless doubled; with no closing quote, the first quote of the last doubled pair closes it), scanned
     * by hand, as Java's regex engine recurses per repetition and long literals would overflow its stack.
     */
    private static int stringEnd(String e, int i) {
        int lastPair = -1;
        int j = i + 1;
        while (j < e.length()) {
            if (e.charAt(j) == '\'') {
                if (j + 1 < e.length() && e.charAt(j + 1) == '\'') {
                    lastPair = j;
                    j += 2;
                    continue;
                }
                return j + 1;
            }
            j++;
        }
        return lastPair < 0 ? -1 : lastPair + 1;
    }

    // -- syntax tree ----------------------------------------------------------------------------------------------

    /**
     * A node, with what RocketMQ's expression object would be (its checks look at that): const (a literal, not a
     * negated one), bool (a condition), prop (a property); jtype: the Java type of its non-null values ("str",
     * "bool", "int", "long", "double", or "null" for a node that is always null).
     */
    private static final class Node implements Serializable {
        private static final long serialVersionUID = 1L;
        final String op;
        final int pos;
        final Node[] args;
        final Object value;
        final String jtype;
        final boolean isConst;
        final boolean isBoolean;
        final boolean isProp;
        final int depth;
        // IN / CONTAINS...: the items or the search text, and NOT
        Set<String> items;
        String search;
        boolean negated;

        Node(String op, int pos, Node[] args, Object value, String jtype, boolean isConst, boolean isBoolean,
             boolean isProp) {
            this.op = op;
            this.pos = pos;
            this.args = args;
            this.value = value;
            this.jtype = jtype;
            this.isConst = isConst;
            this.isBoolean = isBoolean;
            this.isProp = isProp;
            int d = 0;
            for (Node a : args) {
                d = Math.max(d, a.depth);
            }
            this.depth = 1 + d;
        }

        static Node of(String op, int pos, Node... args) {
            return new Node(op, pos, args, null, "bool", false, true, false);
        }

        static Node literal(int pos, Object value, String jtype) {
            return new Node("const", pos, new Node[0], value, jtype, true, jtype.equals("bool") || jtype.equals("null"),
                    false);
        }
    }

    /** How an error message names {@code node}. */
    private static String describe(Node node) {
        if (node.op.equals("prop")) {
            return "property " + node.value;
        }
        if (node.isConst) {
            return node.value == null ? "NULL" : node.jtype + " literal " + pyRepr(node.value);
        }
        return node.isBoolean ? "a condition" : "an expression";
    }

    /** Recursive descent over RocketMQ's grammar, as filter.py's _Parser. */
    private static final class Parser {
        private final String expression;
        private final List<Token> tokens;
        private int i;
        private int level;

        Parser(String expression) {
            this.expression = expression;
            this.tokens = tokenize(expression);
        }

        Token peek(int ahead) {
            return tokens.get(Math.min(i + ahead, tokens.size() - 1));
        }

        Token peek() {
            return peek(0);
        }

        Token take() {
            return tokens.get(i++);
        }

        SyntaxError error(String message, int pos) {
            return new SyntaxError(message, expression, pos);
        }

        SyntaxError unexpected(String wanted) {
            Token t = peek();
            if (t.kind.equals("EOF")) {
                return error("unexpected end of expression, expected " + wanted, t.pos);
            }
            return error("unexpected " + pyRepr(t.text) + ", expected " + wanted, t.pos);
        }

        Token expect(String kind, String wanted) {
            if (!peek().kind.equals(kind)) {
                throw unexpected(wanted);
            }
            return take();
        }

        Node asBoolean(Node node) {
            if (node.isBoolean) {
                return node;
            }
            if (node.isProp) {
                return Node.of("boolcast", node.pos, node);
            }
            throw error(describe(node) + " is not a condition (a comparison, AND/OR/NOT, IN, TRUE, FALSE or a "
                    + "property)", node.pos);
        }

        void checkOrdered(Node node) {
            boolean numeric = node.jtype.equals("int") || node.jtype.equals("long") || node.jtype.equals("double");
            if ((node.isConst && !numeric) || node.isBoolean) {
                throw error(describe(node) + " cannot be compared with < <= > >= (only numbers and properties can)",
                        node.pos);
            }
        }

        void checkEqual(Node left, Node right) {
            for (Node n : new Node[] {left, right}) {
                if (n.isConst && n.value == null) {
                    throw error("NULL cannot be compared with = or <> (use IS NULL / IS NOT NULL)", n.pos);
                }
            }
            if (left.isConst && right.isConst && left.isBoolean && !right.isBoolean) {
                throw error(describe(left) + " cannot be compared with " + describe(right), right.pos);
            }
        }

        void nest(int pos) {
            level++;
            if (level > MAX_NESTING) {
                throw error("expression nested too deeply (more than " + MAX_NESTING + " parentheses, NOT or signs "
                        + "within one another)", pos);
            }
        }

        Node parse() {
            Node node = orExpr();
            if (!peek().kind.equals("EOF")) {
                throw unexpected("AND, OR or the end of the expression");
            }
            node = asBoolean(node);
            Node deep = node;
            while (deep.depth > MAX_TREE_DEPTH) {
                Node best = deep.args[0];
                for (Node a : deep.args) {
                    if (a.depth > best.depth) {
                        best = a;
                    }
                }
                deep = best;
            }
            if (deep != node) {
                throw error("expression nested too deeply (more than " + MAX_TREE_DEPTH + " levels of operators)",
                        deep.pos);
            }
            return node;
        }

        Node orExpr() {
            return chain("OR", true);
        }

        Node andExpr() {
            return chain("AND", false);
        }

        Node chain(String word, boolean or) {
            Node first = or ? andExpr() : equality();
            if (!peek().kind.equals(word)) {
                return first;
            }
            List<Node> args = new ArrayList<>();
            args.add(first);
            while (peek().kind.equals(word)) {
                take();
                Node right = or ? andExpr() : equality();
                if (args.size() == 1) {
                    args.set(0, asBoolean(first));
                }
                args.add(asBoolean(right));
            }
            return Node.of(word.toLowerCase(Locale.ROOT), first.pos, args.toArray(new Node[0]));
        }

        Node equality() {
            Node left = comparison();
            while (true) {
                String k = peek().kind;
                if (k.equals("=") || k.equals("<>")) {
                    take();
                    Node right = comparison();
                    checkEqual(left, right);
                    left = Node.of("eq", left.pos, left, right);
                    if (k.equals("<>")) {
                        left = Node.of("not", left.pos, left);
                    }
                } else if (k.equals("IS") && peek(1).kind.equals("NULL")) {
                    i += 2;
                    left = Node.of("isnull", left.pos, left);
                } else if (k.equals("IS") && peek(1).kind.equals("NOT") && peek(2).kind.equals("NULL")) {
                    i += 3;
                    left = Node.of("not", left.pos, Node.of("isnull", left.pos, left));
                } else if (k.equals("IS")) {
                    take();
                    if (peek().kind.equals("NOT")) {
                        take();
                        throw unexpected("NULL after IS NOT");
                    }
                    throw unexpected("NULL or NOT NULL after IS");
                } else {
                    return left;
                }
            }
        }

        Node comparison() {
            Node left = unary();
            while (true) {
                Token t = peek();
                String k = t.kind;
                boolean negated = false;
                String next = peek(1).kind;
                if (k.equals("NOT") && (next.equals("BETWEEN") || next.equals("IN") || next.equals("CONTAINS")
                        || next.equals("STARTSWITH") || next.equals("ENDSWITH"))) {
                    take();
                    negated = true;
                    t = peek();
                    k = t.kind;
                }
                if (k.equals(">") || k.equals(">=") || k.equals("<") || k.equals("<=")) {
                    take();
                    Node right = unary();
                    checkOrdered(left);
                    checkOrdered(right);
                    left = Node.of(k, left.pos, left, right);
                } else if (k.equals("BETWEEN")) {
                    take();
                    Node low = unary();
                    expect("AND", "AND of BETWEEN ... AND ...");
                    Node high = unary();
                    left = between(left, low, high, negated);
                } else if (k.equals("IN")) {
                    take();
                    expect("(", "'(' after IN");
                    Set<String> items = new HashSet<>();
                    items.add(expect("STRING", "a string literal").value);
                    while (peek().kind.equals(",")) {
                        take();
                        items.add(expect("STRING", "a string literal").value);
                    }
                    expect(")", "',' or ')'");
                    if (!left.isProp) {
                        throw error("IN needs a property on its left, not " + describe(left), left.pos);
                    }
                    Node in = Node.of("in", left.pos, left);
                    in.items = items;
                    in.negated = negated;
                    left = in;
                } else if (k.equals("CONTAINS") || k.equals("STARTSWITH") || k.equals("ENDSWITH")) {
                    take();
                    String s = expect("STRING", "a string literal after " + k).value;
                    Node c = Node.of(k.toLowerCase(Locale.ROOT), left.pos, left);
                    c.search = s;
                    c.negated = negated;
                    left = c;
                } else {
                    return left;
                }
            }
        }

        Node between(Node value, Node low, Node high, boolean negated) {
            if (negated) {
                // NOT BETWEEN is "< low OR > high"; RocketMQ does not check the order of its bounds
                return Node.of("or", value.pos, ordered("<", value, low), ordered(">", value, high));
            }
            if (low.isConst && high.isConst) {
                if (low.value == null || high.value == null) {
                    throw error("BETWEEN bounds cannot be NULL", (low.value == null ? low : high).pos);
                }
                int order;
                try {
                    order = javaCompare(high.value, low.value);
                } catch (EvalError e) {
                    order = -1;
                }
                if (order < 0) {
                    throw error("BETWEEN bounds out of order: " + pyRepr(low.value) + " is greater than "
                            + pyRepr(high.value) + " (write the lower bound first)", low.pos);
                }
            }
            return Node.of("and", value.pos, ordered(">=", value, low), ordered("<=", value, high));
        }

        Node ordered(String op, Node left, Node right) {
            checkOrdered(left);
            checkOrdered(right);
            return Node.of(op, left.pos, left, right);
        }

        Node unary() {
            Token t = peek();
            if (t.kind.equals("+") || t.kind.equals("-") || t.kind.equals("NOT")) {
                nest(t.pos);
                try {
                    return signedOrNot(t);
                } finally {
                    level--;
                }
            }
            return primary();
        }

        Node signedOrNot(Token t) {
            if (t.kind.equals("+")) {
                take();
                return unary();
            }
            if (t.kind.equals("-")) {
                take();
                Node child = unary();
                if (child.op.equals("const") && (child.value instanceof Integer || child.value instanceof Long
                        || child.value instanceof Double)) {
                    // a negated literal is no longer a constant for RocketMQ's checks; its value is known
                    Object v = child.value instanceof Integer ? (Object) (-(Integer) child.value)
                            : child.value instanceof Long ? (Object) (-(Long) child.value) : (Object) (-(Double) child.value);
                    return new Node("const", t.pos, new Node[0], v, child.jtype, false, false, false);
                }
                // negating anything but a number gives null (after evaluating it, which may fail)
                return new Node("negate", t.pos, new Node[] {child}, null, "null", false, false, false);
            }
            take();  // NOT
            Node child = unary();
            return Node.of("not", t.pos, asBoolean(child));
        }

        Node primary() {
            Token t = peek();
            String k = t.kind;
            if (k.equals("(")) {
                take();
                nest(t.pos);
                Node node = orExpr();
                level--;
                expect(")", "')'");
                return node;
            }
            if (k.equals("ID")) {
                take();
                return new Node("prop", t.pos, new Node[0], t.text, "str", false, false, true);
            }
            if (k.equals("STRING")) {
                take();
                return Node.literal(t.pos, t.value, "str");
            }
            if (k.equals("DECIMAL")) {
                take();
                String digits = t.text.endsWith("l") || t.text.endsWith("L") ? t.text.substring(0, t.text.length() - 1)
                        : t.text;
                BigInteger v = new BigInteger(digits);
                if (v.bitLength() > 63) {
                    throw error("integer literal " + t.text + " is larger than a long (9223372036854775807)", t.pos);
                }
                long x = v.longValue();
                return x <= Integer.MAX_VALUE ? Node.literal(t.pos, (int) x, "int") : Node.literal(t.pos, x, "long");
            }
            if (k.equals("FLOAT")) {
                take();
                double d = Double.parseDouble(t.text);
                if (d > Double.MAX_VALUE || d < DOUBLE_MIN_POSITIVE) {
                    // RocketMQ refuses literals it would read as infinity or as 0 (including 0.0 itself)
                    throw error("float literal " + t.text + " is outside 5e-324..1.7976931348623157e308", t.pos);
                }
                return Node.literal(t.pos, d, "double");
            }
            if (k.equals("TRUE") || k.equals("FALSE")) {
                take();
                return Node.literal(t.pos, k.equals("TRUE"), "bool");
            }
            if (k.equals("NULL")) {
                take();
                return Node.literal(t.pos, null, "null");
            }
            throw unexpected("a property, a literal, '(' or NOT");
        }
    }

    // -- evaluation (Java's conversions, as RocketMQ's) -----------------------------------------------------------

    private static int int32(String s) {
        try {
            return Integer.parseInt(s);
        } catch (NumberFormatException e) {
            throw EVAL_ERROR;
        }
    }

    private static long int64(String s) {
        try {
            return Long.parseLong(s);
        } catch (NumberFormatException e) {
            throw EVAL_ERROR;
        }
    }

    private static double dbl(String s) {
        try {
            return Double.parseDouble(s);
        } catch (NumberFormatException e) {
            throw EVAL_ERROR;
        }
    }

    private static boolean numeric(Object v) {
        return v instanceof Integer || v instanceof Long || v instanceof Double;
    }

    /** RocketMQ's {@code __compare} with string conversion on, for two non-null values. */
    static int javaCompare(Object lv, Object rv) {
        if (lv.getClass() == rv.getClass()) {
            if (lv instanceof Double) {
                return Double.compare((Double) lv, (Double) rv);
            }
            if (lv instanceof String) {
                int c = ((String) lv).compareTo((String) rv);
                return Integer.signum(c);
            }
            if (lv instanceof Boolean) {
                return Boolean.compare((Boolean) lv, (Boolean) rv);
            }
            return Long.compare(((Number) lv).longValue(), ((Number) rv).longValue());
        }
        if (numeric(lv) && numeric(rv)) {
            if (lv instanceof Double || rv instanceof Double) {
                return Double.compare(((Number) lv).doubleValue(), ((Number) rv).doubleValue());
            }
            return Long.compare(((Number) lv).longValue(), ((Number) rv).longValue());
        }
        if (lv instanceof String && numeric(rv)) {
            return javaCompare(convert((String) lv, rv), rv);
        }
        if (rv instanceof String && numeric(lv)) {
            return javaCompare(lv, convert((String) rv, lv));
        }
        if (lv instanceof String && rv instanceof Boolean) {
            return Boolean.compare(Boolean.parseBoolean((String) lv), (Boolean) rv);
        }
        if (lv instanceof Boolean && rv instanceof String) {
            throw EVAL_ERROR;  // RocketMQ casts the Boolean to String: ClassCastException
        }
        return -1;  // Boolean vs number and number vs Boolean: RocketMQ answers "less"
    }

    private static Object convert(String s, Object like) {
        if (like instanceof Integer) {
            return int32(s);
        }
        if (like instanceof Long) {
            return int64(s);
        }
        return dbl(s);
    }

    private static Object eval(Node node, Map<String, String> props) {
        switch (node.op) {
            case "const":
                return node.value;
            case "prop":
                return props.get((String) node.value);
            case "negate":
                eval(node.args[0], props);
                return null;
            case "and":
            case "or": {
                // stop at the first FALSE (AND) / TRUE (OR); else null when an operand was null
                Boolean stop = node.op.equals("and") ? Boolean.FALSE : Boolean.TRUE;
                Object a = eval(node.args[0], props);
                Object r = stop.equals(a) ? stop : a == null ? null : (Object) !stop;
                for (int k = 1; k < node.args.length && !stop.equals(r); k++) {
                    Object b = eval(node.args[k], props);
                    if (stop.equals(b)) {
                        r = stop;
                    } else if (b == null) {
                        r = null;
                    }
                }
                return r;
            }
            case "not": {
                Object a = eval(node.args[0], props);
                return a == null ? null : (Object) !(Boolean) a;
            }
            case "boolcast": {
                Object a = eval(node.args[0], props);
                return a == null ? null : Boolean.FALSE;  // a String is never a Boolean
            }
            case "isnull":
                return eval(node.args[0], props) == null;
            case "in": {
                Object a = eval(node.args[0], props);
                return a == null ? null : (Object) (node.items.contains(a) != node.negated);
            }
            case "contains":
            case "startswith":
            case "endswith": {
                Object a = eval(node.args[0], props);
                if (node.search.isEmpty() || !node.args[0].jtype.equals("str")) {
                    return Boolean.FALSE;  // 5.1.3: empty search, null or non-string values: FALSE
                }
                if (a == null) {
                    return Boolean.FALSE;
                }
                String s = (String) a;
                boolean hit = node.op.equals("contains") ? s.contains(node.search)
                        : node.op.equals("startswith") ? s.startsWith(node.search) : s.endsWith(node.search);
                return hit != node.negated;
            }
            case "eq": {
                Object a = eval(node.args[0], props);
                Object b = eval(node.args[1], props);
                // one side null: null when it is the left one, FALSE when it is the right one; both null: TRUE
                if (a == null) {
                    return b == null ? Boolean.TRUE : null;
                }
                if (b == null) {
                    return Boolean.FALSE;
                }
                return javaCompare(a, b) == 0;
            }
            default: {  // > >= < <=
                Object a = eval(node.args[0], props);
                if (a == null) {
                    return null;
                }
                Object b = eval(node.args[1], props);
                if (b == null) {
                    return null;
                }
                int c = a instanceof String && b instanceof String ? Double.compare(dbl((String) a), dbl((String) b))
                        : javaCompare(a, b);
                switch (node.op) {
                    case ">":
                        return c > 0;
                    case ">=":
                        return c >= 0;
                    case "<":
                        return c < 0;
                    default:
                        return c <= 0;
                }
            }
        }
    }

    // -- Python's repr, for messages that quote values as filter.py's do ------------------------------------------

    static String pyRepr(Object v) {
        if (v instanceof String) {
            String s = (String) v;
            char q = s.indexOf('\'') >= 0 && s.indexOf('"') < 0 ? '"' : '\'';
            StringBuilder out = new StringBuilder().append(q);
            for (int k = 0; k < s.length(); k++) {
                char c = s.charAt(k);
                if (c == '\\' || c == q) {
                    out.append('\\').append(c);
                } else if (c == '\n') {
                    out.append("\\n");
                } else if (c == '\r') {
                    out.append("\\r");
                } else if (c == '\t') {
                    out.append("\\t");
                } else if (c < 0x20 || c == 0x7f) {
                    out.append(String.format(Locale.ROOT, "\\x%02x", (int) c));
                } else {
                    out.append(c);
                }
            }
            return out.append(q).toString();
        }
        if (v instanceof Boolean) {
            return (Boolean) v ? "True" : "False";
        }
        if (v instanceof Double) {
            return pyFloat((Double) v);
        }
        return String.valueOf(v);
    }

    /** Python's repr of a float: the shortest digits, fixed for exponents -4..15, else d.ddde+XX. */
    private static String pyFloat(double d) {
        if (Double.isNaN(d)) {
            return "nan";
        }
        if (Double.isInfinite(d)) {
            return d > 0 ? "inf" : "-inf";
        }
        if (d == 0) {
            return (1 / d < 0) ? "-0.0" : "0.0";
        }
        BigDecimal b = new BigDecimal(Double.toString(Math.abs(d))).stripTrailingZeros();
        String digits = b.unscaledValue().toString();
        int exp = digits.length() - 1 - b.scale();  // d = 0.digits * 10^(exp + 1)
        String sign = d < 0 ? "-" : "";
        if (exp >= -4 && exp < 16) {
            String plain = b.toPlainString();
            return sign + (plain.contains(".") ? plain : plain + ".0");
        }
        String mant = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
        return sign + mant + "e" + (exp < 0 ? "-" : "+") + String.format(Locale.ROOT, "%02d", Math.abs(exp));
    }
}
