//! Follows one fencing policy or binding by name with a watch (a field selector on the name, which the
//! ClusterRole consistd-fence grants), so a policy installed, changed or removed is noticed at once, and an
//! idle daemon asks the apiserver nothing about fencing: the apiserver ends each watch after 30 to 60 minutes,
//! and it is resumed from where it was.

use std::{fmt::Debug, time::Duration};

use futures::TryStreamExt;
use kube::{
    Api, Resource,
    api::{ListParams, WatchEvent, WatchParams},
};
use serde::de::DeserializeOwned;

/// How soon a list or watch that got no answer is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How soon one the apiserver refused (no grant to watch, say) is tried again: it would refuse again soon.
const REFUSED: Duration = Duration::from_secs(600);

/// Follows the object `name` of `K` for as long as it is polled, calling `changed` each time it is created,
/// changed or deleted after the first list.
pub(super) async fn follow<K>(api: Api<K>, name: &str, changed: impl Fn())
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let fields = format!("metadata.name={name}");
    // Where the next watch resumes; none: list first.
    let mut resume: Option<String> = None;
    // The object's resourceVersion, none while it does not exist; the outer none: not listed yet.
    let mut seen: Option<Option<String>> = None;
    let mut now = |object: Option<String>| {
        if seen.as_ref().is_some_and(|before| *before != object) {
            changed();
        }
        seen = Some(object);
    };
    loop {
        let from = match resume.clone() {
            Some(from) => from,
            None => match api.list(&ListParams::default().fields(&fields)).await {
                Ok(list) => {
                    now(list.items.first().and_then(|o| o.meta().resource_version.clone()));
                    let from = list.metadata.resource_version.unwrap_or_default();
                    resume = Some(from.clone());
                    from
                }
                Err(error) => {
                    tokio::time::sleep(pause(&error)).await;
                    continue;
                }
            },
        };
        let events = match api.watch(&WatchParams::default().fields(&fields), &from).await {
            Ok(events) => events,
            Err(error) => {
                tokio::time::sleep(pause(&error)).await;
                continue;
            }
        };
        let mut events = std::pin::pin!(events);
        loop {
            match events.try_next().await {
                Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                    resume.clone_from(&o.meta().resource_version);
                    now(o.meta().resource_version.clone());
                }
                Ok(Some(WatchEvent::Deleted(o))) => {
                    resume.clone_from(&o.meta().resource_version);
                    now(None);
                }
                Ok(Some(WatchEvent::Bookmark(b))) => resume = Some(b.metadata.resource_version),
                // 410 Gone: the version to resume from is too old; list again. Any other: watch again.
                Ok(Some(WatchEvent::Error(e))) => {
                    if e.code == 410 {
                        resume = None;
                    }
                    break;
                }
                // The apiserver ended the watch (its timeout): resume it.
                Ok(None) => break,
                Err(error) => {
                    tokio::time::sleep(pause(&error)).await;
                    break;
                }
            }
        }
    }
}

/// How long to wait after `error` before trying again: long when the apiserver answered, briefly when not.
fn pause(error: &kube::Error) -> Duration {
    match error {
        kube::Error::Api(status) if status.code < 500 && status.code != 429 => REFUSED,
        _ => RETRY,
    }
}
