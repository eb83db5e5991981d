//! Fencing at the apiserver: whether the cluster runs the `consistd-fence` admission policy and this
//! daemon may claim a term on a write, and the headers that carry a guarded write's claim (this daemon's
//! own identity impersonated, with the extra `consistd.io/fence`), so a stale term is refused where the
//! write lands.

use std::{
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

pub use consistd_core::claim::Claim;
use consistd_core::config::{FencingConfig, FencingMode, Live};
use consistd_observe::metrics::Metrics;
use http::{HeaderName, HeaderValue};
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    authentication::v1::{SelfSubjectReview, UserInfo},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    core::Request,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

mod follow;
pub(crate) mod token;

/// Name of the ValidatingAdmissionPolicy that checks a claim against its election's Lease, and of its binding
/// (manifests/fencing).
pub(crate) const POLICY: &str = "consistd-fence";
/// Name of the ValidatingAdmissionPolicy that checks a claim against the token stamped on the written object,
/// and of its binding.
pub(crate) const OBJECT_POLICY: &str = "consistd-fence-object";
/// The policies guarded writes rely on, each with a binding of its own name.
const POLICIES: [&str; 2] = [POLICY, OBJECT_POLICY];
/// The user extra a guarded write carries: `<lease namespace>/<lease name>/<term>`.
pub(crate) const EXTRA: &str = "consistd.io/fence";
/// How soon a check that could not get an answer (the apiserver unreachable or failing) is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// `Impersonate-Extra-` + the extra's key, percent-encoded as the apiserver reads it ('/' is not allowed in
/// a header name).
const EXTRA_HEADER: &str = "impersonate-extra-consistd.io%2ffence";
/// Groups the apiserver adds to every impersonated user itself; naming them would need a grant to
/// impersonate them.
const IMPLIED_GROUPS: [&str; 1] = ["system:authenticated"];

/// Where guarded writes are fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Where {
    /// Not asked yet: guarded writes are checked in this daemon only until the first check ends.
    Unknown,
    /// The apiserver refuses a stale term: guarded writes go as `user` in `groups` with the claim.
    Apiserver {
        /// This daemon's user name, as the apiserver knows it.
        user: String,
        /// Its groups, less the ones the apiserver adds to every impersonated user.
        groups: Vec<String>,
    },
    /// Guarded writes are checked in this daemon only, for this reason.
    Local(String),
}

impl Where {
    /// One line for logs and `consistd status`.
    pub fn describe(&self) -> String {
        match self {
            Self::Unknown => "in this daemon only, until the cluster has been asked".to_owned(),
            Self::Apiserver { .. } => {
                format!("at the apiserver (ValidatingAdmissionPolicies {POLICY} and {OBJECT_POLICY})")
            }
            Self::Local(why) => format!("in this daemon only: {why}"),
        }
    }
}

/// Which fence a guarded write goes out with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedBy {
    /// The apiserver checks its claim where it lands.
    Apiserver,
    /// Only this daemon checked its guard, when it sent it.
    Daemon,
}

impl FencedBy {
    /// The `fence` label of `consistd_guarded_writes_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Apiserver => "apiserver",
            Self::Daemon => "daemon",
        }
    }
}

/// How a guarded write goes out: the fence it gets and the headers that carry its claim.
#[derive(Debug, Clone)]
pub(crate) struct Fenced {
    /// The fence it gets.
    pub by: FencedBy,
    /// Its claim, as the apiserver reads it; none while this daemon may not claim.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Fenced {
    /// Whether the write claims its term at the apiserver: only then may it stamp the object's token (the
    /// policy refuses a token moved by a write that does not claim it).
    pub(crate) fn claims(&self) -> bool {
        !self.headers.is_empty()
    }
}

/// Why fencing at the apiserver is off, from one check.
#[derive(Debug, thiserror::Error)]
enum CheckError {
    #[error("the ValidatingAdmissionPolicy{0} {1} is not installed (kubectl apply -k manifests/fencing)")]
    NotInstalled(&'static str, &'static str),
    #[error("binding {0} does not deny (its validationActions are {1:?})")]
    NotDenying(&'static str, Vec<String>),
    #[error("read ValidatingAdmissionPolicy{0} {1} (the ClusterRole consistd-fence grants it)")]
    Read(&'static str, &'static str, #[source] kube::Error),
    #[error("ask the apiserver who this daemon is (SelfSubjectReview)")]
    WhoAmI(#[source] kube::Error),
    #[error(
        "impersonate this daemon's own identity with the extra {EXTRA} (manifests/base/rbac.yaml and the \
         ClusterRole consistd-fence grant it)"
    )]
    Impersonate(#[source] kube::Error),
    #[error("the apiserver did not pass the extra {EXTRA} on to an impersonated request")]
    ExtraDropped,
}

impl CheckError {
    /// Whether the cluster answered (the policy is missing, a grant is): not worth asking again soon.
    fn answered(&self) -> bool {
        let source = match self {
            Self::Read(_, _, e) | Self::WhoAmI(e) | Self::Impersonate(e) => e,
            Self::NotInstalled(..) | Self::NotDenying(..) | Self::ExtraDropped => return true,
        };
        matches!(source, kube::Error::Api(status) if status.code < 500 && status.code != 429)
    }
}

/// Whether guarded writes are fenced at the apiserver, kept current by [`Fencing::run`].
pub struct Fencing {
    client: Client,
    /// `fencing`, as reloads change it: the mode and the recheck period.
    config: Live<FencingConfig>,
    /// Where each guarded write's fence is counted.
    metrics: Metrics,
    place: RwLock<Where>,
    /// Wakes [`Fencing::run`] for a check before its period is up.
    recheck: Notify,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing").field("place", &self.place()).finish_non_exhaustive()
    }
}

impl Fencing {
    /// Not known yet where guarded writes are fenced: [`run`](Self::run) finds out, as often as `config`
    /// says.
    pub fn new(client: Client, config: Live<FencingConfig>, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self { client, config, metrics, place: RwLock::new(Where::Unknown), recheck: Notify::new() })
    }

    /// `fencing.mode`, for `consistd status`.
    pub fn mode(&self) -> FencingMode {
        self.config.get().mode
    }

    /// Where guarded writes are fenced now.
    pub fn place(&self) -> Where {
        self.place.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How a write guarded by `claim` to an object in `namespace` (empty: cluster-scoped) goes out: with
    /// the claim whenever this daemon may claim. A write to an existing object (`create` false) is fenced at
    /// the apiserver in any namespace and scope: it stamps the object, and consistd-fence-object refuses an
    /// older term on it. A create has no stored object, so only the Lease policy checks it, and that reads
    /// the election's Lease from the object's namespace. Under `fencing.mode: require`, a write the apiserver
    /// cannot check is refused: the reason.
    pub(crate) fn fence(&self, claim: &Claim, namespace: &str, create: bool) -> Result<Fenced, String> {
        let (headers, unchecked) = match &*self.place.read().unwrap_or_else(PoisonError::into_inner) {
            Where::Apiserver { user, groups } => {
                let unseen = if !create {
                    None
                } else if namespace.is_empty() {
                    Some("the object is cluster-scoped".to_owned())
                } else if namespace != claim.namespace {
                    Some(format!("the object is in namespace {namespace}, the election's Lease in {}", claim.namespace))
                } else {
                    None
                };
                let why = unseen.map(|what| {
                    format!(
                        "a create has no stored object to carry a token, {what}, and ValidatingAdmissionPolicy \
                         {POLICY} reads the Lease from the object's namespace"
                    )
                });
                (impersonation(user, groups, claim), why)
            }
            place => (Vec::new(), Some(format!("guarded writes are fenced {}", place.describe()))),
        };
        let fenced = match unchecked {
            None => Ok(Fenced { by: FencedBy::Apiserver, headers }),
            Some(why) if self.mode() == FencingMode::Require => Err(why),
            Some(_) => Ok(Fenced { by: FencedBy::Daemon, headers }),
        };
        self.metrics.count_guarded_write(fenced.as_ref().map_or("refused", |f| f.by.label()));
        fenced
    }

    /// Asks for a check now: a guarded write was refused permission to impersonate, so the grants
    /// may have changed.
    pub(crate) fn recheck(&self) {
        self.recheck.notify_one();
    }

    /// Checks now, whenever a watch sees one of the policies or their bindings change, when a guarded write
    /// asks ([`Fencing::recheck`]), and every `fencing.recheck` (for the grants, which no watch shows) until
    /// `shutdown`, logging each change. Idle, the fence costs the apiserver four watches, each renewed every
    /// 30 to 60 minutes, and one check per `fencing.recheck`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let changed = || self.recheck.notify_one();
        let policies = || Api::<ValidatingAdmissionPolicy>::all(self.client.clone());
        let bindings = || Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone());
        let followed = futures::future::join4(
            follow::follow(policies(), POLICY, changed),
            follow::follow(policies(), OBJECT_POLICY, changed),
            follow::follow(bindings(), POLICY, changed),
            follow::follow(bindings(), OBJECT_POLICY, changed),
        );
        tokio::select! {
            () = self.checks(shutdown) => {}
            _ = followed => {}
        }
    }

    /// The checks of [`Fencing::run`]. Only the cluster's answer moves the fence: a check that got none (the
    /// apiserver unreachable, timing out or failing) leaves it where it was and is tried again soon. Fencing
    /// exists for exactly those network conditions, so they must not turn the claim off.
    async fn checks(&self, shutdown: CancellationToken) {
        loop {
            let recheck = self.config.get().recheck;
            let (place, next) = match self.check().await {
                Ok((user, groups)) => (Where::Apiserver { user, groups }, recheck),
                Err(error) if error.answered() => (Where::Local(consistd_core::error::chain(&error)), recheck),
                Err(error) => {
                    let error = consistd_core::error::chain(&error);
                    tracing::warn!(%error, "fencing check got no answer; guarded writes stay fenced {}", self.place().describe());
                    (self.place(), RETRY.min(recheck))
                }
            };
            let before = std::mem::replace(&mut *self.place.write().unwrap_or_else(PoisonError::into_inner), place);
            let now = self.place();
            if now != before {
                match &now {
                    Where::Apiserver { user, .. } => {
                        tracing::info!(%user, "guarded writes are fenced {}", now.describe());
                    }
                    _ => tracing::warn!("guarded writes are fenced {}", now.describe()),
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(next) => {}
                () = self.recheck.notified() => {}
            }
        }
    }

    /// Whether both policies deny, and this daemon may impersonate itself with a claim: its user and groups.
    async fn check(&self) -> Result<(String, Vec<String>), CheckError> {
        for name in POLICIES {
            let binding = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| CheckError::Read("Binding", name, e))?
                .ok_or(CheckError::NotInstalled("Binding", name))?;
            let actions = binding.spec.validation_actions;
            if !actions.iter().any(|a| a == "Deny") {
                return Err(CheckError::NotDenying(name, actions));
            }
            Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| CheckError::Read("", name, e))?
                .ok_or(CheckError::NotInstalled("", name))?;
        }
        let me = self.review(Vec::new()).await.map_err(CheckError::WhoAmI)?;
        let user = me.username.unwrap_or_default();
        let groups: Vec<String> =
            me.groups.unwrap_or_default().into_iter().filter(|g| !IMPLIED_GROUPS.contains(&g.as_str())).collect();
        // The same review, as the writes will go: proves the grants, and that the extra arrives.
        let probe = Claim { namespace: "probe".into(), lease: "probe".into(), term: 1 };
        let seen = self.review(impersonation(&user, &groups, &probe)).await.map_err(CheckError::Impersonate)?;
        let carried = seen.extra.as_ref().and_then(|extra| extra.get(EXTRA)).is_some_and(|v| v == &[probe.to_string()]);
        if !carried {
            return Err(CheckError::ExtraDropped);
        }
        Ok((user, groups))
    }

    /// A SelfSubjectReview sent with `headers`: who the apiserver takes the request's sender to be.
    async fn review(&self, headers: Vec<(HeaderName, HeaderValue)>) -> Result<UserInfo, kube::Error> {
        let review = SelfSubjectReview { metadata: ObjectMeta::default(), status: None };
        let body = serde_json::to_vec(&review).map_err(kube::Error::SerdeError)?;
        let mut request = Request::new("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .create(&PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        request.headers_mut().extend(headers);
        let answer: SelfSubjectReview = self.client.request(request).await?;
        Ok(answer.status.and_then(|s| s.user_info).unwrap_or_default())
    }
}

/// Whether an apiserver refusal is one of the policies' (a guarded write whose term is stale): its message.
pub(crate) fn refusal(error: &kube::Error) -> Option<String> {
    let kube::Error::Api(status) = error else { return None };
    if !POLICIES.iter().any(|name| status.message.contains(&format!("ValidatingAdmissionPolicy '{name}'"))) {
        return None;
    }
    let why = status.message.split_once("denied request: ").map_or(status.message.as_str(), |(_, why)| why);
    Some(why.to_owned())
}

/// Whether an apiserver refusal says this daemon may not impersonate (its grants changed since the check).
pub(crate) fn impersonation_refused(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403 && status.message.contains("cannot impersonate"))
}

/// The impersonation headers: `user` in `groups`, with `claim` as the extra.
fn impersonation(user: &str, groups: &[String], claim: &Claim) -> Vec<(HeaderName, HeaderValue)> {
    let header = |v: &str| HeaderValue::from_str(v).ok();
    let mut headers = Vec::new();
    if let Some(user) = header(user) {
        headers.push((HeaderName::from_static("impersonate-user"), user));
    }
    // A ServiceAccount's groups are implied by its name; naming them would need grants to impersonate them.
    if !user.starts_with("system:serviceaccount:") {
        for group in groups.iter().filter_map(|g| header(g)) {
            headers.push((HeaderName::from_static("impersonate-group"), group));
        }
    }
    if let Some(value) = header(&claim.to_string()) {
        headers.push((HeaderName::from_static(EXTRA_HEADER), value));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(headers: &[(HeaderName, HeaderValue)]) -> Vec<(String, String)> {
        headers.iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap_or_default().to_owned())).collect()
    }

    #[test]
    fn a_claim_goes_as_this_daemon_with_the_extra() {
        let claim = Claim { namespace: "ns".into(), lease: "e".into(), term: 7 };
        let sa = impersonation("system:serviceaccount:ns:app", &["system:serviceaccounts".into()], &claim);
        assert_eq!(
            names(&sa),
            [
                ("impersonate-user".into(), "system:serviceaccount:ns:app".into()),
                ("impersonate-extra-consistd.io%2ffence".into(), "ns/e/7".into()),
            ],
            "a ServiceAccount's groups are implied"
        );
        let admin = impersonation("admin", &["system:masters".into()], &claim);
        assert!(names(&admin).contains(&("impersonate-group".into(), "system:masters".into())));
    }

    #[test]
    fn only_this_policys_refusal_counts_as_fenced() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status { code, message: message.to_owned(), ..Default::default() }))
        };
        let fenced = api(
            403,
            "configmaps \"x\" is forbidden: ValidatingAdmissionPolicy 'consistd-fence' with binding \
             'consistd-fence' denied request: election ns/e is in term 2, and this write was guarded by term 1",
        );
        assert_eq!(
            refusal(&fenced).as_deref(),
            Some("election ns/e is in term 2, and this write was guarded by term 1")
        );
        assert_eq!(refusal(&api(403, "configmaps \"x\" is forbidden: User \"u\" cannot patch")), None);
        assert!(impersonation_refused(&api(403, "users \"u\" is forbidden: User \"v\" cannot impersonate resource")));
    }

    /// A Fencing in `mode` whose checks never get an answer (no apiserver in unit tests), placed at `place`.
    fn fencing(mode: FencingMode, place: Where) -> Arc<Fencing> {
        let unanswered = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<http_body_util::Empty<bytes::Bytes>>, _>(std::io::Error::other("no apiserver here"))
        });
        let config = consistd_core::config::Setter::new(FencingConfig { mode, ..FencingConfig::default() }).1;
        let f = Fencing::new(Client::new(unanswered, "default"), config, Metrics::new());
        *f.place.write().unwrap_or_else(PoisonError::into_inner) = place;
        f
    }

    #[tokio::test]
    async fn the_apiserver_fences_every_write_but_a_create_it_cannot_see_and_require_refuses_that() {
        let claim = Claim { namespace: "ns".into(), lease: "e".into(), term: 3 };
        let at_apiserver = Where::Apiserver { user: "u".into(), groups: vec![] };
        let auto = fencing(FencingMode::Auto, at_apiserver.clone());
        for (namespace, create) in [("ns", false), ("other", false), ("", false), ("ns", true)] {
            let fenced = auto.fence(&claim, namespace, create).expect("fenced");
            assert_eq!(fenced.by, FencedBy::Apiserver, "{namespace:?} create={create}: the token or the Lease");
            assert!(fenced.claims());
            assert!(names(&fenced.headers).contains(&(EXTRA_HEADER.into(), "ns/e/3".into())));
        }
        let other = auto.fence(&claim, "other", true).expect("sent");
        assert_eq!(other.by, FencedBy::Daemon, "a create: the policy reads the Lease from the object's namespace");
        assert!(other.claims(), "the claim still rides along");
        assert_eq!(auto.fence(&claim, "", true).expect("sent").by, FencedBy::Daemon, "a cluster-scoped create");
        let unknown = fencing(FencingMode::Auto, Where::Unknown).fence(&claim, "ns", false).expect("sent");
        assert_eq!(unknown.by, FencedBy::Daemon);
        assert!(!unknown.claims(), "no claim, so no token either, until the cluster has been asked");

        let require = fencing(FencingMode::Require, at_apiserver);
        assert_eq!(require.fence(&claim, "other", false).expect("fenced").by, FencedBy::Apiserver);
        assert_eq!(require.fence(&claim, "", false).expect("fenced").by, FencedBy::Apiserver);
        let why = require.fence(&claim, "other", true).expect_err("refused");
        assert!(why.contains("namespace other, the election's Lease in ns"), "{why}");
        assert!(require.fence(&claim, "", true).expect_err("refused").contains("cluster-scoped"));
        let local = fencing(FencingMode::Require, Where::Local("the policy is not installed".into()));
        assert!(local.fence(&claim, "ns", false).expect_err("refused").contains("the policy is not installed"));
        let text = local.metrics.encode_for(None).1;
        assert!(text.contains("consistd_guarded_writes_total{fence=\"refused\"} 1"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_gets_no_answer_leaves_the_fence_where_it_was() {
        let at_apiserver = Where::Apiserver { user: "u".into(), groups: vec![] };
        for place in [at_apiserver, Where::Unknown, Where::Local("not installed".into())] {
            let f = fencing(FencingMode::Auto, place.clone());
            // Several checks, each failing to reach the apiserver.
            tokio::select! {
                () = f.clone().run(CancellationToken::new()) => panic!("run ended without shutdown"),
                () = tokio::time::sleep(RETRY * 3) => {}
            }
            assert_eq!(f.place(), place);
        }
    }

    /// A client of an apiserver with no fencing policy installed, whose first watch of the consistd-fence-object
    /// binding shows it created: (the client, checks made so far, requests so far).
    fn installed_while_watched() -> (Client, Arc<std::sync::atomic::AtomicUsize>, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

        use http_body_util::{BodyExt, Full, StreamBody};

        let (checks, requests, shown) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let counters = (checks.clone(), requests.clone());
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (checks, requests, shown) = (counters.0.clone(), counters.1.clone(), shown.clone());
            async move {
                requests.fetch_add(1, SeqCst);
                let uri = request.uri().to_string();
                let json = |status: u16, body: String| {
                    let body = Full::new(bytes::Bytes::from(body)).boxed();
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder().status(status).body(body).expect("response"),
                    )
                };
                if uri.contains("watch=true") {
                    let binding = uri.contains("validatingadmissionpolicybindings")
                        && uri.contains("consistd-fence-object")
                        && !shown.swap(true, SeqCst);
                    if binding {
                        let event = serde_json::json!({ "type": "ADDED", "object": {
                            "apiVersion": "admissionregistration.k8s.io/v1",
                            "kind": "ValidatingAdmissionPolicyBinding",
                            "metadata": { "name": OBJECT_POLICY, "resourceVersion": "2" },
                            "spec": { "policyName": OBJECT_POLICY, "validationActions": ["Deny"] },
                        }});
                        return json(200, format!("{event}\n"));
                    }
                    let quiet = futures::stream::pending::<Result<hyper::body::Frame<bytes::Bytes>, _>>();
                    return Ok(http::Response::new(StreamBody::new(quiet).boxed()));
                }
                if uri.contains("fieldSelector") {
                    return json(
                        200,
                        r#"{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#.into(),
                    );
                }
                if uri.ends_with(&format!("validatingadmissionpolicybindings/{POLICY}")) {
                    checks.fetch_add(1, SeqCst);
                }
                json(
                    404,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#.into(),
                )
            }
        });
        (Client::new(service, "default"), checks, requests)
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_installed_is_seen_by_its_watch_and_idle_the_fence_asks_nothing_more() {
        use std::sync::atomic::Ordering::SeqCst;

        let (apiserver, checks, requests) = installed_while_watched();
        let config = consistd_core::config::Setter::new(FencingConfig::default()).1;
        let f = Fencing::new(apiserver, config, Metrics::new());
        let running = f.clone().run(CancellationToken::new());
        tokio::select! {
            () = running => panic!("run ended without shutdown"),
            () = tokio::time::sleep(Duration::from_secs(20 * 60)) => {}
        }
        assert_eq!(checks.load(SeqCst), 2, "the check at start, and the one the watch asked for");
        assert!(matches!(f.place(), Where::Local(_)), "{:?}", f.place());
        // Four lists, four watches, one resumed after the event, and two checks of one GET each.
        assert!(requests.load(SeqCst) <= 11, "idle for 20 minutes, the fence made {} requests", requests.load(SeqCst));
    }

    #[test]
    fn each_place_says_where_writes_are_fenced() {
        assert!(Where::Apiserver { user: "u".into(), groups: vec![] }.describe().contains(POLICY));
        assert!(Where::Local("why".into()).describe().ends_with(": why"));
    }
}
