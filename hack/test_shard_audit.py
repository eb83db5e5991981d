"""Unit tests of hack/e2e/shard_audit.py: the e2e's audit of a sharded queue's grants finds two pods holding one
key at once, and nothing else."""

import pathlib
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "e2e"))

import shard_audit  # noqa: E402


class ShardAuditTest(unittest.TestCase):
    def test_two_pods_holding_one_key_at_once_are_found(self):
        a = shard_audit.passes("grant ns/k 100 term=1\ndone ns/k 300\n")
        b = shard_audit.passes("grant ns/k 250 term=2\ndone ns/k 400\n")
        self.assertEqual(len(shard_audit.overlaps({"a": a, "b": b})), 1)

    def test_passes_one_after_another_or_of_other_keys_are_not(self):
        a = shard_audit.passes("grant ns/k 100\ndone ns/k 200\ngrant ns/j 150\ndone ns/j 900\n")
        b = shard_audit.passes("grant ns/k 200\ndone ns/k 300\n")
        self.assertEqual(shard_audit.overlaps({"a": a, "b": b}), [])

    def test_a_pass_its_pod_never_ended_is_held_to_its_logs_last_line(self):
        a = shard_audit.passes("grant ns/k 100\ngrant ns/j 120\ndone ns/j 500\n")
        self.assertIn(("ns/k", 100, 500), a)
        b = shard_audit.passes("grant ns/k 400\ndone ns/k 450\n")
        self.assertEqual(len(shard_audit.overlaps({"a": a, "b": b})), 1)


if __name__ == "__main__":
    unittest.main()
