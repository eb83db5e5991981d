//! The Rust SDK's conformance agent: serves the agent protocol (client-sdk/conformance/README.md) with one
//! `consistd_client::Client` on `CONSISTD_SOCKET`.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use consistd_client::{
    Action, Changed, Client, Error, Event, Latest, ReconcileError, ReconcileSpec, Reconciler, Sent, Taken, Watch,
    WorkItem,
    proto::{
        CampaignRequest, ConditionStatus, DeliveryMode, EventSeverity, GetRequest, PatchRequest, PatchType,
        SendRequest, WriteGuard,
    },
    to_peer,
};
use futures::{Stream, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

type Events = Pin<Box<dyn Stream<Item = Result<Event, Error>> + Send>>;
/// A reconcile handler waiting for its `handle`.
type Waiting = tokio::sync::oneshot::Sender<Handle>;

/// What the agent keeps between commands.
#[derive(Clone)]
struct Agent {
    client: Client,
    /// Each send's result, by message id, for `outcome`.
    sent: Arc<Mutex<HashMap<String, Arc<Sent>>>>,
    /// Watches started with `take` false, by stream name.
    paused: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<Events>>>>>,
    /// Reconcile handlers waiting for their `handle`, by (stream, item name).
    handlers: Arc<Mutex<HashMap<(String, String), Waiting>>>,
    /// The latest-state watches, by stream name.
    latest: Arc<Mutex<HashMap<String, Latest>>>,
    /// What each worker of a latest-state watch holds, by (stream, worker).
    held: Arc<Mutex<HashMap<(String, String), Taken>>>,
    out: Arc<tokio::sync::Mutex<tokio::io::Stdout>>,
}

/// What a `handle` tells a waiting handler: the patch to write (if any), whether to end DONE, and where to
/// answer with the write's result.
struct Handle {
    patch: Option<Value>,
    /// A status condition to set first: type, status, reason, message.
    condition: Option<(String, ConditionStatus, String, String)>,
    /// An event to record next: severity, reason, action, note.
    event: Option<(EventSeverity, String, String, String)>,
    done: bool,
    answer: tokio::sync::oneshot::Sender<Result<Value, Failure>>,
}

/// A command's failure: the gRPC code's name and a message.
struct Failure {
    code: &'static str,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Status(s) => Self { code: code_name(s.code()), message: s.message().to_owned() },
            other => Self { code: "UNKNOWN", message: other.to_string() },
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Error::Status(s).into()
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure { code: "INVALID_ARGUMENT", message: message.into() }
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn field<'a>(command: &'a Value, name: &str) -> Result<&'a str, Failure> {
    command.get(name).and_then(Value::as_str).ok_or_else(|| invalid(format!("{name}: must be a string")))
}

/// The `guard` field of a command: None when absent or null.
fn guard(command: &Value) -> Result<Option<WriteGuard>, Failure> {
    let Some(g) = command.get("guard").filter(|g| !g.is_null()) else { return Ok(None) };
    Ok(Some(WriteGuard {
        election: field(g, "election")?.into(),
        namespace: field(g, "namespace")?.into(),
        term: g.get("term").and_then(Value::as_u64).ok_or_else(|| invalid("guard.term: must be a number"))?,
    }))
}

fn event_json(e: &Event) -> Value {
    let object = e.object.as_ref();
    json!({
        "type": e.kind.as_str_name().trim_start_matches("EVENT_TYPE_"),
        "name": object.map(|o| o.name.as_str()).unwrap_or_default(),
        "resourceVersion": object.map(|o| o.resource_version.as_str()).unwrap_or_default(),
        "predatesOwnWrite": e.predates_own_write,
        "previousResourceVersion": e.previous_resource_version,
    })
}

fn error_json(f: &Failure) -> Value {
    json!({ "code": f.code, "message": f.message })
}

impl Agent {
    async fn print(&self, line: Value) {
        let mut text = line.to_string();
        text.push('\n');
        let mut out = self.out.lock().await;
        let _ = out.write_all(text.as_bytes()).await;
        let _ = out.flush().await;
    }

    async fn run(&self, command: Value) {
        let id = command.get("id").cloned().unwrap_or(Value::Null);
        let answer = match command.get("op").and_then(Value::as_str).unwrap_or_default() {
            "get" => self.get(&command).await,
            "patch" => self.patch(&command).await,
            "watch" => self.watch(&command),
            "take" => self.take(&command).await,
            "send" => self.send(&command).await,
            "outcome" => self.outcome(&command).await,
            "campaign" => self.campaign(&command),
            "reconcile" => self.reconcile(&command),
            "handle" => self.handle(&command).await,
            "latest" => self.latest(&command),
            "next" => self.next(&command).await,
            "done" => self.done(&command),
            other => Err(invalid(format!("op: unknown op {other:?}"))),
        };
        self.print(match answer {
            Ok(ok) => json!({ "id": id, "ok": ok }),
            Err(f) => json!({ "id": id, "error": error_json(&f) }),
        })
        .await;
    }

    async fn get(&self, c: &Value) -> Result<Value, Failure> {
        let request = GetRequest {
            resource: field(c, "resource")?.into(),
            namespace: field(c, "namespace")?.into(),
            name: field(c, "name")?.into(),
            ..Default::default()
        };
        let object = self.client.objects().get(request).await?.into_inner().object.unwrap_or_default();
        Ok(json!({ "resourceVersion": object.resource_version }))
    }

    async fn patch(&self, c: &Value) -> Result<Value, Failure> {
        let patch = c.get("patch").ok_or_else(|| invalid("patch: must be set"))?;
        let request = PatchRequest {
            resource: field(c, "resource")?.into(),
            namespace: field(c, "namespace")?.into(),
            name: field(c, "name")?.into(),
            patch_type: PatchType::Merge.into(),
            patch: patch.to_string().into_bytes(),
            ..Default::default()
        };
        let object = self.client.objects().patch(request).await?.into_inner().object.unwrap_or_default();
        Ok(json!({ "resourceVersion": object.resource_version, "uid": object.uid }))
    }

    fn watch(&self, c: &Value) -> Result<Value, Failure> {
        let stream = field(c, "stream")?.to_owned();
        let mode = match field(c, "mode")? {
            "RAW" => DeliveryMode::Raw,
            "CONSISTENT" => DeliveryMode::Consistent,
            other => return Err(invalid(format!("mode: {other:?} is neither RAW nor CONSISTENT"))),
        };
        let watch = Watch::new(field(c, "resource")?).namespace(field(c, "namespace")?).mode(mode);
        let events: Events = Box::pin(self.client.subscribe(watch));
        if c.get("take").and_then(Value::as_bool).unwrap_or(false) {
            let agent = self.clone();
            tokio::spawn(async move {
                let mut events = events;
                while let Some(next) = events.next().await {
                    let ended = next.is_err();
                    agent.print(stream_line(&stream, next)).await;
                    if ended {
                        return;
                    }
                }
            });
        } else {
            let events = Arc::new(tokio::sync::Mutex::new(events));
            self.paused.lock().unwrap_or_else(PoisonError::into_inner).insert(stream, events);
        }
        Ok(json!({}))
    }

    async fn take(&self, c: &Value) -> Result<Value, Failure> {
        let stream = field(c, "stream")?;
        let count = c.get("count").and_then(Value::as_u64).ok_or_else(|| invalid("count: must be a number"))?;
        let events = self.paused.lock().unwrap_or_else(PoisonError::into_inner).get(stream).cloned();
        let events = events.ok_or_else(|| invalid(format!("stream: no paused watch {stream:?}")))?;
        let mut events = events.lock().await;
        for _ in 0..count {
            let Some(next) = events.next().await else { break };
            self.print(stream_line(stream, next)).await;
        }
        Ok(json!({}))
    }

    async fn send(&self, c: &Value) -> Result<Value, Failure> {
        let request = SendRequest {
            destination: Some(to_peer(field(c, "peer")?)),
            resource_id: field(c, "resourceId")?.into(),
            event_id: field(c, "eventId")?.into(),
            payload: field(c, "payload")?.as_bytes().to_vec(),
            guard: guard(c)?,
            ..Default::default()
        };
        let sent = self.client.send(request).await?;
        let id = sent.message_id.clone();
        self.sent.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), Arc::new(sent));
        Ok(json!({ "messageId": id }))
    }

    async fn outcome(&self, c: &Value) -> Result<Value, Failure> {
        let id = field(c, "messageId")?;
        let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned();
        let sent = sent.ok_or_else(|| invalid(format!("messageId: this agent sent no message {id:?}")))?;
        let timeout = c.get("timeoutMs").and_then(Value::as_u64).unwrap_or(0);
        let outcome = if timeout == 0 {
            sent.outcome().await?
        } else {
            tokio::time::timeout(Duration::from_millis(timeout), sent.outcome()).await.map_err(|_| Failure {
                code: "DEADLINE_EXCEEDED",
                message: format!("no outcome within {timeout} ms"),
            })??
        };
        let kind = outcome.kind.as_str_name().trim_start_matches("ACK_OUTCOME_");
        Ok(json!({ "outcome": kind, "peer": outcome.peer, "reason": outcome.reason }))
    }

    fn campaign(&self, c: &Value) -> Result<Value, Failure> {
        let stream = field(c, "stream")?.to_owned();
        let request = CampaignRequest {
            election: field(c, "election")?.into(),
            namespace: field(c, "namespace")?.into(),
            ..Default::default()
        };
        let mut states = Box::pin(self.client.campaign(request));
        let agent = self.clone();
        tokio::spawn(async move {
            while let Some(next) = states.next().await {
                let line = match next {
                    Ok(s) => json!({ "stream": stream, "item": {
                        "state": s.state.as_str_name().trim_start_matches("LEADERSHIP_STATE_"),
                        "holder": s.holder,
                        "term": s.term,
                    }}),
                    Err(e) => json!({ "stream": stream, "error": error_json(&e.into()) }),
                };
                agent.print(line).await;
            }
        });
        Ok(json!({}))
    }
}

impl Agent {
    fn reconcile(&self, c: &Value) -> Result<Value, Failure> {
        let stream = field(c, "stream")?.to_owned();
        let mut spec = ReconcileSpec::new(field(c, "queue")?, field(c, "resource")?).namespace(field(c, "namespace")?);
        if let Some(election) = c.get("election").and_then(Value::as_str).filter(|e| !e.is_empty()) {
            spec = spec.election(election, field(c, "electionNamespace")?);
        }
        if let Some(changes) = c.get("changes").filter(|c| !c.is_null()) {
            for (name, part) in [
                ("generation", Changed::Generation),
                ("labels", Changed::Labels),
                ("annotations", Changed::Annotations),
            ] {
                if changes.get(name).and_then(Value::as_bool) == Some(true) {
                    spec = spec.only_changes_of(part);
                }
            }
        }
        if let Some(finalizer) = c.get("finalizer").and_then(Value::as_str).filter(|f| !f.is_empty()) {
            spec = spec.finalizer(finalizer);
        }
        let agent = self.clone();
        let handler = move |item: WorkItem| {
            let (agent, stream) = (agent.clone(), stream.clone());
            async move { agent.handler(&stream, item).await }
        };
        let reconciler = Reconciler::new(&self.client, spec);
        tokio::spawn(async move {
            if let Err(e) = reconciler.run(handler).await {
                eprintln!("conformance agent: the reconciler ended: {e}");
            }
        });
        Ok(json!({}))
    }

    /// The reconcile handler: prints the item, waits for its `handle`, writes as told through the item's
    /// objects client, answers with the write's result and ends as told.
    async fn handler(&self, stream: &str, item: WorkItem) -> Result<Action, ReconcileError> {
        let (told, handle) = tokio::sync::oneshot::channel();
        let key = (stream.to_owned(), item.name.clone());
        self.handlers.lock().unwrap_or_else(PoisonError::into_inner).insert(key, told);
        let line = json!({ "namespace": item.namespace, "name": item.name, "term": item.term,
            "attempt": item.attempt, "leaseId": item.lease_id, "finalizing": item.finalizing });
        self.print(json!({ "stream": stream, "item": line })).await;
        let Ok(handle) = handle.await else { return Err(ReconcileError::retry("the agent stopped")) };
        let mut answer = json!({});
        if let Some((kind, status, reason, message)) = &handle.condition {
            match item.set_condition(kind, *status, reason, message).await {
                Ok(set) => {
                    answer["condition"] =
                        json!({ "changed": set.changed, "lastTransitionTime": set.last_transition_time });
                }
                Err(status) => {
                    let _ = handle.answer.send(Err(Failure::from(status)));
                    return Err(ReconcileError::retry("the condition was not set"));
                }
            }
        }
        if let Some((severity, reason, action, note)) = &handle.event {
            match item.record_event(*severity, reason, action, note).await {
                Ok(recorded) => answer["event"] = json!({ "recorded": recorded }),
                Err(status) => {
                    let _ = handle.answer.send(Err(Failure::from(status)));
                    return Err(ReconcileError::retry("the event was not recorded"));
                }
            }
        }
        let written = match handle.patch {
            None => Ok(answer),
            Some(patch) => {
                let request = PatchRequest {
                    resource: "configmaps".into(),
                    namespace: item.namespace.clone(),
                    name: item.name.clone(),
                    patch_type: PatchType::Merge.into(),
                    patch: patch.to_string().into_bytes(),
                    ..Default::default()
                };
                match item.objects().patch(request).await {
                    Ok(patched) => {
                        answer["resourceVersion"] =
                            patched.into_inner().object.unwrap_or_default().resource_version.into();
                        Ok(answer)
                    }
                    Err(status) => Err(Failure::from(status)),
                }
            }
        };
        let _ = handle.answer.send(written);
        if handle.done { Ok(Action::done()) } else { Err(ReconcileError::retry("the suite asked for a retry")) }
    }

    async fn handle(&self, c: &Value) -> Result<Value, Failure> {
        let key = (field(c, "stream")?.to_owned(), field(c, "name")?.to_owned());
        let done = match field(c, "outcome")? {
            "DONE" => true,
            "RETRY" => false,
            other => return Err(invalid(format!("outcome: {other:?} is neither DONE nor RETRY"))),
        };
        let patch = c.get("patch").filter(|p| !p.is_null()).cloned();
        let condition = match c.get("condition").filter(|c| !c.is_null()) {
            None => None,
            Some(set) => {
                let status = match field(set, "status")? {
                    "True" => ConditionStatus::True,
                    "False" => ConditionStatus::False,
                    "Unknown" => ConditionStatus::Unknown,
                    other => return Err(invalid(format!("condition.status: {other:?} is not True, False or Unknown"))),
                };
                let text = |name: &str| field(set, name).map(str::to_owned);
                Some((text("type")?, status, text("reason")?, text("message")?))
            }
        };
        let waiting = self.handlers.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        let waiting = waiting.ok_or_else(|| invalid(format!("name: no handler waits with item {:?}", key.1)))?;
        let (answer, written) = tokio::sync::oneshot::channel();
        let event = match c.get("event").filter(|e| !e.is_null()) {
            None => None,
            Some(e) => {
                let severity = match field(e, "severity")? {
                    "Normal" => EventSeverity::Normal,
                    "Warning" => EventSeverity::Warning,
                    other => return Err(invalid(format!("event.severity: {other:?} is not Normal or Warning"))),
                };
                let text = |name: &str| field(e, name).map(str::to_owned);
                Some((severity, text("reason")?, text("action")?, text("note")?))
            }
        };
        let handle = Handle { patch, condition, event, done, answer };
        waiting.send(handle).map_err(|_| invalid("name: that handler is gone"))?;
        written.await.map_err(|_| Failure { code: "UNKNOWN", message: "the handler ended without answering".into() })?
    }
}

impl Agent {
    /// Opens the SDK's latest-state consumer of a CONSISTENT watch.
    fn latest(&self, c: &Value) -> Result<Value, Failure> {
        let stream = field(c, "stream")?.to_owned();
        let watch = Watch::new(field(c, "resource")?).namespace(field(c, "namespace")?);
        let latest = self.client.subscribe_latest(watch);
        self.latest.lock().unwrap_or_else(PoisonError::into_inner).insert(stream, latest);
        Ok(json!({}))
    }

    /// A worker asks for the next object's newest state, and holds it until its `done`.
    async fn next(&self, c: &Value) -> Result<Value, Failure> {
        let key = (field(c, "stream")?.to_owned(), field(c, "worker")?.to_owned());
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner).get(&key.0).cloned();
        let latest = latest.ok_or_else(|| invalid(format!("stream: no latest-state watch {:?}", key.0)))?;
        let taken = latest.next().await?;
        let item = event_json(&taken);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains_key(&key) {
            return Err(invalid(format!("worker: {:?} holds an object already", key.1)));
        }
        held.insert(key, taken);
        Ok(item)
    }

    /// The worker is done with the object it holds.
    fn done(&self, c: &Value) -> Result<Value, Failure> {
        let key = (field(c, "stream")?.to_owned(), field(c, "worker")?.to_owned());
        let taken = self.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        taken.ok_or_else(|| invalid(format!("worker: {:?} holds nothing", key.1)))?.done();
        Ok(json!({}))
    }
}

fn stream_line(stream: &str, next: Result<Event, Error>) -> Value {
    match next {
        Ok(e) => json!({ "stream": stream, "item": event_json(&e) }),
        Err(e) => json!({ "stream": stream, "error": error_json(&e.into()) }),
    }
}

#[tokio::main]
async fn main() {
    let agent = Agent {
        client: Client::from_env(),
        sent: Arc::default(),
        paused: Arc::default(),
        handlers: Arc::default(),
        latest: Arc::default(),
        held: Arc::default(),
        out: Arc::new(tokio::sync::Mutex::new(tokio::io::stdout())),
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<Value>(&line) {
            Ok(command) => {
                let agent = agent.clone();
                tokio::spawn(async move { agent.run(command).await });
            }
            Err(e) => eprintln!("conformance agent: not a JSON command ({e}): {line}"),
        }
    }
}
