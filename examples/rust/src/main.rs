//! Example: the Greeting operator on consistd (examples/README.md is its spec). `greeting-operator
//! controller` campaigns for leadership and prints each state; meanwhile it works on the daemon's
//! reconcile queue of Greetings (examples/crd.yaml), which hands out work only while this pod leads the
//! election: each pass publishes the Greeting's message in a ConfigMap the Greeting owns, records an
//! event, notifies a peer (ACK-tracked) and sets the Greeting's Ready condition; a finalize pass deletes
//! the ConfigMap. `greeting-operator receive` is that peer: it prints each notification and ACKs it.
//! Settings come from the environment. On SIGTERM or SIGINT either command stops, leaving the campaign
//! (the sidecar resigns: it releases the Lease), and exits 0.
//!
//! Every line goes out through `println!`: Rust's stdout is line-buffered even when it is a file, so
//! each line is flushed as it is printed.

mod configmap;
mod notify;
mod operator;
mod pass;
mod receive;
mod settings;

use std::time::Duration;

use anyhow::{Context as _, bail};
use consistd_client::Client;
use tokio::signal::unix::{SignalKind, signal};

use crate::settings::Settings;

/// Runs the command until it is done or SIGTERM/SIGINT arrives. Stopping drops the command's future,
/// and with it the campaign stream and the reconcile stream: the sidecar resigns at once (it releases the
/// Lease, so another replica leads without waiting for it to expire), the leases of items still being
/// handled go back to the queue, and the process exits 0.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env();
    let command = std::env::args().nth(1);
    let client = Client::from_env();
    let run = async {
        client.wait_ready(Duration::from_secs(30)).await.context("wait for consistd")?;
        match command.as_deref() {
            Some("controller") => operator::run(&client, settings).await,
            Some("receive") => receive::run(&client).await,
            _ => bail!("usage: greeting-operator controller|receive"),
        }
    };
    let stop = stop_signal().context("listen for SIGTERM and SIGINT")?;
    tokio::select! {
        done = run => return done,
        name = stop => println!("stopping on {name}"),
    }
    // `run` is dropped by now: the campaign is left.
    println!("stopped");
    Ok(())
}

/// Listens for SIGTERM and SIGINT from now on; the future resolves to the name of the first to arrive.
fn stop_signal() -> std::io::Result<impl Future<Output = &'static str>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
