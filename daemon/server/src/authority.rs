//! Lets stock gRPC clients in: rewrites the Unix socket path some clients send as HTTP/2 `:authority`,
//! which the h2 server under tonic refuses as malformed, to `localhost`; every other byte is untouched.
//!
//! gRPC C-core (Python, C++, Ruby, PHP) and grpc-java send the socket path (C-core percent-encodes
//! it) as the authority of a `unix:` target, and h2 answers every such request with RST_STREAM
//! PROTOCOL_ERROR (hyperium/h2#487, open since 2020). [`Relaxed`] sits between the accepted connection
//! and the HTTP/2 server and reads the client's first header block: if its authority is valid, or is
//! not a socket path, the connection is passed through untouched from then on at no cost. If it is a
//! socket path, every header block of that connection is decoded and encoded again (HPACK keeps a
//! per-connection table, so one rewritten block means all must be), with that one header replaced.
//! Anything else malformed still reaches h2 as sent and is refused there.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What a socket-path authority becomes.
const REPLACEMENT: &[u8] = b"localhost";

/// The client connection preface every HTTP/2 connection begins with (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

/// The size of every HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;

/// The largest frame payload the server accepts (h2's default SETTINGS_MAX_FRAME_SIZE, which tonic
/// keeps); rewritten blocks are split into frames of at most this size.
const MAX_FRAME_LEN: usize = 16_384;

/// The HPACK dynamic table size the server allows (SETTINGS_HEADER_TABLE_SIZE, h2's default).
const HEADER_TABLE_SIZE: usize = 4_096;

/// A header block larger than this is passed through as sent rather than held (h2 judges it).
const MAX_HELD_BLOCK: usize = 1024 * 1024;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A server-side connection whose client→server bytes have socket-path authorities rewritten.
pub(crate) struct Relaxed<S> {
    inner: S,
    reader: Reader,
}

impl<S> Relaxed<S> {
    /// Wraps an accepted connection.
    pub(crate) fn new(inner: S) -> Self {
        Self { inner, reader: Reader::default() }
    }
}

impl<S: Connected> Connected for Relaxed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Relaxed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.reader.out.is_empty() {
                let n = this.reader.out.len().min(buf.remaining());
                buf.put_slice(&this.reader.out[..n]);
                this.reader.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.reader.mode == Mode::Passthrough && this.reader.raw.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.reader.process() {
                continue;
            }
            // Everything read so far is processed or waits for more: read more.
            this.reader.raw.reserve(8 * 1024);
            if ready!(tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.reader.raw))? == 0 {
                // End of stream: hand over whatever is held, as sent; h2 judges a truncated frame.
                this.reader.give_up();
                if this.reader.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Relaxed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where the reader is in the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Within the first `n` remaining bytes of the connection preface.
    Preface(usize),
    /// Reading frames, before the first header block decided which way this connection goes.
    Undecided,
    /// The client sends socket-path authorities: every header block is rewritten.
    Rewrite,
    /// Nothing to rewrite on this connection: bytes pass as read.
    Passthrough,
}

/// The header block being collected (a HEADERS frame and its CONTINUATIONs).
struct Block {
    stream_id: u32,
    end_stream: bool,
    /// The HEADERS frame's priority fields, if it had them.
    priority: Option<[u8; 5]>,
    /// The HPACK fragments, padding removed.
    fragments: BytesMut,
    /// The frames as the client sent them, to hand over untouched if this block is not rewritten.
    sent: BytesMut,
}

/// The client→server byte stream's parser and rewriter.
struct Reader {
    mode: Mode,
    /// Bytes read from the client, not yet processed.
    raw: BytesMut,
    /// Bytes ready for the HTTP/2 server.
    out: BytesMut,
    /// Payload bytes of the current pass-through frame still to forward.
    payload_left: usize,
    block: Option<Block>,
    /// The client's HPACK state, mirrored.
    decoder: loona_hpack::Decoder<'static>,
    /// The HPACK state of what the server receives from this reader.
    encoder: loona_hpack::Encoder<'static>,
}

impl Default for Reader {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            mode: Mode::Preface(PREFACE_LEN),
            raw: BytesMut::new(),
            out: BytesMut::new(),
            payload_left: 0,
            block: None,
            decoder,
            encoder: loona_hpack::Encoder::new(),
        }
    }
}

impl Reader {
    /// Moves what it can from `raw` to `out`; false when more input is needed first.
    fn process(&mut self) -> bool {
        let before = (self.raw.len(), self.out.len());
        loop {
            match self.mode {
                Mode::Passthrough => {
                    self.out.unsplit(self.raw.split());
                    break;
                }
                Mode::Preface(left) => {
                    let n = left.min(self.raw.len());
                    self.out.unsplit(self.raw.split_to(n));
                    self.mode = if n == left { Mode::Undecided } else { Mode::Preface(left - n) };
                    if n < left {
                        break;
                    }
                    continue;
                }
                Mode::Undecided | Mode::Rewrite => {
                    if self.payload_left > 0 {
                        let n = self.payload_left.min(self.raw.len());
                        self.out.unsplit(self.raw.split_to(n));
                        self.payload_left -= n;
                        if self.payload_left > 0 {
                            break;
                        }
                        continue;
                    }
                    if self.next_frame() {
                        continue;
                    }
                }
            }
            break;
        }
        (self.raw.len(), self.out.len()) != before
    }

    /// Handles the frame at the start of `raw`, if enough of it has arrived; false if not.
    fn next_frame(&mut self) -> bool {
        let Some(header) = self.raw.get(..FRAME_HEADER_LEN) else {
            return false;
        };
        let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let kind = header[3];
        let flags = header[4];
        let stream_id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let in_block = self.block.is_some();
        let header_frame = kind == HEADERS || (kind == CONTINUATION && in_block);
        if !header_frame {
            if in_block {
                // A header block interrupted by another frame is a protocol error; h2 says so.
                self.give_up();
                return true;
            }
            self.out.extend_from_slice(&self.raw.split_to(FRAME_HEADER_LEN));
            self.payload_left = len;
            return true;
        }
        let held = self.block.as_ref().map_or(0, |block| block.sent.len());
        if len > MAX_FRAME_LEN || held + len > MAX_HELD_BLOCK || (kind == CONTINUATION && !in_block) {
            self.give_up();
            return true;
        }
        if self.raw.len() < FRAME_HEADER_LEN + len {
            return false;
        }
        let frame = self.raw.split_to(FRAME_HEADER_LEN + len);
        let payload = &frame[FRAME_HEADER_LEN..];
        if kind == HEADERS {
            if in_block {
                self.give_up_with(frame);
                return true;
            }
            let Some((priority, fragment)) = headers_payload(flags, payload) else {
                self.give_up_with(frame);
                return true;
            };
            self.block = Some(Block {
                stream_id,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragments: BytesMut::from(fragment),
                sent: BytesMut::new(),
            });
        } else if let Some(block) = self.block.as_mut() {
            if block.stream_id != stream_id {
                self.give_up_with(frame);
                return true;
            }
            block.fragments.extend_from_slice(payload);
        }
        if let Some(block) = self.block.as_mut() {
            block.sent.extend_from_slice(&frame);
        }
        if flags & END_HEADERS != 0 {
            self.finish_block();
        }
        true
    }

    /// Decodes the collected header block and hands it on, rewritten or as sent.
    fn finish_block(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let decoded = self.decoder.decode_with_cb(&block.fragments, |name, value| {
            headers.push((name.into_owned(), value.into_owned()));
        });
        if decoded.is_err() {
            // Malformed HPACK: h2 refuses it with a connection error.
            self.out.unsplit(block.sent);
            self.mode = Mode::Passthrough;
            return;
        }
        let mut rewrote = false;
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority" && is_socket_path(value) {
                *value = REPLACEMENT.to_vec();
                rewrote = true;
            }
        }
        if self.mode == Mode::Undecided && !rewrote {
            // This client's authority is fine (or not ours to fix): nothing more to do here.
            self.out.unsplit(block.sent);
            self.mode = Mode::Passthrough;
            return;
        }
        if rewrote {
            tracing::trace!(stream = block.stream_id, "rewrote a socket-path :authority to localhost");
        }
        self.mode = Mode::Rewrite;
        let encoded = self.encoder.encode(headers.iter().map(|(name, value)| (name.as_slice(), value.as_slice())));
        self.write_block(&block, &encoded);
    }

    /// Writes `encoded` as a HEADERS frame (with the original stream, END_STREAM and priority) and as
    /// many CONTINUATION frames as the frame size needs.
    fn write_block(&mut self, block: &Block, encoded: &[u8]) {
        let priority_len = if block.priority.is_some() { 5 } else { 0 };
        let first_len = encoded.len().min(MAX_FRAME_LEN - priority_len);
        let (first, mut rest) = encoded.split_at(first_len);
        let mut flags = 0;
        if block.end_stream {
            flags |= END_STREAM;
        }
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        put_frame_header(&mut self.out, priority_len + first.len(), HEADERS, flags, block.stream_id);
        if let Some(priority) = block.priority {
            self.out.extend_from_slice(&priority);
        }
        self.out.extend_from_slice(first);
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME_LEN));
            let flags = if after.is_empty() { END_HEADERS } else { 0 };
            put_frame_header(&mut self.out, chunk.len(), CONTINUATION, flags, block.stream_id);
            self.out.extend_from_slice(chunk);
            rest = after;
        }
    }

    /// Stops interpreting: hands over everything held and read as sent, and passes the rest through.
    fn give_up(&mut self) {
        if let Some(block) = self.block.take() {
            self.out.unsplit(block.sent);
        }
        self.out.unsplit(self.raw.split());
        self.mode = Mode::Passthrough;
    }

    /// [`Reader::give_up`], with `frame` (already taken from `raw`) handed over after the held block.
    fn give_up_with(&mut self, frame: BytesMut) {
        if let Some(block) = self.block.take() {
            self.out.unsplit(block.sent);
        }
        self.out.unsplit(frame);
        self.out.unsplit(self.raw.split());
        self.mode = Mode::Passthrough;
    }
}

/// Splits a HEADERS payload into its priority fields and its HPACK fragment, removing padding; None if
/// the padding or priority fields do not fit.
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&len, after) = rest.split_first()?;
        pad = usize::from(len);
        rest = after;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (fields, after) = rest.split_first_chunk::<5>()?;
        priority = Some(*fields);
        rest = after;
    }
    let end = rest.len().checked_sub(pad)?;
    Some((priority, &rest[..end]))
}

fn put_frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream_id: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.put_slice(&len[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream_id);
}

/// Whether an authority is a Unix socket path h2 would refuse: an absolute path, as grpc-java sends
/// it, or percent-encoded, as gRPC C-core does (without the leading slash: "var%2Frun%2Fx.sock").
/// Valid authorities and other malformed ones are left for h2.
fn is_socket_path(value: &[u8]) -> bool {
    let encoded_slash = value.windows(3).any(|w| w.eq_ignore_ascii_case(b"%2f"));
    (value.starts_with(b"/") || encoded_slash) && http::uri::Authority::try_from(value).is_err()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const PREFACE: &[u8; PREFACE_LEN] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_frame_header(&mut out, payload.len(), kind, flags, stream_id);
        out.extend_from_slice(payload);
        out.to_vec()
    }

    fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/grpc.health.v1.Health/Check"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_vec(), value.to_vec()))
        .collect()
    }

    fn encode(encoder: &mut loona_hpack::Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(headers.iter().map(|(name, value)| (name.as_slice(), value.as_slice())))
    }

    /// Sends `input` through a `Relaxed` connection and returns what the server side reads.
    async fn through(input: Vec<u8>) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1024);
        let writer = consistd_core::tasks::Tasks::new().spawn(async move {
            // Small writes, so frames arrive split at every point.
            for chunk in input.chunks(7) {
                client.write_all(chunk).await.expect("write to the duplex");
            }
            client.shutdown().await.expect("shut down the duplex");
        });
        let mut relaxed = Relaxed::new(server);
        let mut read = Vec::new();
        relaxed.read_to_end(&mut read).await.expect("read through Relaxed");
        writer.await.expect("writer task");
        read
    }

    /// Splits a byte stream (after the preface) into frames: (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    #[tokio::test]
    async fn a_valid_authority_passes_byte_for_byte() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut encoder, &request(b"localhost"))));
        input.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        // A later socket-path authority on the same connection is not this connection's habit: untouched.
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &encode(&mut encoder, &request(b"/tmp/x.sock"))));
        assert_eq!(through(input.clone()).await, input);
    }

    #[tokio::test]
    async fn socket_path_authorities_become_localhost_and_nothing_else_changes() {
        let path = b"/var/run/consistd/consistd.sock";
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        // First request: padded, with priority, split over a CONTINUATION.
        let block = encode(&mut encoder, &request(path));
        let (head, tail) = block.split_at(10);
        let mut payload = vec![3]; // pad length
        payload.extend([0, 0, 0, 0, 15]); // priority fields
        payload.extend(head);
        payload.extend([0, 0, 0]);
        input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, tail));
        input.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        // Second request: the client's dynamic table now indexes the path; C-core's encoded form too.
        let mut second = request(b"var%2Frun%2Fconsistd%2Fconsistd.sock");
        second.push((b"x-custom".to_vec(), b"kept".to_vec()));
        input.extend(frame(HEADERS, END_HEADERS, 3, &encode(&mut encoder, &request(path))));
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, &encode(&mut encoder, &second)));

        let output = through(input).await;
        assert_eq!(&output[..PREFACE_LEN], PREFACE);
        let frames = frames(&output[PREFACE_LEN..]);
        let kinds: Vec<_> = frames.iter().map(|(kind, flags, stream, _)| (*kind, *flags, *stream)).collect();
        assert_eq!(
            kinds,
            [
                (0x4, 0, 0),
                (HEADERS, PRIORITY | END_HEADERS, 1),
                (0x0, END_STREAM, 1),
                (HEADERS, END_HEADERS, 3),
                (HEADERS, END_HEADERS | END_STREAM, 5),
            ]
        );
        assert_eq!(frames[1].3[..5], [0, 0, 0, 0, 15], "priority fields kept");
        assert_eq!(frames[2].3, [0, 0, 0, 0, 0], "DATA untouched");

        let mut decoder = loona_hpack::Decoder::new();
        let first = decoder.decode(&frames[1].3[5..]).expect("decode the first rewritten block");
        assert_eq!(first, request(b"localhost"));
        let again = decoder.decode(&frames[3].3).expect("decode the second rewritten block");
        assert_eq!(again, request(b"localhost"));
        let mut expected = request(b"localhost");
        expected.push((b"x-custom".to_vec(), b"kept".to_vec()));
        assert_eq!(decoder.decode(&frames[4].3).expect("decode the third rewritten block"), expected);
    }

    #[tokio::test]
    async fn other_malformed_authorities_are_left_for_h2_to_refuse() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut encoder, &request(b"bad host"))));
        assert_eq!(through(input.clone()).await, input);
    }

    #[tokio::test]
    async fn a_large_rewritten_block_is_split_into_continuations() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut headers = request(b"/tmp/consistd.sock");
        headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let mut input = PREFACE.to_vec();
        let block = encode(&mut encoder, &headers);
        for (i, chunk) in block.chunks(MAX_FRAME_LEN).enumerate() {
            let last = (i + 1) * MAX_FRAME_LEN >= block.len();
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            input.extend(frame(kind, if last { END_HEADERS } else { 0 }, 1, chunk));
        }
        let frames = frames(&through(input).await[PREFACE_LEN..]);
        assert!(frames.len() >= 3, "40 kB needs three frames of 16 kB");
        assert!(frames.iter().all(|(_, _, _, payload)| payload.len() <= MAX_FRAME_LEN));
        assert_eq!(frames.last().map(|f| f.1), Some(END_HEADERS));
        let block: Vec<u8> = frames.iter().flat_map(|(_, _, _, payload)| payload.clone()).collect();
        let mut expected = request(b"localhost");
        expected.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        assert_eq!(loona_hpack::Decoder::new().decode(&block).expect("decode"), expected);
    }

    #[test]
    fn socket_paths_are_recognised() {
        assert!(is_socket_path(b"/var/run/consistd/consistd.sock"));
        assert!(is_socket_path(b"%2Fvar%2Frun%2Fconsistd.sock"));
        assert!(is_socket_path(b"var%2Frun%2Fconsistd%2Fconsistd.sock"), "C-core drops the leading slash");
        assert!(!is_socket_path(b"localhost"));
        assert!(!is_socket_path(b"consistd.sock"));
        assert!(!is_socket_path(b"bad host"));
    }
}
