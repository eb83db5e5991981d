"""Tests for hack/check-structure.py, on small synthetic trees.

Run from the repository root: python3 -m unittest discover -s hack -p 'test_*.py' -v
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-structure.py")
spec = importlib.util.spec_from_file_location("check_structure", SCRIPT)
check_structure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_structure)


def layer_doc(layers):
    """docs/ARCHITECTURE.md text with a `## Layers` table; layers: [("2 top", ["a", "b"]), ...]."""
    rows = "\n".join(f"| {label} | {', '.join(f'`{m}`' for m in mods)} | things |" for label, mods in layers)
    return ("# Architecture\n\nIntro.\n\n## Layers\n\nHigher layers may use lower ones.\n\n"
            "| layer | modules | what lives there |\n| --- | --- | --- |\n" + rows + "\n\n## Lifecycle\n\nText.\n")


class Tree:
    """A repository in a temporary directory: daemon/src files and docs/ARCHITECTURE.md."""

    def __init__(self, test, files, layers=None, doc=None):
        self.dir = tempfile.TemporaryDirectory()
        test.addCleanup(self.dir.cleanup)
        self.root = self.dir.name
        files = {"lib.rs": "pub mod placeholder_for_the_crate_root;\n", **files}
        for rel, text in files.items():
            self.write(os.path.join("daemon", "src", rel), textwrap.dedent(text))
        if doc is None and layers is not None:
            doc = layer_doc(layers)
        if doc is not None:
            self.write(os.path.join("docs", "ARCHITECTURE.md"), doc)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def run(self, *args):
        done = subprocess.run([sys.executable, SCRIPT, "--root", self.root, *args],
                              capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr

    def edges(self):
        sources = check_structure.read_sources(self.root)
        modules = {s.module for s in sources if s.module}
        return check_structure.find_edges(sources, modules)


class CheckStructureTest(unittest.TestCase):
    def assert_fails_with(self, tree, *texts):
        code, out, err = tree.run()
        self.assertEqual(code, 1, f"expected failure; stdout={out!r} stderr={err!r}")
        for text in texts:
            self.assertIn(text, err)
        return err

    def test_a_clean_tree_passes(self):
        tree = Tree(self, {
            "top.rs": """\
                //! The top: uses [`crate::top`] itself, and the layers below.
                use crate::{
                    mid::{self, Thing},
                    base,
                };
                pub fn go() { base::f(); crate::mid::g(); }
            """,
            "mid.rs": "use crate::base::f;\npub struct Thing;\npub fn g() { f() }\n",
            "mid/part.rs": "use super::Thing;\nuse crate::{base, mid::g};\npub(crate) struct Part;\n",
            "base.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests { use crate::top; struct Thing; }\n",
        }, layers=[("2 top", ["top"]), ("1 mid", ["mid"]), ("0 base", ["base"])])
        code, out, err = tree.run()
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out, "structure: 3 modules in 3 layers, 3 imports, no cycle, "
                              "no import against the layer order, no duplicate type names\n")

    def test_an_import_of_a_higher_layer_fails_naming_both_modules_the_layers_and_the_place(self):
        tree = Tree(self, {
            "high.rs": "pub struct Api;\n",
            "low.rs": "// The store.\n\nuse crate::high::Api;\n",
        }, layers=[("4 serving", ["high"]), ("1 state", ["low"])])
        self.assert_fails_with(
            tree, "structure: daemon/src/low.rs:3: `low` (layer 1 state) imports `high` (layer 4 serving), a higher layer")

    def test_an_import_of_the_same_or_a_lower_layer_passes(self):
        tree = Tree(self, {"a.rs": "use crate::b::X;\nuse crate::c::Y;\n", "b.rs": "pub struct X;\n",
                           "c.rs": "pub struct Y;\n"},
                    layers=[("1 one", ["a", "b"]), ("0 zero", ["c"])])
        self.assertEqual(tree.run()[0], 0)

    def test_a_two_module_cycle_fails_and_prints_the_cycle(self):
        tree = Tree(self, {"a.rs": "use crate::b::Y;\npub struct X;\n", "b.rs": "\nuse crate::a::X;\npub struct Y;\n"},
                    layers=[("0 all", ["a", "b"])])
        self.assert_fails_with(
            tree, "structure: import cycle a -> b -> a (a -> b at daemon/src/a.rs:1; b -> a at daemon/src/b.rs:2)")

    def test_a_three_module_cycle_fails_and_prints_the_cycle(self):
        tree = Tree(self, {
            "a.rs": "pub fn f() { crate::b::g() }\n",
            "b.rs": "pub fn g() { crate::c::h() }\n",
            "c.rs": "\n\npub fn h() { crate::a::f() }\n",
        }, layers=[("0 all", ["a", "b", "c"])])
        err = self.assert_fails_with(tree, "import cycle a -> b -> c -> a (", "c -> a at daemon/src/c.rs:3")
        self.assertEqual(err.count("import cycle"), 1)

    def test_a_grouped_multi_line_use_creates_edges_to_each_first_level_name(self):
        tree = Tree(self, {
            "top.rs": "use crate::{\n    a,\n    b::{self, C, d::{E, F}},\n};\n",
            "a.rs": "", "b.rs": "pub struct C;\n", "b/d.rs": "pub struct E;\npub struct F;\n",
        })
        self.assertEqual(tree.edges(), {("top", "a"): ["daemon/src/top.rs:2"], ("top", "b"): ["daemon/src/top.rs:3"]})

    def test_an_inline_path_creates_an_edge(self):
        tree = Tree(self, {
            "top.rs": "fn go(r: tokio::sync::watch::Receiver<crate::b::Status>) {\n    crate::a::f();\n}\n",
            "a.rs": "pub fn f() {}\n", "b.rs": "pub struct Status;\n",
        })
        self.assertEqual(tree.edges(), {("top", "a"): ["daemon/src/top.rs:2"], ("top", "b"): ["daemon/src/top.rs:1"]})

    def test_pub_use_and_pub_crate_use_create_edges(self):
        tree = Tree(self, {"top.rs": "pub use crate::a::X;\npub(crate) use crate::b::Y;\n",
                           "a.rs": "pub struct X;\n", "b.rs": "pub struct Y;\n"})
        self.assertEqual(set(tree.edges()), {("top", "a"), ("top", "b")})

    def test_crate_paths_in_comments_and_string_literals_create_no_edge(self):
        forms = {
            "a line comment": "fn f() {} // see crate::a::f\n",
            "a doc comment": "/// Like [`crate::a::f`].\nfn f() {}\n",
            "an inner doc comment": "//! Beside [`crate::a`].\n",
            "a block comment": "/* crate::a::f\n   /* nested */ crate::a::g */\nfn f() {}\n",
            "a string literal": 'fn f() -> &\'static str { "crate::a::f \\" crate::a::g" }\n',
            "a raw string literal": 'fn f() -> &\'static str { r#"say "crate::a::f""# }\n',
            "a char literal before a path in a string": "fn f() { let q = '\"'; let s = \"crate::a\"; }\n",
        }
        for form, text in forms.items():
            with self.subTest(form):
                tree = Tree(self, {"top.rs": text + "pub fn real() { crate::b::g() }\n", "a.rs": "", "b.rs": ""})
                self.assertEqual(set(tree.edges()), {("top", "b")})

    def test_code_in_a_cfg_test_module_with_nested_braces_creates_no_edge_and_no_duplicate_type(self):
        tree = Tree(self, {
            "low.rs": """\
                pub struct Target;
                #[cfg(test)]
                #[allow(dead_code)]
                mod tests {
                    use crate::high::Api;
                    struct Target { inner: Vec<u8> }
                    fn f() { if true { let _ = "}"; } crate::high::g(); }
                }
                pub fn after() { crate::other::h() }
            """,
            "high.rs": "pub struct Api;\npub fn g() {}\n",
            "other.rs": "pub fn h() {}\n",
        }, layers=[("1 high", ["high"]), ("0 low", ["low", "other"])])
        self.assertEqual(set(tree.edges()), {("low", "other")})
        self.assertEqual(tree.run()[0], 0)

    def test_a_cfg_test_function_and_use_create_no_edge(self):
        tree = Tree(self, {
            "low.rs": "#[cfg(test)]\nuse crate::high::X;\n#[cfg(test)]\npub(crate) fn helper() -> [u8; 2] { crate::high::f() }\n",
            "high.rs": "pub struct X;\n",
        }, layers=[("1 high", ["high"]), ("0 low", ["low"])])
        self.assertEqual(tree.edges(), {})
        self.assertEqual(tree.run()[0], 0)

    def test_a_tests_rs_file_creates_no_edge_and_no_duplicate_type(self):
        tree = Tree(self, {
            "low.rs": "pub struct Target;\n",
            "low/tests.rs": "use crate::high::Api;\nstruct Target;\n",
            "high.rs": "pub struct Api;\n",
        }, layers=[("1 high", ["high"]), ("0 low", ["low"])])
        self.assertEqual(tree.edges(), {})
        self.assertEqual(tree.run()[0], 0)

    def test_a_file_declared_by_cfg_test_mod_creates_no_edge_and_no_duplicate_type(self):
        tree = Tree(self, {
            "low.rs": "pub struct Target;\n#[cfg(test)]\nmod helpers;\n",
            "low/helpers.rs": "use crate::high::Api;\nstruct Target;\n",
            "low/helpers/deep.rs": "use crate::high::Api;\n",
            "high.rs": "pub struct Api;\n",
        }, layers=[("1 high", ["high"]), ("0 low", ["low"])])
        self.assertEqual(tree.edges(), {})
        self.assertEqual(tree.run()[0], 0)

    def test_a_module_missing_from_the_layer_table_fails(self):
        tree = Tree(self, {"a.rs": "", "stray.rs": ""}, layers=[("0 all", ["a"])])
        self.assert_fails_with(tree, "structure: module `stray` is in no layer of docs/ARCHITECTURE.md")

    def test_a_listed_module_that_does_not_exist_fails(self):
        tree = Tree(self, {"a.rs": ""}, layers=[("1 top", ["a"]), ("0 base", ["ghost"])])
        self.assert_fails_with(tree, "structure: docs/ARCHITECTURE.md lists `ghost`, which daemon/src does not have")

    def test_a_module_listed_twice_fails(self):
        tree = Tree(self, {"a.rs": ""}, layers=[("1 top", ["a"]), ("0 base", ["a"])])
        self.assert_fails_with(tree, "docs/ARCHITECTURE.md lists `a` twice (layer 1 top and layer 0 base)")

    def test_a_doc_without_a_layers_section_fails(self):
        tree = Tree(self, {"a.rs": ""}, doc="# Architecture\n\n## Layering\n\n| layer | modules |\n| - | - |\n| 0 x | `a` |\n")
        self.assert_fails_with(tree, "docs/ARCHITECTURE.md has no `## Layers` section")

    def test_two_structs_named_target_in_different_modules_fail_naming_both_places(self):
        tree = Tree(self, {"objects.rs": "\npub struct Target;\n", "outbox/target.rs": "pub(crate) struct Target {\n}\n"},
                    layers=[("0 all", ["objects", "outbox"])])
        self.assert_fails_with(tree, "structure: type name `Target` is defined 2 times: "
                                     "daemon/src/objects.rs:2, daemon/src/outbox/target.rs:1")

    def test_a_struct_nested_in_a_fn_counts_as_a_type(self):
        tree = Tree(self, {"a.rs": "pub enum Lease { A }\n", "b.rs": "fn f() {\n    struct Lease;\n}\n"},
                    layers=[("0 all", ["a", "b"])])
        self.assert_fails_with(tree, "type name `Lease` is defined 2 times: daemon/src/a.rs:1, daemon/src/b.rs:2")

    def test_every_kind_of_type_definition_counts_but_associated_types_do_not(self):
        tree = Tree(self, {"a.rs": """\
            pub trait T { type Item; }
            impl Iterator for X { type Item = u8; fn next(&mut self) -> Option<u8> { type Local = u8; None } }
            pub type Alias = u8;
            union U { a: u8 }
            fn union(x: u8) {}
        """})
        source = next(s for s in check_structure.read_sources(tree.root) if s.module == "a")
        names = [name for name, _ in check_structure.type_definitions(source)]
        self.assertEqual(names, ["T", "Local", "Alias", "U"])

    def test_a_submodule_file_is_attributed_to_its_top_level_module(self):
        tree = Tree(self, {"outbox.rs": "mod link;\n", "outbox/link.rs": "use super::X;\nuse crate::store::Db;\n",
                           "store.rs": "pub struct Db;\n"},
                    layers=[("1 parts", ["outbox"]), ("0 base", ["store"])])
        self.assertEqual(tree.edges(), {("outbox", "store"): ["daemon/src/outbox/link.rs:2"]})
        self.assertIn("2 modules in 2 layers, 1 imports", tree.run()[1])

    def test_main_rs_and_lib_rs_are_no_modules(self):
        tree = Tree(self, {"main.rs": "use consistd::a;\nstruct Target;\n",
                           "lib.rs": "pub mod a;\npub use crate::a::Target;\n", "a.rs": "pub struct Target;\n"},
                    layers=[("0 all", ["a"])])
        code, out, err = tree.run()
        self.assertEqual((code, err), (0, ""))
        self.assertIn("1 modules in 1 layers, 0 imports", out)

    def test_graph_prints_every_edge_with_its_place(self):
        tree = Tree(self, {"a.rs": "\nuse crate::b::X;\n", "b.rs": "pub struct X;\n"}, layers=[("0 all", ["a", "b"])])
        code, out, _ = tree.run("--graph")
        self.assertEqual(code, 0)
        self.assertEqual(out.splitlines()[0], "a -> b (daemon/src/a.rs:2)")


if __name__ == "__main__":
    unittest.main()
