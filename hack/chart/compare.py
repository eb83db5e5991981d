#!/usr/bin/env python3
"""Checks that charts/consistd with default values renders what manifests/injector holds (so the two cannot drift).

Usage: compare.py KUSTOMIZE.json CHART.json HELP.txt. The JSON files are `kubectl create --dry-run=client -o json`
of each rendering (a List, or one object), HELP.txt is `consistd inject webhook --help`. Both must hold the same
objects (kind and name; manifests/injector's Namespace aside: the chart installs into the release namespace)
with equal contents, except: the chart may add labels; the chart may pass flags manifests/injector leaves out
if each has the value the binary defaults to (read from HELP.txt); `imagePullPolicy: IfNotPresent`, which the
apiserver defaults to for a tagged image anyway. Prints what differs and exits 1.
"""
import json
import re
import sys


def objects(path):
    with open(path) as f:
        text = f.read()
    decoder, items, pos = json.JSONDecoder(), [], 0
    while pos < len(text):  # a List, or objects one after another
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        value, pos = decoder.raw_decode(text, pos)
        items.extend(value["items"] if value.get("kind") == "List" else [value])
    return {(o["kind"], o["metadata"]["name"]): o for o in items}


def defaults(path):
    """Flag -> default value, from clap's help ("--secret <SECRET>" ... "[default: x]")."""
    with open(path) as f:
        text = f.read()
    found = {}
    for flag, body in re.findall(r"^\s+(?:-\w, )?(--[\w-]+)(.*?)(?=^\s+(?:-\w, )?--|\Z)", text, re.M | re.S):
        m = re.search(r"\[default: ([^\]]*)\]", body)
        if m:
            found[flag] = m.group(1)
    return found


def flags(args):
    """inject webhook --a x --b y -> (["inject", "webhook"], {"--a": "x", "--b": "y"})."""
    words, named, i = [], {}, 0
    while i < len(args):
        if args[i].startswith("--"):
            named[args[i]] = args[i + 1]
            i += 2
        else:
            words.append(args[i])
            i += 1
    return words, named


def strip_labels(where, kustomize, chart, problems):
    """Removes metadata.labels from both after checking the chart has every one of manifests/injector's."""
    k, c = kustomize.get("labels", {}), chart.get("labels", {})
    for key, value in k.items():
        if c.get(key) != value:
            problems.append(f"{where}: label {key}={value} missing from the chart (it has {c.get(key)!r})")
    kustomize.pop("labels", None)
    chart.pop("labels", None)


def compare(key, kustomize, chart, binary_defaults, problems):
    where = "%s/%s" % key
    for obj in (kustomize, chart):
        obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels")}
    strip_labels(where, kustomize["metadata"], chart["metadata"], problems)
    if key[0] == "Deployment":
        kt, ct = kustomize["spec"]["template"], chart["spec"]["template"]
        strip_labels(where + " pod template", kt["metadata"], ct["metadata"], problems)
        for kc, cc in zip(kt["spec"]["containers"], ct["spec"]["containers"]):
            (kw, kf), (cw, cf) = flags(kc.pop("args", [])), flags(cc.pop("args", []))
            if kw != cw:
                problems.append(f"{where}: arguments {kw} in manifests/injector, {cw} in the chart")
            for flag, value in cf.items():
                want = kf.get(flag, binary_defaults.get(flag))
                if value != want:
                    problems.append(f"{where}: {flag} {value} in the chart, {want} in manifests/injector or by default")
            for flag in kf.keys() - cf.keys():
                problems.append(f"{where}: {flag} set by manifests/injector but not by the chart")
            if cc.get("imagePullPolicy") == "IfNotPresent" and ":" in cc.get("image", "") and "imagePullPolicy" not in kc:
                cc.pop("imagePullPolicy")
    for path, k, c in differences(kustomize, chart, ""):
        problems.append(f"{where} {path}: {json.dumps(k)} in manifests/injector, {json.dumps(c)} in the chart")


def differences(k, c, path):
    """(path, manifests/injector's value, the chart's) for each place the two differ; None where one is absent."""
    if isinstance(k, dict) and isinstance(c, dict):
        return [d for key in sorted(k.keys() | c.keys()) for d in differences(k.get(key), c.get(key), f"{path}.{key}")]
    if isinstance(k, list) and isinstance(c, list) and len(k) == len(c):
        return [d for i, (a, b) in enumerate(zip(k, c)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if k == c else [(path, k, c)]


def main():
    kustomize, chart = objects(sys.argv[1]), objects(sys.argv[2])
    binary_defaults = defaults(sys.argv[3])
    if "--secret" not in binary_defaults:
        sys.exit(f"compare: no [default: ...] for --secret in {sys.argv[3]}; is it `consistd inject webhook --help`?")
    kustomize = {k: v for k, v in kustomize.items() if k[0] != "Namespace"}
    problems = []
    for key in sorted(kustomize.keys() ^ chart.keys()):
        problems.append("%s/%s only in %s" % (*key, "manifests/injector" if key in kustomize else "the chart"))
    for key in sorted(kustomize.keys() & chart.keys()):
        compare(key, kustomize[key], chart[key], binary_defaults, problems)
    for p in problems:
        print("compare:", p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"compare: the chart's {len(chart)} objects match manifests/injector's", file=sys.stderr)


if __name__ == "__main__":
    main()
