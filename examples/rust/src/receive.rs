//! The `receive` command, the peer app: prints each notification and ACKs it.

use std::pin::pin;

use anyhow::{Context as _, bail};
use consistd_client::Client;
use futures::StreamExt as _;

/// Prints each notification from peers and ACKs it once printed; returns after `EXAMPLE_EXIT_AFTER`
/// notifications when that is set, else runs until the inbox stream fails.
pub(crate) async fn run(client: &Client) -> anyhow::Result<()> {
    let exit_after = exit_after()?;
    let mut deliveries = pin!(client.receive());
    let mut received = 0;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery.context("receive")?;
        let m = &delivery.message;
        println!("received {} {} {}", m.resource_id, m.event_id, String::from_utf8_lossy(&m.payload));
        delivery.ack().await.context("ack")?;
        received += 1;
        if exit_after.is_some_and(|n| received >= n) {
            return Ok(());
        }
    }
    bail!("inbox stream ended")
}

/// `EXAMPLE_EXIT_AFTER`: how many notifications to receive before exiting; `None` when unset.
fn exit_after() -> anyhow::Result<Option<usize>> {
    match std::env::var("EXAMPLE_EXIT_AFTER") {
        Ok(n) => Ok(Some(n.parse().with_context(|| format!("EXAMPLE_EXIT_AFTER={n:?} is not a number"))?)),
        Err(_) => Ok(None),
    }
}
