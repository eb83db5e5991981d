"""Objects as JSON through the sidecar, writes fenced by a leader's term, and no-op writes answered unchanged."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

import consistd
from consistd import Consistency, EventType, Mode
from support import configmap, next_matching, unique


async def test_create_get_list_update_patch_delete(client: consistd.Client, namespace: str) -> None:
    objects = client.objects
    created = await objects.create("configmaps", configmap("cfg", {"a": "1"}, {"app": "sdk"}), namespace=namespace)
    assert (created.namespace, created.name) == (namespace, "cfg") and created.uid and created.resource_version

    got = await objects.get("configmaps", "cfg", namespace=namespace)
    assert got.json["data"] == {"a": "1"} and got.uid == created.uid

    await objects.create("configmaps", configmap("other", {}), namespace=namespace)
    listed = await objects.list("configmaps", namespace=namespace, label_selector="app=sdk")
    assert [o.name for o in listed.objects] == ["cfg"] and listed.resource_version

    body = got.json
    body["data"]["b"] = "2"
    updated = await objects.update("configmaps", "cfg", body, namespace=namespace)
    assert updated.json["data"] == {"a": "1", "b": "2"}
    with pytest.raises(consistd.ConsistdError) as stale:
        await objects.update("configmaps", "cfg", body, namespace=namespace)  # the old resourceVersion
    assert stale.value.code == grpc.StatusCode.ABORTED

    patched = await objects.patch("configmaps", "cfg", {"data": {"a": None}}, namespace=namespace)
    assert patched.json["data"] == {"b": "2"}

    await objects.delete("configmaps", "cfg", namespace=namespace, precondition_uid=created.uid)
    with pytest.raises(consistd.ConsistdError) as gone:
        await objects.get("configmaps", "cfg", namespace=namespace)
    assert gone.value.code == grpc.StatusCode.NOT_FOUND


async def test_a_guarded_write_succeeds_only_in_the_leaders_term(client: consistd.Client, namespace: str) -> None:
    await client.objects.create("configmaps", configmap("fenced", {}), namespace=namespace)
    async with client.campaign(unique("sdk-py-guard")) as campaign:
        leading = await next_matching(campaign, lambda s: s.is_leader)
        patch = {"data": {"by": "leader"}}
        stored = await client.objects.patch("configmaps", "fenced", patch, namespace=namespace, guard=leading.guard())
        assert stored.json["data"] == {"by": "leader"}

        stale = consistd.Guard(election=leading.election, namespace=leading.namespace, term=leading.term + 1)
        with pytest.raises(consistd.ConsistdError) as refused:
            await client.objects.patch("configmaps", "fenced", patch, namespace=namespace, guard=stale)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_list_answer_larger_than_4_mib_comes_back_whole(client: consistd.Client, namespace: str) -> None:
    # gRPC clients refuse answers over 4 MiB by default; the SDK's channel takes any size the sidecar sends.
    value = "x" * (900 * 1024)
    names = [f"big-{i}" for i in range(6)]
    try:
        for name in names:
            await client.objects.create("configmaps", configmap(name, {"v": value}), namespace=namespace)
        listed = await client.objects.list("configmaps", namespace=namespace)
        assert sorted(o.name for o in listed.objects) == names
        assert all(o.json["data"] == {"v": value} for o in listed.objects)
        assert sum(len(o.raw) for o in listed.objects) > 4 * 1024 * 1024
    finally:
        # No namespace controller runs in the test control plane: delete the ConfigMaps themselves.
        for name in names:
            try:
                await client.objects.delete("configmaps", name, namespace=namespace)
            except consistd.ConsistdError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise


async def test_an_update_or_patch_that_would_change_nothing_comes_back_unchanged_unless_sent_anyway(
    client: consistd.Client, namespace: str
) -> None:
    """With a synced watch of the namespace open (the sidecar answers a no-op write from a watch's cache only), a
    merge patch and an update that change nothing come back ``unchanged``, the cached object; with
    ``send_unchanged`` the apiserver answers them; a patch that changes something is never ``unchanged``. Each
    answer is recorded as an own write, and the change's state still reaches the watch as OWN_WRITE."""
    objects = client.objects
    created = await objects.create("configmaps", configmap("cfg", {"a": "1"}), namespace=namespace)
    assert not created.unchanged
    async with client.watch("configmaps", namespace=namespace, mode=Mode.CONSISTENT) as watch:
        await next_matching(watch, lambda e: e.type == EventType.SYNCED)

        patched = await objects.patch("configmaps", "cfg", {"data": {"a": "1"}}, namespace=namespace)
        assert patched.unchanged, "a merge patch that changes nothing is answered from the cache"
        assert (patched.resource_version, patched.json["data"]) == (created.resource_version, {"a": "1"})
        updated = await objects.update("configmaps", "cfg", created.json, namespace=namespace)
        assert updated.unchanged, "the object as created, written back, changes nothing"
        assert updated.resource_version == created.resource_version
        assert dataclasses.replace(updated, unchanged=False) == updated, "unchanged is not part of equality"
        # Recorded at the cached version: it predates no write of this client's.
        assert not client.predates_own_write(updated)

        sent = await objects.patch("configmaps", "cfg", {"data": {"a": "1"}}, namespace=namespace, send_unchanged=True)
        assert not sent.unchanged, "send_unchanged: the apiserver answered the patch"
        sent = await objects.update("configmaps", "cfg", created.json, namespace=namespace, send_unchanged=True)
        assert not sent.unchanged, "send_unchanged: the apiserver answered the update"

        changed = await objects.patch("configmaps", "cfg", {"data": {"a": "2"}}, namespace=namespace)
        assert not changed.unchanged
        assert int(changed.resource_version) > int(created.resource_version)
        own = await next_matching(
            watch, lambda e: e.object is not None and e.object.resource_version == changed.resource_version
        )
        assert own.consistency == Consistency.OWN_WRITE and own.object is not None
        assert not own.object.unchanged and own.object.json["data"] == {"a": "2"}
    assert not (await objects.get("configmaps", "cfg", namespace=namespace)).unchanged
