"""Campaigns: leading with a term, following, handing over, UNKNOWN at once when the sidecar is lost, and
UNKNOWN at leader_until when the sidecar is stopped."""

from __future__ import annotations

import asyncio
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

import consistd
from consistd import LeadershipState, LeaseTiming
from support import Daemon, SocketProxy, next_item, next_matching, unique


async def test_campaign_leads_then_hands_over_when_closed(client: consistd.Client, peer: consistd.Client) -> None:
    election = unique("sdk-py-election")
    async with client.campaign(election) as a:
        leading = await next_matching(a, lambda s: s.is_leader)
        # Terms start at 1 (a fresh Lease's leaseTransitions + 1); every change of holder increases it.
        assert leading.term == 1, "a new election's first leader is in term 1"
        assert leading.holder == "sdk-a" and leading.identity == "sdk-a" and leading.election == election
        assert a.is_leader and a.term == leading.term == (await client.get_leadership(election)).term

        async with peer.campaign(election) as b:
            following = await next_matching(b, lambda s: s.state == LeadershipState.FOLLOWER)
            assert following.holder == "sdk-a" and following.identity == "sdk-b" and not b.is_leader

            await a.aclose()  # resigns at once
            took_over = await next_matching(b, lambda s: s.is_leader, timeout=30)
            assert took_over.holder == "sdk-b" and took_over.term > leading.term and b.is_leader


async def test_campaign_reports_unknown_at_once_when_the_sidecar_is_lost_then_campaigns_again(
    client: consistd.Client, short_dir: Path
) -> None:
    proxy = await SocketProxy(client.socket, str(short_dir / "proxy.sock")).start()
    try:
        async with consistd.Client(proxy.path) as via_proxy:
            async with via_proxy.campaign(unique("sdk-py-lost")) as campaign:
                leading = await next_matching(campaign, lambda s: s.is_leader)
                proxy.cut()
                lost = await next_item(campaign, timeout=2)
                assert lost.state == LeadershipState.UNKNOWN and not campaign.is_leader
                assert lost.election == leading.election and lost.holder == ""
                again = await next_matching(campaign, lambda s: s.is_leader, timeout=30)
                assert again.holder == "sdk-a" and proxy.forwarded >= 2
    finally:
        await proxy.close()


async def test_a_stopped_sidecar_demotes_the_app_at_leader_until(short_dir: Path) -> None:
    daemon = Daemon(short_dir, unique("sdk-py-stopped"))
    await daemon.start()
    stopped = False
    pending: asyncio.Future[consistd.LeadershipStatus] | None = None
    try:
        async with consistd.Client(daemon.socket) as own:
            await own.wait_ready(30)
            timing = LeaseTiming(lease_duration=4, renew_deadline=3, retry_period=1)
            async with own.campaign(unique("sdk-py-stopped"), timing=timing) as campaign:
                leading = await next_matching(campaign, lambda s: s.is_leader and s.leader_until is not None)
                yielded_until = leading.leader_until
                assert yielded_until is not None

                # Renewals every second move leader_until on without yielding a state, in the status held too.
                pending = asyncio.ensure_future(campaign.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=3)
                assert not done, f"a renewal was yielded as a new state: {pending.result()}"
                # The deadline it was yielded with (at most a renew deadline, 3 s, away) has passed by now.
                assert datetime.now(timezone.utc) >= yielded_until
                assert leading.is_leader, "the held LEADER status went stale: renewals did not move its deadline"
                assert leading.leader_until is not None and leading.leader_until > yielded_until
                assert campaign.status is leading and campaign.is_leader

                daemon.signal(signal.SIGSTOP)
                stopped = True
                await asyncio.sleep(0.5)  # a renewal already on its way has landed by now
                until = leading.leader_until
                assert until is not None
                left = (until - datetime.now(timezone.utc)).total_seconds()
                assert left > 0, "the deadline passed before the test could watch it"

                lost = await asyncio.wait_for(pending, left + 5)
                at = datetime.now(timezone.utc)
                assert lost.state == LeadershipState.UNKNOWN and not lost.is_leader and not campaign.is_leader
                assert lost.holder == "" and lost.term == leading.term
                assert not leading.is_leader and leading.leader_until == until, "the held status keeps its deadline"
                assert at >= until - timedelta(seconds=0.05), f"demoted {until - at} before leader_until"
                assert at <= until + timedelta(seconds=1.5), f"demoted {at - until} after leader_until"
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
        if stopped:
            daemon.signal(signal.SIGCONT)
        await daemon.stop()
