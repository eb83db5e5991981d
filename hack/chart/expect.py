#!/usr/bin/env python3
"""Checks that the apiserver's dry run of charts/consistd rendered with hack/chart/test-values.yaml carries each value.

Usage: expect.py RENDERED.json NAMESPACE, RENDERED.json being `kubectl apply --dry-run=server -o json` output.
The expectations below mirror hack/chart/test-values.yaml; change both together.
"""
import json
import sys


def main():
    with open(sys.argv[1]) as f:
        rendered = json.load(f)
    ns = sys.argv[2]
    items = rendered["items"] if rendered.get("kind") == "List" else [rendered]
    by = {(o["kind"], o["metadata"]["name"]): o for o in items}
    problems = []

    def expect(what, got, want):
        if got != want:
            problems.append(f"{what}: {got!r}, want {want!r}")

    expect("objects", sorted(by), sorted([
        ("ClusterRole", "inj"), ("ClusterRoleBinding", "inj"), ("Deployment", "inj"),
        ("MutatingWebhookConfiguration", "inj-webhook"), ("Role", "inj"), ("RoleBinding", "inj"),
        ("Service", "inj"), ("ServiceAccount", "inj")]))
    deploy = by.get(("Deployment", "inj"), {}).get("spec", {})
    pod = deploy.get("template", {}).get("spec", {})
    container = (pod.get("containers") or [{}])[0]
    args = container.get("args", [])
    flags = dict(zip(args[2::2], args[3::2]))
    expect("replicas", deploy.get("replicas"), 3)
    expect("image", container.get("image"), "registry.example/consistd:0.2.0-rc1")
    expect("imagePullPolicy", container.get("imagePullPolicy"), "Always")
    expect("imagePullSecrets", pod.get("imagePullSecrets"), [{"name": "registry-pull"}])
    expect("resources", container.get("resources"),
           {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    expect("flags", flags, {
        "--listen": "0.0.0.0:8443", "--service": "inj", "--secret": "inj-certs",
        "--webhook-configuration": "inj-webhook", "--cert-validity": "30d", "--ca-validity": "365d",
        "--log-level": "consistd=debug", "--image": "registry.example/consistd-sidecar:0.2.0",
        "--config-map": "app-consistd", "--peer-port": "7171", "--admin-port": "7272",
        "--peer-tls-secret": "app-peer-tls", "--otel-endpoint": "http://otel-collector.monitoring:4317"})
    expect("nodeSelector", pod.get("nodeSelector"), {"kubernetes.io/os": "linux"})
    expect("tolerations", [t.get("key") for t in pod.get("tolerations", [])], ["dedicated"])
    expect("affinity", list(pod.get("affinity", {})), ["podAntiAffinity"])
    expect("runAsUser", pod.get("securityContext", {}).get("runAsUser"), 65532)
    expect("readOnlyRootFilesystem", container.get("securityContext", {}).get("readOnlyRootFilesystem"), True)
    expect("Role resourceNames", [r.get("resourceNames") for r in by.get(("Role", "inj"), {}).get("rules", [])],
           [None, ["inj-certs"]])
    expect("ClusterRole resourceNames",
           [r.get("resourceNames") for r in by.get(("ClusterRole", "inj"), {}).get("rules", [])], [["inj-webhook"]])
    expect("ClusterRoleBinding subject namespace",
           [s.get("namespace") for s in by.get(("ClusterRoleBinding", "inj"), {}).get("subjects", [])], [ns])
    hook = (by.get(("MutatingWebhookConfiguration", "inj-webhook"), {}).get("webhooks") or [{}])[0]
    expect("failurePolicy", hook.get("failurePolicy"), "Ignore")
    expect("timeoutSeconds", hook.get("timeoutSeconds"), 10)
    expect("webhook service", hook.get("clientConfig", {}).get("service", {}).get("name"), "inj")
    expect("webhook service namespace", hook.get("clientConfig", {}).get("service", {}).get("namespace"), ns)
    expect("namespaceSelector", hook.get("namespaceSelector", {}).get("matchExpressions"),
           [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]}])
    for p in problems:
        print("expect:", p, file=sys.stderr)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
