//! Channel versions in the real cluster: racing publishers (a leader and one that lost its Lease
//! without knowing yet) never get the same version, each sees its own versions increase, and a new
//! publisher continues from the last version with its payload; a guarded publish of a term older than one
//! its election already published in is refused in the channel's own compare-and-swap, however the two race.

use consistd_core::{
    claim::Claim,
    versions::{Versions, VersionsError},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_publishers_get_distinct_increasing_versions_and_a_new_one_continues() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    assert_eq!(Versions::new(kube.clone(), &ns).latest("config").await.expect("read"), None);

    let publishers: Vec<_> = (0..2)
        .map(|p| {
            let versions = Versions::new(kube.clone(), &ns);
            consistd_testkit::spawn(async move {
                let mut got = Vec::new();
                for i in 0..30 {
                    let payload = format!("publisher {p} change {i}").into_bytes();
                    got.push(versions.publish("config", payload, "text/plain", None).await.expect("publish").version);
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for p in publishers {
        let got = p.await.expect("publisher");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "one publisher's versions must increase: {got:?}");
        all.extend(got);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=60).collect::<Vec<u64>>(), "every version handed out exactly once");

    // A new leader (another client) continues from the last version, whose payload the cluster holds.
    let successor = Versions::new(consistd_testkit::kube_client().await, &ns);
    let latest = successor.latest("config").await.expect("read").expect("published");
    assert_eq!(latest.version, 60);
    assert!(String::from_utf8_lossy(&latest.payload).starts_with("publisher "), "{latest:?}");
    assert_eq!(latest.content_type, "text/plain");
    let next = successor.publish("config", b"after failover".to_vec(), "text/plain", None).await.expect("publish");
    assert_eq!(next.version, 61);
    // Channels are independent.
    assert_eq!(successor.publish("other", Vec::new(), "", None).await.expect("publish").version, 1);
}

fn claim(lease: &str, term: u64) -> Claim {
    Claim { namespace: "ns".into(), lease: lease.into(), term }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_of_an_older_term_is_refused_once_a_later_one_published_however_they_race() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // The deposed leader (term 7) publishes as fast as it can; its successor (term 8) joins in.
    let deposed = Versions::new(kube.clone(), &ns);
    let old = consistd_testkit::spawn(async move {
        let mut landed = Vec::new();
        loop {
            match deposed.publish("config", b"old".to_vec(), "", Some(&claim("e", 7))).await {
                Ok(v) => landed.push(v.version),
                Err(refused) => return (landed, refused),
            }
        }
    });
    let successor = Versions::new(kube.clone(), &ns);
    let mut new = Vec::new();
    for _ in 0..10 {
        new.push(
            successor.publish("config", b"new".to_vec(), "", Some(&claim("e", 8))).await.expect("publish").version,
        );
    }
    let (old_landed, refused) = old.await.expect("the deposed publisher");
    assert!(
        matches!(&refused, VersionsError::Fenced { why, .. }
            if why == "election ns/e published on channel config in term 8, and this was guarded by term 7"),
        "{refused:?}"
    );
    let first_new = new[0];
    assert!(
        old_landed.iter().all(|v| *v < first_new),
        "no version of term 7 after the first of term 8 ({first_new}): {old_landed:?}"
    );
    let latest = successor.latest("config").await.expect("read").expect("published");
    assert_eq!((latest.version, latest.claim), (new[9], Some(claim("e", 8))), "the version carries its claim");

    // An unguarded publish and another election's older term go on, and keep term 8 standing for e.
    assert!(successor.publish("config", b"plain".to_vec(), "", None).await.is_ok());
    assert!(successor.publish("config", b"other".to_vec(), "", Some(&claim("f", 1))).await.is_ok());
    let late = successor.publish("config", b"old".to_vec(), "", Some(&claim("e", 7))).await;
    assert!(matches!(late, Err(VersionsError::Fenced { .. })), "{late:?}");
}
