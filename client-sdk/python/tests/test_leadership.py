"""Campaigns: leading with a term, following, handing over, and UNKNOWN at once when the sidecar is lost."""

from __future__ import annotations

from pathlib import Path

import consistd
from consistd import LeadershipState
from support import SocketProxy, next_item, next_matching, unique


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
