"""The Greeting operator of examples/README.md written on Kopf, as its docs teach it: handlers for a Greeting's
creation, its spec's changes and the operator's restart, which create or patch the ConfigMap it owns
(kopf.adopt) with the official Kubernetes client, post the Published event (kopf.event) and set the Ready
condition through Kopf's status patch; a deletion handler, for which Kopf keeps the finalizer; and a watch of
the operator's ConfigMaps that publishes a Greeting's message again when someone else changed or deleted its
ConfigMap (an index of the Greetings finds it).

    kopf run --standalone --namespace NS hack/bench/operator/kopf/greeting_operator.py

It prints the consistd examples' `reconciling`, `published`, `finalizing` and `finalized` lines on stdout
(Kopf logs to stderr), so daemon/benches/operator.rs counts its passes as it counts theirs. It has no leader
election (`--standalone`: Kopf's peering only pauses other instances) and sends no notification (a consistd
feature).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

GREETINGS = ("example.consistd.io", "v1", "greetings")
FINALIZER = "example.consistd.io/cleanup"
MANAGER = "greeting-operator"
MANAGED_BY = "app.kubernetes.io/managed-by"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER


@kopf.index(*GREETINGS)
def greetings(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], kopf.Body]:
    """Every Greeting by namespace and name: its ConfigMap has the same."""
    return {(namespace, name): body}


@kopf.on.resume(*GREETINGS)
@kopf.on.create(*GREETINGS)
@kopf.on.update(*GREETINGS, field="spec")
def reconcile(
    namespace: str, name: str, body: kopf.Body, retry: int, status: kopf.Status, patch: kopf.Patch, **_: Any
) -> None:
    """Publishes the message, then sets Ready (reason Published, observedGeneration the Greeting's generation)
    unless it says so already."""
    # The consistd examples' line. Kopf counts retries but has no leadership term or consistency: term=0 and
    # UNSPECIFIED are fixed placeholders.
    say(f"reconciling {namespace}/{name} attempt={retry + 1} term=0 UNSPECIFIED")
    note = publish(body)
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Published",
        "message": note,
        "observedGeneration": body.meta["generation"],
    }
    conditions = status.get("conditions", [])
    current = next((c for c in conditions if c["type"] == "Ready"), None)
    if current is not None and all(current.get(k) == v for k, v in ready.items()):
        return
    # The transition time moves only when the status does.
    if current is not None and current["status"] == "True":
        ready["lastTransitionTime"] = current["lastTransitionTime"]
    else:
        ready["lastTransitionTime"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch.status["conditions"] = [c for c in conditions if c["type"] != "Ready"] + [ready]


@kopf.on.delete(*GREETINGS)
def finalize(namespace: str, name: str, **_: Any) -> None:
    """Deletes the Greeting's ConfigMap (already gone is fine); Kopf then removes the finalizer."""
    # Kopf has no leadership term: term=0 is a fixed placeholder.
    say(f"finalizing {namespace}/{name} term=0")
    try:
        kubernetes.client.CoreV1Api().delete_namespaced_config_map(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise kopf.TemporaryError(f"delete ConfigMap {namespace}/{name}: {e.reason}", delay=5) from e
    say(f"finalized {namespace}/{name}")


@kopf.on.event("", "v1", "configmaps", labels={MANAGED_BY: MANAGER})
def configmap_changed(
    type: str | None, namespace: str, name: str, body: kopf.Body, greetings: kopf.Index, **_: Any
) -> None:
    """Publishes a Greeting's message again when its ConfigMap was deleted or no longer says it."""
    for greeting in greetings.get((namespace, name), []):
        deleting = greeting.meta.get("deletionTimestamp") is not None
        stale = type == "DELETED" or body.get("data", {}).get("message") != greeting.spec["message"]
        if stale and not deleting:
            say(f"reconciling {namespace}/{name} attempt=1 term=0 UNSPECIFIED")
            publish(greeting)


def say(line: str) -> None:
    """Prints one line whole, at once: Kopf runs sync handlers in threads, and print() writes a text and its
    newline apart, so two handlers' lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def publish(greeting: Mapping[str, Any]) -> str:
    """Creates or patches the Greeting's ConfigMap unless it already holds the message and names the Greeting
    as its controller, and posts the Published event when it wrote; returns the event's message."""
    namespace, name = greeting["metadata"]["namespace"], greeting["metadata"]["name"]
    message = greeting["spec"]["message"]
    note = f"ConfigMap {name} holds the message"
    api = kubernetes.client.CoreV1Api()
    try:
        current = api.read_namespaced_config_map(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise kopf.TemporaryError(f"read ConfigMap {namespace}/{name}: {e.reason}", delay=5) from e
        current = None
    if current is not None and (current.data or {}).get("message") == message and any(
        ref.controller and ref.uid == greeting["metadata"]["uid"] for ref in current.metadata.owner_references or []
    ):
        return note
    configmap = {"metadata": {"name": name, "labels": {MANAGED_BY: MANAGER}}, "data": {"message": message}}
    kopf.adopt(configmap, owner=greeting)
    try:
        if current is None:
            written = api.create_namespaced_config_map(namespace, configmap)
        else:
            written = api.patch_namespaced_config_map(name, namespace, configmap)
    except ApiException as e:
        raise kopf.TemporaryError(f"write ConfigMap {namespace}/{name}: {e.reason}", delay=5) from e
    say(
        f"published {namespace}/{name} generation={greeting['metadata']['generation']} configmap={name} "
        f"resourceVersion={written.metadata.resource_version}"
    )
    kopf.event(greeting, type="Normal", reason="Published", message=note)
    return note
