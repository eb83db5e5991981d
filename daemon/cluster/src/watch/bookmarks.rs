//! Bookmarks handed on to the shared watch. kube-runtime's watcher asks for bookmarks, reads each one's
//! resourceVersion to resume from, and drops it, so a watch's position moved only with its events: a quiet
//! watch's high-water mark stood still while the apiserver had moved past a write it will never show (one
//! its selector cannot be judged on here). This client turns every bookmark line of a watch response into a
//! MODIFIED event of a marker object, which has a resourceVersion and nothing else (after the bookmark that
//! ends a streaming list, which the watcher needs as it is): the watcher passes it on in its place in the
//! stream (and resumes from it, as from the bookmark), and the shared watch takes it for what it is
//! ([`is_marker`]). A real object always has a uid.

use bytes::{Bytes, BytesMut};
use futures::{StreamExt as _, TryStreamExt as _};
use http::Request;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use kube::{Client, client::Body};
use tower::BoxError;

/// The start of a bookmark's line: the apiserver writes a watch event's type first.
const BOOKMARK: &[u8] = br#"{"type":"BOOKMARK""#;
/// The annotation of the bookmark that ends a streaming list, which the watcher needs as it is.
const INITIAL_EVENTS_END: &[u8] = b"k8s.io/initial-events-end";

/// A client that sends each request of `base`, and hands on each bookmark of a watch response as a marker
/// event.
pub(crate) fn bookmarking_client(base: Client) -> Client {
    let namespace = base.default_namespace().to_owned();
    let service = tower::service_fn(move |request: Request<Body>| {
        let base = base.clone();
        async move {
            let watch =
                request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
            let response = base.send(request).await.map_err(BoxError::from)?;
            if !watch {
                return Ok::<_, BoxError>(response.map(http_body_util::Either::Left));
            }
            Ok(response.map(|body| http_body_util::Either::Right(marked(body))))
        }
    });
    Client::new(service, namespace)
}

/// Whether `metadata` (of an object a watch event carries) is a bookmark's marker: a resourceVersion, and
/// neither a uid nor a name.
pub(crate) fn is_marker(metadata: &kube::api::ObjectMeta) -> bool {
    metadata.uid.is_none() && metadata.name.is_none() && metadata.resource_version.is_some()
}

/// `body` (a watch response, one event per line) with each bookmark's line rewritten as a marker event.
fn marked(body: Body) -> StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, BoxError>>> {
    let data = body.into_data_stream().map_err(BoxError::from).boxed();
    let frames = futures::stream::unfold(Some((data, Lines::default())), |state| async move {
        let (mut data, mut lines) = state?;
        loop {
            match data.next().await {
                Some(Ok(chunk)) => {
                    let whole = lines.push(chunk);
                    if !whole.is_empty() {
                        return Some((Ok(Frame::data(whole)), Some((data, lines))));
                    }
                }
                Some(Err(error)) => return Some((Err(error), Some((data, lines)))),
                // A last line without its newline goes on as it came, for the decoder to judge.
                None => {
                    let rest = lines.partial.split().freeze();
                    return (!rest.is_empty()).then(|| (Ok(Frame::data(rest)), None));
                }
            }
        }
    })
    .boxed();
    StreamBody::new(frames)
}

/// The bytes of a watch response not yet part of a whole line.
#[derive(Debug, Default)]
struct Lines {
    partial: BytesMut,
}

impl Lines {
    /// Takes in `chunk`; returns the whole lines it completes, bookmarks rewritten (the rest stays until
    /// its line ends: the watcher's decoder waits for it too).
    fn push(&mut self, chunk: Bytes) -> Bytes {
        let Some(last) = memchr::memrchr(b'\n', &chunk) else {
            self.partial.extend_from_slice(&chunk);
            return Bytes::new();
        };
        let whole = if self.partial.is_empty() {
            chunk.slice(..=last)
        } else {
            self.partial.extend_from_slice(&chunk[..=last]);
            self.partial.split().freeze()
        };
        self.partial.extend_from_slice(&chunk[last + 1..]);
        if !contains(&whole, BOOKMARK) {
            return whole;
        }
        let mut out = BytesMut::with_capacity(whole.len());
        for line in whole.split_inclusive(|b| *b == b'\n') {
            match marker_for(line) {
                Some(marker) => out.extend_from_slice(&marker),
                None => out.extend_from_slice(line),
            }
        }
        out.freeze()
    }
}

/// What stands for `line` when it is a bookmark: a marker event; for the bookmark that ends a streaming
/// list, that bookmark (the watcher needs it) and a marker after it, so the list's own version counts once it
/// is through (a list holds every change up to it, though its objects' versions may all be older).
fn marker_for(line: &[u8]) -> Option<Vec<u8>> {
    if !line.starts_with(BOOKMARK) {
        return None;
    }
    let event: serde_json::Value = serde_json::from_slice(line).ok()?;
    let object = event.get("object")?;
    let version = object.pointer("/metadata/resourceVersion")?.as_str()?;
    // "type" first, as the apiserver writes it: serde reads the object in place only after its tag.
    let mut marker = format!(
        r#"{{"type":"MODIFIED","object":{{"kind":{},"apiVersion":{},"metadata":{{"resourceVersion":{}}}}}}}"#,
        object.get("kind").cloned().unwrap_or_default(),
        object.get("apiVersion").cloned().unwrap_or_default(),
        serde_json::Value::from(version),
    )
    .into_bytes();
    marker.push(b'\n');
    if contains(line, INITIAL_EVENTS_END) {
        let mut both = line.to_vec();
        if !both.ends_with(b"\n") {
            both.push(b'\n');
        }
        both.extend_from_slice(&marker);
        return Some(both);
    }
    Some(marker)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::object::RawObject;

    const EVENT: &str = r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","uid":"u","resourceVersion":"5"}}}"#;
    const PERIODIC: &str =
        r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#;
    const LIST_END: &str = r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;

    fn through(chunks: &[&str]) -> String {
        let mut lines = Lines::default();
        let out: Vec<u8> =
            chunks.iter().flat_map(|c| lines.push(Bytes::copy_from_slice(c.as_bytes())).to_vec()).collect();
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn a_periodic_bookmark_becomes_a_marker_event_in_its_place_and_the_rest_passes_as_it_came() {
        let stream = format!("{EVENT}\n{PERIODIC}\n{EVENT}\n");
        let out = through(&[&stream]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!((lines[0], lines[2]), (EVENT, EVENT));
        // As kube's watcher decodes it: the apiserver's order ("type" first) matters to serde here.
        let marker: kube::core::WatchEvent<RawObject> =
            serde_json::from_str(lines[1]).expect("the marker decodes as a watch event");
        let kube::core::WatchEvent::Modified(object) = marker else { panic!("a MODIFIED event: {}", lines[1]) };
        assert!(is_marker(kube::Resource::meta(&object)));
        assert_eq!(kube::Resource::meta(&object).resource_version.as_deref(), Some("9"));
    }

    #[test]
    fn the_initial_lists_end_stays_a_bookmark_and_lines_split_across_chunks_are_whole_again() {
        let out = through(&[&format!("{LIST_END}\n")]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], LIST_END, "the list's end goes on as it came");
        let marker: kube::core::WatchEvent<RawObject> = serde_json::from_str(lines[1]).expect("a marker after it");
        let kube::core::WatchEvent::Modified(object) = marker else { panic!("a MODIFIED event: {}", lines[1]) };
        assert_eq!(kube::Resource::meta(&object).resource_version.as_deref(), Some("7"), "at the list's version");
        let stream = format!("{EVENT}\n{PERIODIC}\n");
        let (a, b) = stream.split_at(EVENT.len() + 10);
        let (b, c) = b.split_at(7);
        let out = through(&[a, b, c]);
        assert!(
            out.starts_with(&format!("{EVENT}\n")) && out.lines().nth(1).is_some_and(|l| l.contains("MODIFIED")),
            "{out}"
        );
    }

    #[test]
    fn a_real_object_is_never_a_marker() {
        let object: kube::api::DynamicObject = serde_json::from_str(
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","uid":"u","resourceVersion":"5"}}"#,
        )
        .expect("object");
        assert!(!is_marker(&object.metadata));
    }
}
