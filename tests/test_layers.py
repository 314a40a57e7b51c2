"""The package's layers, read from the source: no import cycle, no upward import, the format written down once."""

import ast
import importlib.util
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "localmq")

# Layers from the bottom up (ARCHITECTURE.md). A module may import its own layer and any layer below it.
LAYERS = [
    (
        "bottom",
        ("localmq.status", "localmq.errors", "localmq.layout", "localmq.config", "localmq.interface", "localmq.filter"),
    ),
    ("native", ("localmq._",)),
    ("store", ("localmq.store",)),
    ("services", ("localmq.services",)),
    ("client", ("localmq.client",)),
    ("queues", ("localmq.queues",)),
    ("top", ("localmq.spark", "localmq.cli", "localmq.__main__", "localmq.aio", "localmq")),
]

CIMPORT_RE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport|cimport\s+([\w.]+))", re.M)
PYX_IMPORT_RE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s|import\s+([\w.]+))", re.M)


def layer_of(module):
    """Index of the layer ``module`` belongs to (the most specific prefix wins)."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p if p.endswith("_") else p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, module
    return best


def module_files():
    """{module name: [source files]} of every .py, .pyx and .pxd under localmq/."""
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith((".py", ".pyx", ".pxd", ".pyi")) or f.endswith(".pyi"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(ROOT))
            name = rel.rsplit(".", 1)[0].replace(os.sep, ".")
            if name.endswith(".__init__"):
                name = name[: -len(".__init__")]
            out.setdefault(name, []).append(os.path.join(dirpath, f))
    return out


def resolve(target, modules):
    """The localmq module an import names (``from localmq import x`` may name the submodule ``localmq.x``)."""
    return target if target in modules else None


def imports_of(path, name, modules):
    """localmq modules imported by one source file: every import statement, also inside functions and
    ``if TYPE_CHECKING`` blocks (those are edges of the design too)."""
    with open(path) as f:
        text = f.read()
    found = set()
    if path.endswith(".py"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.rsplit(".", node.level - (0 if path.endswith("__init__.py") else 0))[0]
                    mod = base + ("." + node.module if node.module else "")
                else:
                    mod = node.module
                subs = {f"{mod}.{a.name}" for a in node.names}
                named = {s for s in subs if s in modules}
                found.update(named)
                if len(named) < len(subs):  # some names are attributes of ``mod`` itself
                    found.add(mod)
    else:
        for m in CIMPORT_RE.finditer(text):
            found.add(m.group(1) or m.group(2))
        for m in PYX_IMPORT_RE.finditer(text):
            found.add(m.group(1) or m.group(2))
    out = set()
    for t in found:
        if t and t.startswith("localmq"):
            r = resolve(t, modules)
            if r is not None and r != name:
                out.add(r)
    return out


def graph():
    modules = module_files()
    return {name: set().union(*(imports_of(p, name, modules) for p in paths)) for name, paths in modules.items()}


def test_every_module_has_a_layer():
    for name in graph():
        layer_of(name)


def test_no_upward_import():
    bad = []
    for name, deps in sorted(graph().items()):
        if name == "localmq":
            continue  # the package's __init__ re-exports from every layer
        for d in sorted(deps):
            if d == "localmq" and layer_of(name) < len(LAYERS) - 1:
                bad.append(f"{name} -> localmq (the package __init__ sits on top)")
            elif layer_of(d) > layer_of(name):
                bad.append(f"{name} ({LAYERS[layer_of(name)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    g = {k: {d for d in v if d != "localmq"} for k, v in graph().items() if k != "localmq"}
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_bottom_layer_imports_nothing_native():
    # pure Python: importable before the extensions are built (setup.py reads layout.py this way)
    for name, deps in graph().items():
        if layer_of(name) == 0:
            assert all(layer_of(d) == 0 for d in deps), (name, deps)


def test_layout_pxd_is_generated_from_layout_py():
    spec = importlib.util.spec_from_file_location("_layout_check", os.path.join(ROOT, "layout.py"))
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    with open(os.path.join(ROOT, "_layout.pxd")) as f:
        assert f.read() == layout.pxd_source(), "localmq/_layout.pxd is stale: rebuild (setup.py writes it)"


# Numbers that are layout constants: outside layout.py (and the generated _layout.pxd) they must appear by name.
LAYOUT_LITERALS = [
    r"-626843481",
    r"-875286124",
    r"0xDAA320A7",
    r"0xCBD43194",
    r"\b0x4C4D5146\b",
    r">qqqqii",
    r"\(\"offset\", \">i8\"\)",
    r">hqqh",
    r">5q",
]


@pytest.mark.parametrize("pattern", LAYOUT_LITERALS)
def test_layout_constants_are_written_once(pattern):
    hits = []
    for paths in module_files().values():
        for p in paths:
            if os.path.basename(p) in ("layout.py", "_layout.pxd"):
                continue
            with open(p) as f:
                lines = f.readlines()
            for i, line in enumerate(lines, 1):
                code = line.split("#", 1)[0]
                if re.search(pattern, code) and not code.strip().startswith(('"', "'")):
                    hits.append(f"{os.path.relpath(p, ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


# -- the map: ARCHITECTURE.md names every module in its layer's row and every thread in its threads table ----------

ARCHITECTURE = os.path.join(os.path.dirname(ROOT), "ARCHITECTURE.md")


def _table(heading):
    """{first cell: whole row} of the first Markdown table under ``## heading`` in ARCHITECTURE.md."""
    with open(ARCHITECTURE) as f:
        text = f.read()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return {row.split("|")[1].strip(): row for row in rows[1:]}


def test_every_module_is_on_the_map_in_its_layer():
    rows = _table("Layers")
    missing = []
    for name in sorted(module_files()):
        if name != "localmq" and name.rsplit(".", 1)[-1] == "__init__":
            continue
        layer = LAYERS[layer_of(name)][0]
        stem = "__init__" if name == "localmq" else name.rsplit(".", 1)[-1]
        if (
            name.startswith("localmq.")
            and name.count(".") == 1
            and stem in ("spark", "queues", "client", "services", "store")
        ):
            continue  # a package: its modules are named
        pattern = rf"`(?:[\w/]+/)?{re.escape(stem)}(?:\.pyx|\.pxd|\.py)?`"
        if not re.search(pattern, rows[layer]):
            missing.append(f"{name} (layer {layer})")
    assert not missing, "modules missing from ARCHITECTURE.md's layer table:\n" + "\n".join(missing)


def _thread_names():
    """Every ServiceThread subclass (by class name) and every thread started by name (``name="localmq-..."``)."""
    found = set()
    for paths in module_files().values():
        for p in paths:
            if not p.endswith(".py"):
                continue
            with open(p) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", None)) == "ServiceThread" for b in node.bases
                ):
                    found.add(node.name)
                elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Thread":
                    for kw in node.keywords:
                        if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                            found.add(kw.value.value)
    return found


def test_every_thread_is_on_the_map():
    table = "\n".join(_table("Threads").values())
    names = _thread_names()
    assert len(names) >= 14, names  # the scan itself works
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, "threads missing from ARCHITECTURE.md's threads table:\n" + "\n".join(missing)


def test_the_jvm_readers_constants_agree_with_layout_py():
    """The JVM reader (localmq/spark/java) writes the format's numbers again in Java: every constant there named as in
    layout.py (or as a REC_/CQ_ field of it without the prefix) has layout.py's value. The CI run on ae41110 found
    the reader still at control file version 3, reading a live shared store past its committed end."""
    import re

    from localmq import layout

    def java_int(text, bits):
        text = text.strip().rstrip("Ll")
        m = re.fullmatch(r"(-?)(0[xX][0-9a-fA-F]+|\d+)(?:[Ll]? << (\d+))?", text)
        assert m, text
        v = int(m.group(2), 0) << int(m.group(3) or 0)
        v = -v if m.group(1) else v
        return v - (1 << bits) if v >= 1 << (bits - 1) else v  # Java's two's complement literals

    seen = 0
    java_root = os.path.join(ROOT, "spark", "java")
    for dirpath, _, files in os.walk(java_root):
        for name in files:
            if not name.endswith(".java"):
                continue
            with open(os.path.join(dirpath, name)) as f:
                src = f.read()
            for kind, const, value in re.findall(r"static final (int|long) ([A-Z0-9_]+) = ([^;]+);", src):
                for candidate in (const, "REC_" + const, "CQ_" + const):
                    if hasattr(layout, candidate) and isinstance(getattr(layout, candidate), int):
                        want = getattr(layout, candidate)
                        bits = 32 if kind == "int" else 64
                        got = java_int(value, bits)
                        assert got == want or got == want - (1 << bits) or got + (1 << bits) == want, (
                            f"{name}: {const} = {value}, layout.py {candidate} = {want}"
                        )
                        seen += 1
                        break
    assert seen >= 20, seen  # the reader's record, unit and control file constants were all found


# Rooms stay small enough to read (issue 26): no source file over FILE_LINES_MAX lines, and no function of the store
# (the engine: store/) over FUNCTION_LINES_MAX lines, its docstring and comments included.
FILE_LINES_MAX = 900
FUNCTION_LINES_MAX = 100
DEF_RE = re.compile(r"^(\s*)(?:async\s+def|def|cpdef|cdef)\s+(?:[\w\[\], .*]+\s+)?\*?(\w+)\s*\(")


def _functions(path):
    """(name, first line, lines) of every function of a .py or .pyx file: from its ``def`` line to the last line
    indented deeper than it (blank lines inside count, the blank lines after it do not)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    for i, line in enumerate(lines):
        m = DEF_RE.match(line)
        if m is None or line.rstrip().endswith(("noexcept", "nogil")) and "(" not in line:
            continue
        indent, end, depth = len(m.group(1)), i, 0
        while True:  # past the signature, which may span lines (its closing parenthesis at the def's indent)
            depth += lines[end].count("(") - lines[end].count(")")
            end += 1
            if depth <= 0 or end >= len(lines):
                break
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        while end > i + 1 and not lines[end - 1].strip():
            end -= 1
        out.append((m.group(2), i + 1, end - i))
    return out


def test_no_source_file_is_too_long():
    long = []
    for files in module_files().values():
        for f in files:
            with open(f, encoding="utf-8") as fh:
                n = sum(1 for _ in fh)
            if n > FILE_LINES_MAX:
                long.append(f"{os.path.relpath(f, ROOT)}: {n} lines")
    assert not long, f"source files over {FILE_LINES_MAX} lines (split them by concern):\n" + "\n".join(long)


def test_no_store_function_is_too_long():
    store = os.path.join(ROOT, "store")
    found = [f for f in os.listdir(store) if f.endswith((".py", ".pyx"))]
    assert len(found) >= 20, found  # the scan itself works
    long = [
        f"store/{f}:{line} {name}: {n} lines"
        for f in sorted(found)
        for name, line, n in _functions(os.path.join(store, f))
        if n > FUNCTION_LINES_MAX
    ]
    assert not long, f"store/ functions over {FUNCTION_LINES_MAX} lines:\n" + "\n".join(long)
