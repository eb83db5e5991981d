//! Channel versions in the real cluster: racing publishers (a leader and one that lost its Lease
//! without knowing yet) never get the same version, each sees its own versions increase, and a new
//! publisher continues from the last version with its payload.

use consistd_core::versions::Versions;

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
                    got.push(versions.publish("config", payload, "text/plain").await.expect("publish").version);
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
    let next = successor.publish("config", b"after failover".to_vec(), "text/plain").await.expect("publish");
    assert_eq!(next.version, 61);
    // Channels are independent.
    assert_eq!(successor.publish("other", Vec::new(), "").await.expect("publish").version, 1);
}
