"""Tests of hack/integration.py's reading of cargo's messages and its order of the binaries."""

import importlib.util
import json
import pathlib
import unittest

spec = importlib.util.spec_from_file_location("integration", pathlib.Path(__file__).with_name("integration.py"))
integration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(integration)


def artifact(manifest: str, name: str, kind: str, executable: str | None) -> str:
    return json.dumps({
        "reason": "compiler-artifact",
        "manifest_path": manifest,
        "target": {"name": name, "kind": [kind]},
        "executable": executable,
    })


class TestBinaries(unittest.TestCase):
    def test_only_integration_test_binaries_each_named_with_its_package(self) -> None:
        repo = pathlib.Path("/r")
        messages = "\n".join([
            artifact("/r/daemon/Cargo.toml", "fencing", "test", "/r/target/debug/deps/fencing-1"),
            artifact("/r/client-sdk/rust/Cargo.toml", "reconcile", "test", "/r/target/debug/deps/reconcile-2"),
            artifact("/r/daemon/Cargo.toml", "reconcile", "test", "/r/target/debug/deps/reconcile-3"),
            artifact("/r/daemon/Cargo.toml", "consistd", "bin", "/r/target/debug/consistd"),
            artifact("/r/daemon/core/Cargo.toml", "consistd_core", "lib", None),
            json.dumps({"reason": "build-finished", "success": True}),
        ])
        self.assertEqual(integration.test_binaries(messages, repo), [
            ("daemon/fencing", ["/r/target/debug/deps/fencing-1"], pathlib.Path("/r/daemon")),
            ("client-sdk/rust/reconcile", ["/r/target/debug/deps/reconcile-2"], pathlib.Path("/r/client-sdk/rust")),
            ("daemon/reconcile", ["/r/target/debug/deps/reconcile-3"], pathlib.Path("/r/daemon")),
        ])

    def test_a_binarys_last_time_counts_first_then_the_table_then_a_default(self) -> None:
        self.assertEqual(integration.expected({"daemon/blackhole": 3.0}, "daemon/blackhole"), 3.0)
        self.assertEqual(integration.expected({}, "daemon/blackhole"), integration.KNOWN["blackhole"])
        self.assertEqual(integration.expected({}, "daemon/new_test"), integration.UNKNOWN)

    def test_a_beside_job_runs_its_command_split_as_a_shell_would_at_a_lower_priority(self) -> None:
        name, argv, cwd = integration.beside("sdks=hack/stage.sh sdks 'hack/test-sdks.sh'")
        self.assertEqual(name, "sdks")
        self.assertEqual(argv, ["nice", "-n", "10", "hack/stage.sh", "sdks", "hack/test-sdks.sh"])
        self.assertEqual(cwd, integration.REPO)
        for bad in ["sdks", "=hack/test-sdks.sh", "sdks="]:
            with self.assertRaisesRegex(ValueError, "must be NAME=COMMAND"):
                integration.beside(bad)


if __name__ == "__main__":
    unittest.main()
