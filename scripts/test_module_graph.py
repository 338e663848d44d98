"""The module drawing's reading of Rust paths, on made-up source trees: a
file with an inline `mod tests` still draws its own `super::` imports (they
were once dropped, hiding a circle), and a test module's `super::` means its
file. Run: python3 -m unittest discover -s scripts -p 'test_*.py' (CI does)."""

import os
import shutil
import tempfile
import unittest

from module_graph import circles, graph


def tree(files):
    root = tempfile.mkdtemp(prefix="module-graph-")
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    return root


TESTS = "#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { helper(); }\n}\n"


class ModuleGraph(unittest.TestCase):
    def graph_of(self, files):
        root = tree(files)
        self.addCleanup(shutil.rmtree, root)
        return graph(root)

    def test_a_files_super_import_is_drawn_though_it_has_an_inline_test_module(self):
        nodes, edges = self.graph_of({
            "lib.rs": "mod room;\n",
            "room/mod.rs": "mod a;\nmod b;\npub fn shared() {}\n",
            "room/a.rs": "use super::b::Thing;\nuse super::shared;\n" + TESTS,
            "room/b.rs": "use super::a::Other;\npub struct Thing;\n" + TESTS,
        })
        self.assertIn(("room", "b"), edges[("room", "a")])
        self.assertIn(("room",), edges[("room", "a")])
        self.assertIn(("room", "a"), edges[("room", "b")])
        self.assertEqual([sorted(c) for c in circles(nodes, edges)], [[("room", "a"), ("room", "b")]])

    def test_a_test_modules_super_means_its_file_and_two_mean_the_parent(self):
        nodes, edges = self.graph_of({
            "lib.rs": "mod room;\n",
            "room/mod.rs": "mod a;\nmod b;\nmod c;\nmod d;\n",
            "room/a.rs": "pub fn helper() {}\n" + TESTS,
            "room/b.rs": "#[cfg(test)]\nmod tests {\n    use super::super::a::helper;\n}\n",
            # Nested inline modules: three supers leave the file.
            "room/c.rs": "mod inner {\n    mod deeper {\n        use super::super::super::a::helper;\n    }\n}\n",
            # A group, and self:: inside a test module (its own items).
            "room/d.rs": "use super::{a::helper, b};\nmod tests {\n    use self::x::y;\n}\n",
        })
        self.assertEqual(edges.get(("room", "a"), set()), set())
        self.assertEqual(edges[("room", "b")], {("room", "a")})
        self.assertEqual(edges[("room", "c")], {("room", "a")})
        self.assertEqual(edges[("room", "d")], {("room", "a"), ("room", "b")})


if __name__ == "__main__":
    unittest.main()
