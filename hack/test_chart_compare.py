"""Tests for hack/chart/compare.py (the chart against manifests/injector), on small synthetic objects.

Run from the repository root: python3 -m unittest discover -s hack -p 'test_*.py' -v
"""

import copy
import importlib.util
import os
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chart", "compare.py")
spec = importlib.util.spec_from_file_location("chart_compare", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

DEFAULTS = {"--secret": "s-tls", "--image": "img:1"}


def deployment(args, labels=None, pull=None):
    container = {"name": "injector", "image": "img:1", "args": args}
    if pull:
        container["imagePullPolicy"] = pull
    return {"kind": "Deployment", "metadata": {"name": "d", "labels": labels or {"a": "1"}},
            "spec": {"template": {"metadata": {"labels": {"n": "d"}}, "spec": {"containers": [container]}}}}


def problems(kustomize, chart):
    found = []
    compare.compare(("Deployment", "d"), copy.deepcopy(kustomize), copy.deepcopy(chart), DEFAULTS, found)
    return found


class CompareTest(unittest.TestCase):
    def test_extra_flags_at_the_binary_defaults_labels_and_pull_policy_are_equivalent(self):
        kustomize = deployment(["inject", "webhook", "--service", "x"])
        chart = deployment(["inject", "webhook", "--service", "x", "--secret", "s-tls", "--image", "img:1"],
                           labels={"a": "1", "helm": "yes"}, pull="IfNotPresent")
        self.assertEqual(problems(kustomize, chart), [])

    def test_an_extra_flag_off_its_default_is_named(self):
        found = problems(deployment(["inject", "webhook"]), deployment(["inject", "webhook", "--secret", "other"]))
        self.assertEqual(len(found), 1)
        self.assertIn("--secret other", found[0])

    def test_a_flag_the_chart_leaves_out_a_missing_label_and_a_field_are_named(self):
        kustomize = deployment(["inject", "webhook", "--service", "x"], labels={"a": "1"})
        chart = deployment(["inject", "webhook"], labels={"a": "2"})
        chart["spec"]["replicas"] = 3
        found = "\n".join(problems(kustomize, chart))
        self.assertIn("--service set by manifests/injector but not by the chart", found)
        self.assertIn("label a=1", found)
        self.assertIn(".spec.replicas: null in manifests/injector, 3 in the chart", found)

    def test_defaults_are_read_from_clap_help(self):
        help_text = ("Options:\n      --secret <SECRET>\n          The Secret [default: s-tls]\n"
                     "      --san <EXTRA_NAMES>\n          Extra names\n"
                     "      --log-level <LOG_LEVEL>\n          Log filter [env: X=] [default: info]\n"
                     "  -h, --help\n          Print help\n")
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(help_text)
            f.flush()
            self.assertEqual(compare.defaults(f.name), {"--secret": "s-tls", "--log-level": "info"})


if __name__ == "__main__":
    unittest.main()
