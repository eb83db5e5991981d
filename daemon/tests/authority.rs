//! The daemon answers gRPC clients that send their Unix socket path as `:authority` (gRPC C-core and
//! grpc-java do by default) and still refuses other malformed authorities. A hand-written HTTP/2
//! client sends exactly those headers to a real daemon; the stock clients themselves run in
//! hack/stock-clients.sh.

use consistd_testkit::Daemon;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PROTOCOL_ERROR: u32 = 0x1;

/// How one call ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The server answered: HTTP status, gRPC status, and the response message bytes.
    Answered { status: String, grpc_status: String, message: Vec<u8> },
    /// The server reset the stream with this HTTP/2 error code.
    Reset(u32),
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small frame").to_be_bytes();
    let mut out = len[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// Calls grpc.health.v1.Health/Check on a fresh connection, sending `authority` as `:authority`.
async fn health_check(socket: &std::path::Path, authority: &[u8]) -> Outcome {
    let mut conn = UnixStream::connect(socket).await.expect("connect to the daemon's socket");
    let headers: [(&[u8], &[u8]); 6] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/grpc.health.v1.Health/Check"),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let block = loona_hpack::Encoder::new().encode(headers);
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_HEADERS, 1, &block));
    // An empty HealthCheckRequest: not compressed, length 0.
    out.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]));
    conn.write_all(&out).await.expect("send the request");

    let mut decoder = loona_hpack::Decoder::new();
    let (mut status, mut grpc_status, mut message) = (String::new(), String::new(), Vec::new());
    loop {
        let mut header = [0u8; 9];
        conn.read_exact(&mut header).await.expect("read a frame header");
        let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        let mut payload = vec![0; len];
        conn.read_exact(&mut payload).await.expect("read a frame payload");
        match kind {
            SETTINGS if flags & 0x1 == 0 => {
                conn.write_all(&frame(SETTINGS, 0x1, 0, &[])).await.expect("ack settings");
            }
            RST_STREAM if stream == 1 => {
                return Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().expect("4-byte code")));
            }
            GOAWAY => panic!("the daemon closed the connection: {payload:?}"),
            HEADERS if stream == 1 => {
                for (name, value) in decoder.decode(&payload).expect("decode the response headers") {
                    let value = String::from_utf8_lossy(&value).into_owned();
                    match name.as_slice() {
                        b":status" => status = value,
                        b"grpc-status" => grpc_status = value,
                        _ => {}
                    }
                }
            }
            DATA if stream == 1 => message.extend(payload),
            _ => {}
        }
        if stream == 1 && flags & END_STREAM != 0 {
            return Outcome::Answered { status, grpc_status, message };
        }
    }
}

/// What Health/Check answers when the daemon serves: status 200, gRPC OK, HealthCheckResponse{SERVING}.
fn serving() -> Outcome {
    Outcome::Answered { status: "200".into(), grpc_status: "0".into(), message: vec![0, 0, 0, 0, 2, 0x08, 0x01] }
}

#[tokio::test]
async fn a_socket_path_authority_is_answered_as_sent_by_grpc_java_and_c_core() {
    let daemon = Daemon::builder(BIN).start().await;
    let path = daemon.socket().to_str().expect("utf-8 socket path").to_owned();
    // grpc-java sends the path as it is.
    assert_eq!(health_check(daemon.socket(), path.as_bytes()).await, serving());
    // gRPC C-core (grpcio) drops the leading slash and percent-encodes the rest.
    let encoded = path.trim_start_matches('/').replace('/', "%2F");
    assert_eq!(health_check(daemon.socket(), encoded.as_bytes()).await, serving());
    // What grpc-go and grpc-js send, for comparison.
    assert_eq!(health_check(daemon.socket(), b"localhost").await, serving());
}

#[tokio::test]
async fn other_malformed_authorities_are_still_refused() {
    let daemon = Daemon::builder(BIN).start().await;
    assert_eq!(health_check(daemon.socket(), b"bad host").await, Outcome::Reset(PROTOCOL_ERROR));
    assert_eq!(health_check(daemon.socket(), b"host:port:extra/").await, Outcome::Reset(PROTOCOL_ERROR));
}
