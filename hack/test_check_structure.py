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


class Tree:
    """A repository in a temporary directory: each crate of CRATES with a src/lib.rs, plus `files`.

    `files` maps a crate to {path under its source folder (crate_src): text}; the crates in `missing` get
    no folder.
    """

    def __init__(self, test, files, missing=()):
        self.dir = tempfile.TemporaryDirectory()
        test.addCleanup(self.dir.cleanup)
        self.root = self.dir.name
        for crate in check_structure.CRATES:
            if crate in missing:
                continue
            crate_files = {"lib.rs": "pub mod placeholder_for_the_crate_root;\n", **files.get(crate, {})}
            for rel, text in crate_files.items():
                self.write(os.path.join(check_structure.crate_src(crate), rel), textwrap.dedent(text))

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def run(self, *args):
        done = subprocess.run([sys.executable, SCRIPT, "--root", self.root, *args],
                              capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr

    def edges(self, crate="daemon"):
        sources = check_structure.read_sources(self.root, crate)
        modules = {s.module for s in sources if s.module}
        return check_structure.find_edges(sources, modules)


class CheckStructureTest(unittest.TestCase):
    def assert_fails_with(self, tree, *texts):
        code, out, err = tree.run()
        self.assertEqual(code, 1, f"expected failure; stdout={out!r} stderr={err!r}")
        for text in texts:
            self.assertIn(text, err)
        return err

    def assert_passes(self, tree):
        code, out, err = tree.run()
        self.assertEqual((code, err), (0, ""), f"expected success; stdout={out!r}")
        return out

    def test_a_clean_tree_passes(self):
        tree = Tree(self, {"daemon": {
            "top.rs": """\
                //! The top: uses [`crate::top`] itself, and the modules below.
                use crate::{
                    mid::{self, Thing},
                    base,
                };
                pub fn go() { base::f(); crate::mid::g(); }
            """,
            "mid.rs": "use crate::base::f;\npub struct Thing;\npub fn g() { f() }\n",
            "mid/part.rs": "use super::Thing;\nuse crate::{base, mid::g};\npub(crate) struct Part;\n",
            "base.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests { use crate::top; struct Thing; }\n",
        }, "core": {"names.rs": "pub struct Name;\n", "config.rs": "use crate::names::Name;\n"}})
        self.assertEqual(self.assert_passes(tree), "structure: 6 crates, 5 modules, 4 imports, no cycle, "
                                                   "no duplicate type names\n")

    def test_imports_that_follow_no_order_pass_when_they_form_no_cycle(self):
        tree = Tree(self, {"server": {"a.rs": "use crate::b::X;\nuse crate::c::Y;\n", "b.rs": "pub struct X;\n",
                                      "c.rs": "use crate::b::X;\npub struct Y;\n"}})
        self.assert_passes(tree)

    def test_a_two_module_cycle_fails_naming_the_crate_and_printing_the_cycle(self):
        tree = Tree(self, {"cluster": {"a.rs": "use crate::b::Y;\npub struct X;\n",
                                       "b.rs": "\nuse crate::a::X;\npub struct Y;\n"}})
        self.assert_fails_with(
            tree, "structure: cluster: import cycle a -> b -> a "
                  "(a -> b at daemon/cluster/src/a.rs:1; b -> a at daemon/cluster/src/b.rs:2)")

    def test_a_three_module_cycle_fails_and_prints_the_cycle(self):
        tree = Tree(self, {"daemon": {
            "a.rs": "pub fn f() { crate::b::g() }\n",
            "b.rs": "pub fn g() { crate::c::h() }\n",
            "c.rs": "\n\npub fn h() { crate::a::f() }\n",
        }})
        err = self.assert_fails_with(tree, "daemon: import cycle a -> b -> c -> a (", "c -> a at daemon/src/c.rs:3")
        self.assertEqual(err.count("import cycle"), 1)

    def test_cycles_in_two_crates_are_each_reported_with_their_crate(self):
        tree = Tree(self, {"core": {"a.rs": "use crate::b;\n", "b.rs": "use crate::a;\n"},
                           "messages": {"c.rs": "use crate::d;\n", "d.rs": "use crate::c;\n"}})
        err = self.assert_fails_with(tree, "structure: core: import cycle a -> b -> a (a -> b at daemon/core/src/a.rs:1",
                                     "structure: messages: import cycle c -> d -> c (c -> d at daemon/messages/src/c.rs:1")
        self.assertEqual(err.count("import cycle"), 2)

    def test_the_same_module_names_importing_each_other_from_two_crates_are_no_cycle(self):
        tree = Tree(self, {"cluster": {"a.rs": "use crate::b::X;\n", "b.rs": "pub struct X;\n"},
                           "server": {"a.rs": "pub struct Y;\n", "b.rs": "use crate::a::Y;\n"}})
        self.assertEqual(set(tree.edges("cluster")), {("a", "b")})
        self.assertEqual(set(tree.edges("server")), {("b", "a")})
        self.assertIn("2 imports, no cycle", self.assert_passes(tree))

    def test_a_crate_path_to_a_module_only_another_crate_has_creates_no_edge(self):
        tree = Tree(self, {"observe": {"metrics.rs": "use crate::store::Db;\n"},
                           "messages": {"store.rs": "pub struct Db;\n"}})
        self.assertEqual(tree.edges("observe"), {})

    def test_a_missing_crate_folder_fails_and_the_other_crates_are_still_checked(self):
        tree = Tree(self, {"daemon": {"a.rs": "use crate::b;\n", "b.rs": "use crate::a;\n"}}, missing=("observe",))
        err = self.assert_fails_with(tree, "structure: crate `observe`: daemon/observe/src is not a directory",
                                     "structure: daemon: import cycle a -> b -> a")
        self.assertIn("(5 crates, 2 modules, 2 imports)", err)

    def test_a_grouped_multi_line_use_creates_edges_to_each_first_level_name(self):
        tree = Tree(self, {"daemon": {
            "top.rs": "use crate::{\n    a,\n    b::{self, C, d::{E, F}},\n};\n",
            "a.rs": "", "b.rs": "pub struct C;\n", "b/d.rs": "pub struct E;\npub struct F;\n",
        }})
        self.assertEqual(tree.edges(), {("top", "a"): ["daemon/src/top.rs:2"], ("top", "b"): ["daemon/src/top.rs:3"]})

    def test_an_inline_path_creates_an_edge(self):
        tree = Tree(self, {"cluster": {
            "top.rs": "fn go(r: tokio::sync::watch::Receiver<crate::b::Status>) {\n    crate::a::f();\n}\n",
            "a.rs": "pub fn f() {}\n", "b.rs": "pub struct Status;\n",
        }})
        self.assertEqual(tree.edges("cluster"),
                         {("top", "a"): ["daemon/cluster/src/top.rs:2"], ("top", "b"): ["daemon/cluster/src/top.rs:1"]})

    def test_pub_use_and_pub_crate_use_create_edges(self):
        tree = Tree(self, {"daemon": {"top.rs": "pub use crate::a::X;\npub(crate) use crate::b::Y;\n",
                                      "a.rs": "pub struct X;\n", "b.rs": "pub struct Y;\n"}})
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
                tree = Tree(self, {"daemon": {"top.rs": text + "pub fn real() { crate::b::g() }\n",
                                              "a.rs": "", "b.rs": ""}})
                self.assertEqual(set(tree.edges()), {("top", "b")})

    def test_code_in_a_cfg_test_module_with_nested_braces_creates_no_edge_and_no_duplicate_type(self):
        tree = Tree(self, {"daemon": {
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
            "high.rs": "use crate::low::Target;\npub struct Api;\npub fn g() {}\n",
            "other.rs": "pub fn h() {}\n",
        }})
        self.assertEqual(set(tree.edges()), {("low", "other"), ("high", "low")})
        self.assert_passes(tree)

    def test_a_cfg_test_function_and_use_create_no_edge(self):
        tree = Tree(self, {"daemon": {
            "low.rs": "#[cfg(test)]\nuse crate::high::X;\n"
                      "#[cfg(test)]\npub(crate) fn helper() -> [u8; 2] { crate::high::f() }\n",
            "high.rs": "use crate::low;\npub struct X;\n",
        }})
        self.assertEqual(set(tree.edges()), {("high", "low")})
        self.assert_passes(tree)

    def test_a_tests_rs_file_creates_no_edge_and_no_duplicate_type(self):
        tree = Tree(self, {"daemon": {
            "low.rs": "pub struct Target;\n",
            "low/tests.rs": "use crate::high::Api;\nstruct Target;\n",
            "high.rs": "use crate::low::Target;\npub struct Api;\n",
        }})
        self.assertEqual(set(tree.edges()), {("high", "low")})
        self.assert_passes(tree)

    def test_a_file_declared_by_cfg_test_mod_creates_no_edge_and_no_duplicate_type(self):
        tree = Tree(self, {"daemon": {
            "low.rs": "pub struct Target;\n#[cfg(test)]\nmod helpers;\n",
            "low/helpers.rs": "use crate::high::Api;\nstruct Target;\n",
            "low/helpers/deep.rs": "use crate::high::Api;\n",
            "high.rs": "use crate::low::Target;\npub struct Api;\n",
        }})
        self.assertEqual(set(tree.edges()), {("high", "low")})
        self.assert_passes(tree)

    def test_two_structs_named_target_in_different_modules_fail_naming_both_places(self):
        tree = Tree(self, {"daemon": {"objects.rs": "\npub struct Target;\n",
                                      "outbox/target.rs": "pub(crate) struct Target {\n}\n"}})
        self.assert_fails_with(tree, "structure: type name `Target` is defined 2 times: "
                                     "daemon/src/objects.rs:2, daemon/src/outbox/target.rs:1")

    def test_two_types_with_one_name_in_two_crates_fail_naming_both_places(self):
        tree = Tree(self, {"cluster": {"objects.rs": "pub struct Target;\n"},
                           "messages": {"outbox.rs": "\n\npub enum Target { A }\n"}})
        self.assert_fails_with(tree, "structure: type name `Target` is defined 2 times: "
                                     "daemon/cluster/src/objects.rs:1, daemon/messages/src/outbox.rs:3")

    def test_a_type_in_a_crate_root_counts(self):
        tree = Tree(self, {"core": {"lib.rs": "pub mod a;\npub struct Error;\n"},
                           "server": {"api.rs": "pub struct Error;\n"}})
        self.assert_fails_with(tree, "type name `Error` is defined 2 times: daemon/core/src/lib.rs:2, daemon/server/src/api.rs:1")

    def test_a_struct_nested_in_a_fn_counts_as_a_type(self):
        tree = Tree(self, {"daemon": {"a.rs": "pub enum Lease { A }\n", "b.rs": "fn f() {\n    struct Lease;\n}\n"}})
        self.assert_fails_with(tree, "type name `Lease` is defined 2 times: daemon/src/a.rs:1, daemon/src/b.rs:2")

    def test_every_kind_of_type_definition_counts_but_associated_types_do_not(self):
        tree = Tree(self, {"daemon": {"a.rs": """\
            pub trait T { type Item; }
            impl Iterator for X { type Item = u8; fn next(&mut self) -> Option<u8> { type Local = u8; None } }
            pub type Alias = u8;
            union U { a: u8 }
            fn union(x: u8) {}
        """}})
        source = next(s for s in check_structure.read_sources(tree.root, "daemon") if s.module == "a")
        names = [name for name, _ in check_structure.type_definitions(source)]
        self.assertEqual(names, ["T", "Local", "Alias", "U"])

    def test_a_submodule_file_is_attributed_to_its_top_level_module(self):
        tree = Tree(self, {"messages": {"outbox.rs": "mod link;\n",
                                        "outbox/link.rs": "use super::X;\nuse crate::store::Db;\n",
                                        "store.rs": "pub struct Db;\n"}})
        self.assertEqual(tree.edges("messages"), {("outbox", "store"): ["daemon/messages/src/outbox/link.rs:2"]})
        self.assertIn("6 crates, 2 modules, 1 imports", self.assert_passes(tree))

    def test_main_rs_bin_and_lib_rs_are_no_modules(self):
        tree = Tree(self, {"daemon": {"main.rs": "use consistd::a;\nstruct Target;\n",
                                      "bin/tool.rs": "use consistd::a;\nstruct Target;\n",
                                      "lib.rs": "pub mod a;\npub use crate::a::Target;\n",
                                      "a.rs": "pub struct Target;\n"}})
        self.assertIn("6 crates, 1 modules, 0 imports", self.assert_passes(tree))

    def test_graph_prints_every_edge_with_its_crate_and_place(self):
        tree = Tree(self, {"daemon": {"a.rs": "\nuse crate::b::X;\n", "b.rs": "pub struct X;\n"},
                           "core": {"c.rs": "use crate::d::Y;\n", "d.rs": "pub struct Y;\n"}})
        code, out, _ = tree.run("--graph")
        self.assertEqual(code, 0)
        self.assertEqual(out.splitlines()[:2], ["core: c -> d (daemon/core/src/c.rs:1)", "daemon: a -> b (daemon/src/a.rs:2)"])

    def test_the_crates_are_listed_lowest_first(self):
        self.assertEqual(check_structure.CRATES, ("core", "observe", "cluster", "messages", "server", "daemon"))


if __name__ == "__main__":
    unittest.main()
