//! A network black hole on this host: nftables drops, on arrival, every TCP packet headed to a port or
//! sent from it. Connections stay open and nobody is told: no RST, no FIN, no ICMP — what a dead node,
//! a dropped route or a stuck middlebox looks like, unlike a clean cut. Needs root; the host is restored
//! (the table deleted) when the hole is dropped.

use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

/// Which packets of a port's connections vanish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Those headed to the port: what its clients send never arrives (nor do their ACKs).
    ToPort,
    /// Those sent from the port: what its server answers never arrives.
    FromPort,
}

/// An open black hole; closed (the packets flow again) when dropped.
#[derive(Debug)]
pub struct BlackHole {
    nft: PathBuf,
    table: String,
}

impl BlackHole {
    /// Starts dropping `direction`'s packets of `port` on every interface, loopback included. Each hole
    /// is a table of its own, so holes in parallel tests do not meet.
    pub fn open(port: u16, direction: Direction) -> Self {
        static HOLES: AtomicU32 = AtomicU32::new(0);
        let nft = nft();
        let table = format!("consistd_hole_{}_{}", std::process::id(), HOLES.fetch_add(1, Ordering::SeqCst));
        let field = match direction {
            Direction::ToPort => "dport",
            Direction::FromPort => "sport",
        };
        // The input hook: a packet dropped on output would fail the sender's write with EPERM, which is
        // a message, not a black hole.
        run(&nft, &["add", "table", "inet", &table]);
        run(
            &nft,
            &["add", "chain", "inet", &table, "input", "{ type filter hook input priority -10; policy accept; }"],
        );
        run(&nft, &["add", "rule", "inet", &table, "input", "tcp", field, &port.to_string(), "drop"]);
        Self { nft, table }
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        let out = Command::new(&self.nft).args(["delete", "table", "inet", &self.table]).output();
        if !matches!(&out, Ok(o) if o.status.success()) {
            eprintln!(
                "blackhole: could not delete nftables table {} ({out:?}); `nft delete table inet {}`",
                self.table, self.table
            );
        }
    }
}

/// Debian's nft, installed by `hack/tools.sh nft` if missing.
fn nft() -> PathBuf {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(repo.join("hack/tools.sh")).arg("nft").output().expect("run hack/tools.sh nft");
    assert!(out.status.success(), "hack/tools.sh nft: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn run(nft: &PathBuf, args: &[&str]) {
    let out = Command::new(nft).args(args).output().unwrap_or_else(|e| panic!("run nft {args:?}: {e}"));
    assert!(out.status.success(), "nft {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}
