//! The own-write rule where the app takes an event, against a real daemon: a third party's change reaches
//! the app's side of the watch while the app is busy, the app then writes the object itself, and only
//! then takes the next event.

use std::{pin::pin, time::Duration};

use consistd_client::{
    Client, Error, Event, Watch,
    proto::{Consistency, DeliveryMode, EventType, PatchRequest, PatchType},
};
use consistd_testkit::{Daemon, consistd_bin, kube_client, namespace};
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);
/// How long a change the daemon has fanned out is given to reach the app's side of its watch.
const ARRIVED: Duration = Duration::from_millis(500);

async fn next(stream: &mut (impl Stream<Item = Result<Event, Error>> + Unpin)) -> Event {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(item))) => item,
        Ok(Some(Err(e))) => panic!("stream failed: {e}"),
        Ok(None) => panic!("stream ended"),
        Err(_) => panic!("nothing within {WAIT:?}"),
    }
}

/// `TYPE name@resourceVersion` of an event.
fn describe(e: &Event) -> String {
    let kind = e.kind.as_str_name().trim_start_matches("EVENT_TYPE_");
    e.object.as_ref().map_or_else(|| kind.to_owned(), |o| format!("{kind} {}@{}", o.name, o.resource_version))
}

/// A daemon, a namespace of its own and a ConfigMap "shared" in it, created by a third party (directly
/// through the apiserver: not a write of the app). Returns the third party's handle and the version.
async fn setup(identity: &str) -> (Daemon, Api<ConfigMap>, String, String) {
    let d = Daemon::builder(consistd_bin()).config(format!("identity: {identity}")).start().await;
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let object =
        serde_json::from_value(json!({ "metadata": { "name": "shared" }, "data": { "k": "0" } })).expect("a ConfigMap");
    let created = api.create(&PostParams::default(), &object).await.expect("create");
    let rv = created.metadata.resource_version.expect("a resourceVersion");
    (d, api, ns, rv)
}

/// The third party changes "shared" (its version is returned first); once the daemon has sent that
/// change to its subscribers (an observer's watch shows it) and it had time to reach the app's side, the
/// app patches the object itself through `app` (the version its write returned comes second). The app
/// takes nothing meanwhile, as if it were busy.
async fn changed_behind_the_apps_back(d: &Daemon, api: &Api<ConfigMap>, app: &Client, ns: &str) -> (String, String) {
    let observer = d.client();
    let mut observed = pin!(observer.subscribe(Watch::new("configmaps").namespace(ns).mode(DeliveryMode::Raw)));
    while next(&mut observed).await.kind != EventType::Synced {}
    let theirs = json!({ "data": { "k": "third party" } });
    let theirs = api.patch("shared", &PatchParams::default(), &Patch::Merge(&theirs)).await.expect("third-party patch");
    let theirs = theirs.metadata.resource_version.expect("a resourceVersion");
    loop {
        let e = next(&mut observed).await;
        if e.object.is_some_and(|o| o.resource_version == theirs) {
            break;
        }
    }
    tokio::time::sleep(ARRIVED).await;
    let mine = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: "shared".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "k": "app" } }).to_string().into_bytes(),
        ..Default::default()
    };
    let mine = app.objects().patch(mine).await.expect("the app's patch").into_inner().object.expect("an object");
    (theirs, mine.resource_version)
}

#[tokio::test]
async fn a_consistent_watch_never_hands_the_app_a_state_older_than_its_own_write() {
    let (d, api, ns, rv) = setup("sdk-rust-own-consistent").await;
    let app = d.client();
    let mut events = pin!(app.subscribe(Watch::new("configmaps").namespace(&ns)));
    assert_eq!(describe(&next(&mut events).await), format!("ADDED shared@{rv}"));
    assert_eq!(describe(&next(&mut events).await), "SYNCED");

    let (theirs, mine) = changed_behind_the_apps_back(&d, &api, &app, &ns).await;
    let taken = next(&mut events).await;
    assert_ne!(
        describe(&taken),
        format!("MODIFIED shared@{theirs}"),
        "the app took the third party's state after its own write returned {mine}"
    );
    assert_eq!(describe(&taken), format!("MODIFIED shared@{mine}"));
    assert_eq!((taken.consistency, taken.predates_own_write), (Consistency::OwnWrite, false));
}

#[tokio::test]
async fn a_raw_watch_marks_a_state_older_than_the_apps_own_write() {
    let (d, api, ns, rv) = setup("sdk-rust-own-raw").await;
    let app = d.client();
    let mut events = pin!(app.subscribe(Watch::new("configmaps").namespace(&ns).mode(DeliveryMode::Raw)));
    assert_eq!(describe(&next(&mut events).await), format!("ADDED shared@{rv}"));
    assert_eq!(describe(&next(&mut events).await), "SYNCED");

    let (theirs, mine) = changed_behind_the_apps_back(&d, &api, &app, &ns).await;
    let older = next(&mut events).await;
    assert_eq!(describe(&older), format!("MODIFIED shared@{theirs}"), "RAW delivers every event");
    assert!(older.predates_own_write, "{theirs}, taken after the app's write returned {mine}, is not marked");
    let own = next(&mut events).await;
    assert_eq!(describe(&own), format!("MODIFIED shared@{mine}"));
    assert!(!own.predates_own_write, "the app's own state is marked as older than its write");
    assert!(!app.predates_own_write(own.object.as_ref().expect("an object")));
    // Another client (another connection) did not make the write: its record knows nothing of it.
    assert!(!d.client().predates_own_write(older.object.as_ref().expect("an object")));
}
