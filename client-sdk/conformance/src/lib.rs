//! The suite's side of the agent protocol (README.md): starts an SDK's agent on a socket, sends it
//! commands and hands back their answers and the items of the streams it prints; and [`HoldProxy`], which
//! holds back a stream's next event while new calls pass.

use std::{
    collections::HashMap,
    path::Path,
    process::Stdio,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    process::{Child, ChildStdin, Command},
    sync::{mpsc, oneshot},
};

mod hold;

pub use hold::HoldProxy;

/// The variable naming the agent's command; unset, the Rust SDK's agent runs.
pub const AGENT_VARIABLE: &str = "CONSISTD_CONFORMANCE_AGENT";

/// How long any answer or stream item may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// An error the SDK gave the app, as the agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentError {
    /// The gRPC code's canonical name, e.g. "UNAVAILABLE".
    pub code: String,
    /// The error's message.
    pub message: String,
}

impl AgentError {
    fn from_json(value: &Value) -> Self {
        let text = |k: &str| value.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        Self { code: text("code"), message: text("message") }
    }
}

/// One line a stream printed: an item, or the error that ended it.
pub type StreamLine = Result<Value, AgentError>;

type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, AgentError>>>>>;
type Streams = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<StreamLine>>>>;

/// A running agent; it is killed when dropped.
pub struct Agent {
    child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    next_id: AtomicU64,
    waiting: Waiting,
    streams: Streams,
    command: String,
}

impl Agent {
    /// Starts the agent `CONSISTD_CONFORMANCE_AGENT` names (else `default_command`) with
    /// `CONSISTD_SOCKET` set to `socket`.
    pub fn start(socket: &Path, default_command: &str) -> Self {
        let command = std::env::var(AGENT_VARIABLE).unwrap_or_else(|_| default_command.to_owned());
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env("CONSISTD_SOCKET", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start the agent `{command}`: {e}"));
        let stdin = child.stdin.take().expect("the agent's stdin");
        let stdout = child.stdout.take().expect("the agent's stdout");
        let (waiting, streams) = (Waiting::default(), Streams::default());
        tokio::spawn(read_lines(BufReader::new(stdout), waiting.clone(), streams.clone(), command.clone()));
        Self { child, stdin: tokio::sync::Mutex::new(stdin), next_id: AtomicU64::new(1), waiting, streams, command }
    }

    /// Runs `op` with `fields` and returns its answer: `ok`'s value, or the error the SDK gave.
    pub async fn call(&self, op: &str, fields: Value) -> Result<Value, AgentError> {
        let answer = self.send(op, fields).await;
        tokio::time::timeout(WAIT, answer)
            .await
            .unwrap_or_else(|_| panic!("agent `{}`: no answer to {op} within {WAIT:?}", self.command))
    }

    /// Sends `op` and returns, without waiting, the future of its answer.
    pub async fn send(&self, op: &str, fields: Value) -> impl Future<Output = Result<Value, AgentError>> + use<> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let mut command = fields;
        command["id"] = json!(id);
        command["op"] = json!(op);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).insert(id, tx);
        let mut line = command.to_string();
        line.push('\n');
        let mut stdin = self.stdin.lock().await;
        stdin.write_all(line.as_bytes()).await.unwrap_or_else(|e| panic!("write to the agent: {e}"));
        stdin.flush().await.unwrap_or_else(|e| panic!("write to the agent: {e}"));
        let (command, op) = (self.command.clone(), op.to_owned());
        async move { rx.await.unwrap_or_else(|_| panic!("agent `{command}` exited before it answered {op}")) }
    }

    /// The lines stream `name` prints from now on; call before the op that starts it.
    pub fn stream(&self, name: &str) -> Stream {
        let (tx, rx) = mpsc::unbounded_channel();
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).insert(name.to_owned(), tx);
        Stream { name: name.to_owned(), lines: rx }
    }

    /// The agent's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The lines one stream of the agent printed.
pub struct Stream {
    name: String,
    lines: mpsc::UnboundedReceiver<StreamLine>,
}

impl Stream {
    /// The stream's next line, failing the test after [`WAIT`].
    pub async fn next(&mut self) -> StreamLine {
        self.next_within(WAIT).await.unwrap_or_else(|| panic!("stream {}: nothing within {WAIT:?}", self.name))
    }

    /// The stream's next line, or None if none comes within `within`.
    pub async fn next_within(&mut self, within: Duration) -> Option<StreamLine> {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(line)) => Some(line),
            Ok(None) => panic!("stream {}: the agent exited", self.name),
            Err(_) => None,
        }
    }

    /// The next item, failing the test on an error line.
    pub async fn item(&mut self) -> Value {
        self.next().await.unwrap_or_else(|e| panic!("stream {} ended: {e:?}", self.name))
    }
}

/// Routes each line the agent prints to the call or stream it belongs to.
async fn read_lines(
    stdout: BufReader<tokio::process::ChildStdout>,
    waiting: Waiting,
    streams: Streams,
    command: String,
) {
    let mut lines = stdout.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            panic!("agent `{command}` printed a line that is not JSON: {line}");
        };
        let outcome = |v: &Value| match v.get("error") {
            Some(error) => Err(AgentError::from_json(error)),
            None => Ok(v.get("ok").or_else(|| v.get("item")).cloned().unwrap_or(Value::Null)),
        };
        if let Some(id) = value.get("id").and_then(Value::as_u64) {
            if let Some(tx) = waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(&id) {
                let _ = tx.send(outcome(&value));
            }
        } else if let Some(name) = value.get("stream").and_then(Value::as_str) {
            if let Some(tx) = streams.lock().unwrap_or_else(PoisonError::into_inner).get(name) {
                let _ = tx.send(outcome(&value));
            }
        } else {
            panic!("agent `{command}` printed a line with neither id nor stream: {line}");
        }
    }
    // Dropping the senders tells everyone waiting that the agent is gone.
    waiting.lock().unwrap_or_else(PoisonError::into_inner).clear();
    streams.lock().unwrap_or_else(PoisonError::into_inner).clear();
}
