//! Gzip for watch streams, which kube turns off: Kubernetes 1.37 compresses a streaming list (WatchList) one
//! gzip member per flush, and tower-http's decompression reads only a body's first member
//! (tower-rs/tower-http#737), so kube asks every watch for `Accept-Encoding: identity`. This layer, below
//! tower-http's, asks a watch for gzip again and decodes every member as it arrives (async-compression's
//! multi-member decoder, which hands out what it decoded without waiting for more), so a streaming list
//! crosses the wire compressed and each event still arrives at once. An apiserver that does not compress
//! watches (before 1.37) answers as before.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use async_compression::tokio::bufread::GzipDecoder;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use http::{
    HeaderValue, Request, Response,
    header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH},
};
use http_body_util::{BodyExt as _, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Body, Frame};
use tokio_util::io::{ReaderStream, StreamReader};
use tower::{BoxError, Layer, Service};

/// A response body as this layer hands it on: the apiserver's, or a watch's decoded.
pub(crate) type WatchBody = UnsyncBoxBody<Bytes, BoxError>;

/// Asks watches for gzip (unless `enabled` is false: the kubeconfig's `disable-compression`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchGzipLayer {
    /// Whether watches ask for gzip.
    pub(crate) enabled: bool,
}

impl<S> Layer<S> for WatchGzipLayer {
    type Service = WatchGzip<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WatchGzip { inner, enabled: self.enabled }
    }
}

/// The service [`WatchGzipLayer`] makes.
#[derive(Debug, Clone)]
pub(crate) struct WatchGzip<S> {
    inner: S,
    enabled: bool,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for WatchGzip<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<WatchBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        // kube's watch requests, and only those, come with `identity`.
        let watch = self.enabled
            && request.headers().get(ACCEPT_ENCODING).is_some_and(|v| v == "identity")
            && request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        if watch {
            request.headers_mut().insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let gzipped = response.headers().get(CONTENT_ENCODING).is_some_and(|v| v == "gzip");
            if !(watch && gzipped) {
                return Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()));
            }
            let (mut parts, body) = response.into_parts();
            parts.headers.remove(CONTENT_ENCODING);
            parts.headers.remove(CONTENT_LENGTH);
            Ok(Response::from_parts(parts, gunzip(body)))
        })
    }
}

/// `body`, every gzip member of it decoded as it arrives.
fn gunzip<B>(body: B) -> WatchBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let compressed = body.into_data_stream().map_err(|e| std::io::Error::other(e.into()));
    let mut decoder = GzipDecoder::new(StreamReader::new(compressed));
    decoder.multiple_members(true);
    let frames = ReaderStream::new(decoder).map(|chunk| chunk.map(Frame::data).map_err(BoxError::from));
    StreamBody::new(frames).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_compression::tokio::bufread::GzipEncoder;
    use tokio::{io::AsyncReadExt as _, sync::mpsc};
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;

    /// `text` as one gzip member, as the apiserver flushes one event.
    async fn member(text: &str) -> Bytes {
        let mut out = Vec::new();
        GzipEncoder::new(text.as_bytes()).read_to_end(&mut out).await.expect("gzip");
        Bytes::from(out)
    }

    #[tokio::test]
    async fn each_member_is_handed_on_before_the_next_arrives_and_all_of_them_are_read() {
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
        let mut body = gunzip(StreamBody::new(ReceiverStream::new(rx)));
        let first = member("{\"type\":\"ADDED\"}\n").await;
        // A member split across frames, as TCP may deliver it.
        let (a, b) = first.split_at(5);
        tx.send(Ok(Frame::data(Bytes::copy_from_slice(a)))).await.expect("send");
        tx.send(Ok(Frame::data(Bytes::copy_from_slice(b)))).await.expect("send");
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first event without waiting for the second")
            .expect("a frame")
            .expect("decoded");
        assert_eq!(frame.into_data().expect("data"), "{\"type\":\"ADDED\"}\n");
        tx.send(Ok(Frame::data(member("{\"type\":\"BOOKMARK\"}\n").await))).await.expect("send");
        drop(tx);
        let rest = body.collect().await.expect("the rest").to_bytes();
        assert_eq!(rest, "{\"type\":\"BOOKMARK\"}\n", "the second member too, not only the first");
    }

    #[tokio::test]
    async fn only_a_watch_asks_for_gzip_and_only_a_gzipped_answer_is_decoded() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let apiserver = tower::service_fn(move |request: Request<()>| {
            let accept = request.headers().get(ACCEPT_ENCODING).map(|v| v.to_str().unwrap_or("").to_owned());
            record.lock().expect("lock").push(accept);
            async move {
                let body = http_body_util::Full::new(Bytes::from_static(b"plain"));
                Ok::<_, std::convert::Infallible>(Response::new(body))
            }
        });
        let mut service = WatchGzipLayer { enabled: true }.layer(apiserver);
        let get =
            |uri: &str, accept: &str| Request::get(uri).header(ACCEPT_ENCODING, accept).body(()).expect("request");
        for request in [
            get("/api/v1/configmaps?watch=true&sendInitialEvents=true", "identity"),
            get("/api/v1/configmaps?limit=1", "identity"),
            get("/api/v1/configmaps?watch=true", "gzip, deflate"),
        ] {
            let body = service.call(request).await.expect("answer").into_body();
            assert_eq!(body.collect().await.expect("body").to_bytes(), "plain", "an unencoded answer as it is");
        }
        let mut off = WatchGzipLayer { enabled: false }.layer(tower::service_fn(|request: Request<()>| {
            let accept = request.headers().get(ACCEPT_ENCODING).cloned();
            async move {
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(Bytes::from(format!(
                    "{accept:?}"
                )))))
            }
        }));
        let answer = off.call(get("/api/v1/configmaps?watch=true", "identity")).await.expect("answer");
        assert!(answer.into_body().collect().await.expect("body").to_bytes().ends_with(b"\"identity\")"), "disabled");
        let seen = seen.lock().expect("lock").clone();
        assert_eq!(seen, [Some("gzip".to_owned()), Some("identity".to_owned()), Some("gzip, deflate".to_owned())]);
    }
}
