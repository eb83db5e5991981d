#!/usr/bin/env python3
"""Check the daemon crates' structure: import cycles within a crate, duplicate type names.

The daemon is split into crates, lowest first: core, observe, cluster, messages,
server (each in daemon/<crate>/) and the binary's crate, daemon (the CRATES below). Cargo's crate graph already enforces their order:
a lower crate cannot depend on a higher one, and crates cannot depend on each other
in a cycle (see the `## Crates` section of docs/ARCHITECTURE.md). So the layer table
this script used to read is gone, and it checks only what Cargo cannot. It fails
(exit 1, one line per problem on stderr) when:

  * within one crate, the top-level modules (daemon/<crate>/src/<name>.rs and
    daemon/<crate>/src/<name>/; daemon/src for daemon) import each other (`crate::<module>` anywhere in code) in
    a cycle; imports are per crate, so `cluster::watch` and `server::watch` are
    two different modules;
  * two struct/enum/union/trait/type definitions anywhere in those crates, across
    crates too, share a name (two `Target`s are one too many);
  * a crate's source folder does not exist.

Comments, string and char literals, files named tests.rs, and items marked
`#[cfg(test)]` (with `#[cfg(test)] mod x;` also excluding x's file) are ignored.
main.rs (the binary) and src/bin/ are skipped; each lib.rs is its crate's root, not
a module: its types count, its imports do not. `super::` paths are never edges.

Usage (from the repository root; `make lint` runs the first form):

    python3 hack/check-structure.py            # check; exit 0 or 1
    python3 hack/check-structure.py --graph    # also print every edge `crate: a -> b (file:line)`
    python3 hack/check-structure.py --root DIR # check the crates under DIR

Tests: python3 -m unittest discover -s hack -p 'test_*.py' -v
"""

import argparse
import bisect
import os
import re
import sys

CRATES = ("core", "observe", "cluster", "messages", "server", "daemon")  # lowest first
TYPE_KEYWORDS = {"struct", "enum", "union", "trait", "type"}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---- Rust source: strip comments and literals, then test code ----

RAW_STRING = re.compile(r'[bc]?r(#*)"')


def strip_comments_and_literals(text):
    """Blank out comments, string and char literals, keeping newlines so line numbers hold."""
    out, i, n = list(text), 0, len(text)

    def blank(start, end):
        for k in range(start, min(end, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end, depth = i + 2, 1  # Rust block comments nest
            while end < n and depth:
                if text.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif text.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
        elif c == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            end += 1
        elif c == "'" and i + 1 < n and text[i + 1] == "\\":  # '\n', '\'', '\u{..}'
            end = text.find("'", i + 3) + 1 or n
        elif c == "'" and i + 2 < n and text[i + 2] == "'":  # 'x' (a lifetime 'a has no closing quote)
            end = i + 3
        elif IDENT.match(text, i) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            raw = RAW_STRING.match(text, i)
            if not raw:  # an identifier: step over it whole, so `bar"` is never taken for `r"`
                i = IDENT.match(text, i).end()
                continue
            close = text.find('"' + raw.group(1), raw.end())
            end = n if close < 0 else close + 1 + len(raw.group(1))
        else:
            i += 1
            continue
        blank(i, end)
        i = end
    return "".join(out)


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*\[")
SEMICOLON_ITEMS = {"use", "const", "static", "let", "type"}
BLOCK_ITEMS = {"fn", "mod", "impl", "trait", "struct", "enum", "union", "unsafe", "async",
               "extern", "macro_rules", "auto", "default"}
OPEN, CLOSE = "([{", ")]}"


def matching_close(text, start):
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    for k in range(start, len(text)):
        if text[k] in OPEN:
            depth += 1
        elif text[k] in CLOSE:
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


def item_kind(text, pos):
    """How the item starting at `pos` ends: 'semicolon', 'block' or 'other' (field, statement)."""
    words = re.findall(r"[A-Za-z_]\w*|\S", text[pos:pos + 200])
    if words[:1] == ["pub"]:
        words = words[1:]
        if words[:1] == ["("]:
            words = words[words.index(")") + 1:] if ")" in words else []
    first, second = (words + ["", ""])[:2]
    if first == "const" and second in ("fn", "unsafe", "async", "extern"):
        return "block"
    if first in SEMICOLON_ITEMS:
        return "semicolon"
    if first in BLOCK_ITEMS or first == "{" or second == "!":
        return "block"
    return "other"


def item_end(text, pos):
    """Index just past the item (after its attributes) that starts at `pos`."""
    while True:
        attribute = ATTRIBUTE.match(text, pos)
        if not attribute:
            break
        pos = matching_close(text, attribute.end() - 1)
    kind, depth, k = item_kind(text, pos), 0, pos
    while k < len(text):
        c = text[k]
        if c == "{" and depth == 0 and kind == "block":
            return matching_close(text, k)
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
            if depth == 0:
                return k  # the end of the enclosing block
            depth -= 1
        elif depth == 0 and (c == ";" or (c == "," and kind == "other")):
            return k + 1
        k += 1
    return k


def strip_test_code(text):
    """Blank `#[cfg(test)]` items; return the text and the names of `#[cfg(test)] mod x;` files."""
    if re.search(r"#\s*!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", text):
        return re.sub(r"[^\n]", " ", text), []
    test_mods = []
    while True:
        found = CFG_TEST.search(text)
        if not found:
            return text, test_mods
        end = item_end(text, found.end())
        declared = re.fullmatch(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text[found.end():end])
        if declared:
            test_mods.append(declared.group(1))
        text = text[:found.start()] + re.sub(r"[^\n]", " ", text[found.start():end]) + text[end:]


# ---- each crate's files and modules ----

class Source:
    def __init__(self, rel, module, code):
        self.rel, self.module, self.code = rel, module, code
        self.newlines = [m.start() for m in re.finditer("\n", code)]

    def line(self, offset):
        return bisect.bisect_left(self.newlines, offset) + 1

    def place(self, offset):
        return f"{self.rel}:{self.line(offset)}"


def rust_files(src):
    for folder, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".rs"):
                yield os.path.relpath(os.path.join(folder, name), src).replace(os.sep, "/")


def test_module_paths(rel, names):
    """The files and folders that `#[cfg(test)] mod name;` declared in `rel` stands for."""
    folder, stem = os.path.dirname(rel), os.path.basename(rel)[:-3]
    if stem not in ("lib", "mod", "main"):
        folder = f"{folder}/{stem}" if folder else stem
    for name in names:
        base = f"{folder}/{name}" if folder else name
        yield base + ".rs"
        yield base + "/"


def crate_src(crate):
    """The source folder of `crate`, relative to the repository root: daemon/src, or daemon/<crate>/src."""
    return "daemon/src" if crate == "daemon" else f"daemon/{crate}/src"


def read_sources(root, crate):
    """Every non-test Rust file of the crate's source folder (but main.rs and bin/), with its top-level module."""
    src = os.path.join(root, crate_src(crate))
    stripped, excluded = {}, set()
    for rel in rust_files(src):
        if rel == "main.rs" or rel.startswith("bin/") or os.path.basename(rel) == "tests.rs":
            continue
        with open(os.path.join(src, rel), encoding="utf-8") as f:
            code, test_mods = strip_test_code(strip_comments_and_literals(f.read()))
        stripped[rel] = code
        excluded.update(test_module_paths(rel, test_mods))
    sources = []
    for rel, code in stripped.items():
        if rel in excluded or any(rel.startswith(p) for p in excluded if p.endswith("/")):
            continue
        module = None if rel == "lib.rs" else rel.split("/")[0].removesuffix(".rs")
        sources.append(Source(f"{crate_src(crate)}/{rel}", module, code))
    return sources


# ---- edges: crate::<module> references ----

CRATE_PATH = re.compile(r"\bcrate\s*::\s*")


def group_targets(code, brace):
    """(name, offset) of each first-level name in the `{...}` group that opens at `brace`."""
    depth, expect, k = 0, False, brace
    while k < len(code):
        c = code[k]
        if c in "{(":
            depth += 1
            expect = depth == 1
        elif c in "})":
            depth -= 1
            if depth == 0:
                return
        elif c == "," and depth == 1:
            expect = True
        elif expect and not c.isspace():
            expect = False
            name = IDENT.match(code, k)
            if name:
                yield name.group(), k
                k = name.end()
                continue
        k += 1


def references(source):
    """(target name, offset) of every `crate::x` and `crate::{x, y}` in the source."""
    for found in CRATE_PATH.finditer(source.code):
        if source.code.startswith("{", found.end()):
            yield from group_targets(source.code, found.end())
        else:
            name = IDENT.match(source.code, found.end())
            if name:
                yield name.group(), found.end()


def find_edges(sources, modules):
    """{(from, to): [file:line, ...]} for every import between distinct top-level modules."""
    edges = {}
    for source in sources:
        if source.module is None:
            continue
        for target, offset in references(source):
            if target in modules and target != source.module:
                edges.setdefault((source.module, target), []).append(source.place(offset))
    return edges


# ---- duplicate type names ----

TOKEN = re.compile(r"r#[A-Za-z_]\w*|[A-Za-z_]\w*|\S")
BLOCK_OWNERS = {"impl", "trait", "fn", "mod", "struct", "enum", "union", "type"}


def type_definitions(source):
    """(name, offset) of each struct/enum/union/trait/type, but not associated types in impls and traits."""
    tokens = list(TOKEN.finditer(source.code))
    blocks, owner = [], None
    for k, token in enumerate(tokens):
        word = token.group()
        if word == "{":
            blocks.append(owner or "block")
            owner = None
        elif word in ("}", ";"):
            if word == "}" and blocks:
                blocks.pop()
            owner = None
        elif word in TYPE_KEYWORDS and k + 1 < len(tokens) and IDENT.fullmatch(tokens[k + 1].group()):
            associated = word == "type" and blocks and blocks[-1] in ("impl", "trait")
            if not associated:
                yield tokens[k + 1].group(), tokens[k + 1].start()
        if word in BLOCK_OWNERS and owner is None:
            owner = word


def check_duplicate_types(sources, problems):
    """One problem per type name defined more than once among `sources` (of every crate)."""
    places = {}
    for source in sources:
        for name, offset in type_definitions(source):
            places.setdefault(name, []).append(source.place(offset))
    for name, where in sorted(places.items()):
        if len(where) > 1:
            problems.append(f"type name `{name}` is defined {len(where)} times: {', '.join(where)}")


# ---- cycles ----

def find_cycle(start, graph, members):
    """The shortest cycle through `start` within `members`, as a list of modules, start first."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == start:
                return path
            if nxt in members and nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return None


def check_cycles(crate, modules, edges, problems):
    """One problem per strongly connected group of `crate`'s modules, showing one cycle through it."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    reaches = {m: reachable(m, graph) for m in modules}
    done = set()
    for start in sorted(modules):
        members = {m for m in reaches[start] if start in reaches[m]}  # start's strongly connected part
        if start in done or start not in members:
            continue
        done |= members
        cycle = find_cycle(start, graph, members) + [start]
        hops = [f"{a} -> {b} at {edges[(a, b)][0]}" for a, b in zip(cycle, cycle[1:])]
        problems.append(f"{crate}: import cycle {' -> '.join(cycle)} ({'; '.join(hops)})")


def reachable(start, graph):
    """Every module reachable from `start` in one or more steps."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# ---- main ----

def check_crate(root, crate, graph_out, problems):
    """Read `crate` and check its modules for cycles; return its sources, modules and edges."""
    sources = read_sources(root, crate)
    modules = {source.module for source in sources if source.module}
    edges = find_edges(sources, modules)
    if graph_out:
        for (a, b), places in sorted(edges.items()):
            print(f"{crate}: {a} -> {b} ({places[0]})", file=graph_out)
    check_cycles(crate, modules, edges, problems)
    return sources, modules, edges


def check(root, graph_out=None):
    """Run every check on `root`; return the list of problems (empty when all is well) and a summary."""
    problems, sources, crates, modules, imports = [], [], 0, 0, 0
    for crate in CRATES:
        if not os.path.isdir(os.path.join(root, crate_src(crate))):
            problems.append(f"crate `{crate}`: {crate_src(crate)} is not a directory under {root}")
            continue
        crate_sources, crate_modules, edges = check_crate(root, crate, graph_out, problems)
        sources += crate_sources
        crates, modules, imports = crates + 1, modules + len(crate_modules), imports + len(edges)
    check_duplicate_types(sources, problems)
    return problems, f"{crates} crates, {modules} modules, {imports} imports"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help=f"repository root holding the crates' folders ({', '.join(CRATES)})")
    parser.add_argument("--graph", action="store_true", help="print the module imports, one edge a line")
    args = parser.parse_args(argv)
    problems, summary = check(args.root, sys.stdout if args.graph else None)
    if not problems:
        print(f"structure: {summary}, no cycle, no duplicate type names")
        return 0
    for problem in problems:
        print(f"structure: {problem}", file=sys.stderr)
    print(f"structure: {len(problems)} problem(s) ({summary})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `--graph | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
