//! The daemon's life: `build` connects to Kubernetes, claims the sockets and wires every part;
//! `Serving::serve` serves (applying config file changes) until SIGTERM or SIGINT, drains in-flight
//! calls within the grace period, stops every task, then removes the sockets.

use std::{sync::Arc, time::Duration};

use consistd_cluster::{
    client::{self, ApiContact, ClusterError},
    fencing::Fencing,
    leadership::{Announce, Leadership, rollcall::Reacher},
    objects::Objects,
    reconcile::Reconciler,
    watch::Hub,
};
use consistd_core::{
    config::{Config, Environment, Live},
    tasks::Tasks,
    versions::Versions,
};
use consistd_messages::{
    inbox::Inbox,
    outbox::{self, Members, Outbox},
    rollout::{self, Rollout, barrier::Barrier},
    store::{OpenError, Store, StoreError, StoredTimers},
    transport::{PeerReacher, PeerTls, TlsError, Transport},
};
use consistd_observe::metrics::Metrics;
use consistd_server::{
    admin::{self, AdminListener},
    api::{self, ApiError, Services},
    health::{self, Health},
    peer::{self, PeerError},
    socket::{self, SocketError},
};
use tokio::{
    net::TcpListener,
    signal::unix::{Signal, SignalKind, signal},
    task::JoinHandle,
};

use crate::reload::{ConfigSource, Elections, Reloader, Tunables};

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No Kubernetes client.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A socket could not be claimed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The gRPC server failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The message store could not be opened.
    #[error(transparent)]
    Store(#[from] OpenError),
    /// The stored outbox or inbox could not be read.
    #[error("load stored messages")]
    Load(#[source] StoreError),
    /// The peer server could not be set up.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// `admin.listen` could not be bound.
    #[error("listen for admin HTTP on {addr}")]
    AdminListen {
        /// The `admin.listen` address.
        addr: std::net::SocketAddr,
        /// The operating system's error (e.g. the address is in use).
        #[source]
        source: std::io::Error,
    },
    /// The peer TLS files could not be read.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// An election from the config could not be started.
    #[error("start configured election")]
    Election(#[source] consistd_cluster::leadership::LeadershipError),
    /// Signal handlers could not be installed.
    #[error("install signal handlers")]
    Signal(#[source] std::io::Error),
    /// The gRPC server task panicked.
    #[error("gRPC server task failed")]
    Join(#[source] tokio::task::JoinError),
}

/// Runs the daemon on `config`, which came from `source`, until a termination signal, then shuts it down
/// gracefully.
pub async fn run(config: Config, env: &Environment, source: ConfigSource) -> Result<(), RunError> {
    let signals = Signals::install()?;
    build(config, env, source).await?.serve(signals).await
}

/// SIGTERM and SIGINT, listened for before anything starts so neither is missed.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    fn install() -> Result<Self, RunError> {
        Ok(Self {
            terminate: signal(SignalKind::terminate()).map_err(RunError::Signal)?,
            interrupt: signal(SignalKind::interrupt()).map_err(RunError::Signal)?,
        })
    }

    /// Resolves at the first of them, logging which.
    async fn received(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
            _ = self.interrupt.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        }
    }
}

/// The daemon built and serving: what its shutdown stops, in order.
struct Serving {
    /// Every task the daemon started.
    tasks: Tasks,
    /// The gRPC and peer servers and their per-call tasks: stopped first.
    serving: Tasks,
    health: Health,
    grpc: JoinHandle<Result<(), ApiError>>,
    reloading: JoinHandle<()>,
    leadership: Arc<Leadership>,
    outbox: Outbox,
    peer_server: Option<JoinHandle<Result<(), PeerError>>>,
    grace: Live<Duration>,
    /// The sockets, removed when these drop.
    sockets: (socket::SocketGuard, socket::SocketGuard),
}

/// Connects to Kubernetes, claims the sockets, opens the store, wires every part and starts serving.
async fn build(config: Config, env: &Environment, source: ConfigSource) -> Result<Serving, RunError> {
    // Every answer the client gets is noted here: the jobs' own traffic is readiness's evidence.
    let contact = ApiContact::default();
    let (client, apiserver_url) = client::connect(&contact, env).await?;
    let (listener, socket_guard) = socket::bind(&config.socket.path, config.socket.mode.0, config.socket.group_id)?;
    let (admin_listener, admin_guard) = socket::bind(&config.admin.socket, config.admin.mode.0, config.admin.group_id)?;
    let admin_tcp = match config.admin.listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| RunError::AdminListen { addr, source })?),
        None => None,
    };

    let health = Health::new(config.socket.path.clone(), apiserver_url.clone(), contact, config.health.clone());
    let metrics = Metrics::new();
    // Every task the daemon starts is one of `tasks`: stopping it ends them all, and shutdown waits for
    // them. `serving` is stopped first, on SIGTERM: the gRPC and peer servers stop accepting and end
    // their streams; `tasks` stops the rest once in-flight calls are done, so /readyz answers "not
    // ready" while draining.
    let tasks = Tasks::new();
    let serving = tasks.child();

    let identity = config.identity(env);
    let namespace = config.namespace(env);
    // What a reload may change; each part reads its setting live.
    let tunables = Tunables::new(&config);
    let budget = config.watch_budget(env);
    tracing::info!(bytes = budget, "memory budget of the watches (watch.maxCacheBytes)");
    let hub = Hub::new(client.clone(), config.watch.clone(), budget, metrics.clone(), &tasks);
    let fencing = Fencing::new(client.clone(), tunables.fencing.live(), metrics.clone());
    health.attach_fencing(fencing.clone());
    tasks.spawn(fencing.clone().run(tasks.signal().clone()));
    let objects = Objects::new(client.clone(), hub.clone(), tunables.consistency_timeout.live(), fencing, &identity);
    let tls = config.peer.tls.as_ref().map(PeerTls::load).transpose()?;
    if let Some(tls) = &tls {
        tls.spawn_watch(&tasks);
    }
    let transport =
        config.peer.transport_configured().then(|| Transport { tls: tls.clone(), identity: identity.clone() });
    // A leader calls its group's roll over the peer transport, so idle members need not renew their Leases.
    let reacher = transport.clone().map(|t| Arc::new(PeerReacher::new(t)) as Arc<dyn Reacher>);
    let announce =
        config.advertise(env).map(|address| Announce { address, ttl: tunables.membership_ttl.live(), reacher });
    let leadership = Leadership::new(
        client.clone(),
        hub.clone(),
        identity.clone(),
        namespace.clone(),
        announce,
        metrics.clone(),
        &tasks,
    );
    health.attach(hub.clone(), leadership.clone());

    let store = Store::open(&config.store.dir)?;
    health.attach_store(store.clone());
    let (interval, timeout) = (config.health.probe_interval, config.health.probe_timeout);
    tasks.spawn(store.clone().check(interval, timeout, tasks.signal().clone()));
    // The reconcile queues' REQUEUE times and TERMINAL marks, kept past a restart.
    let timers = Arc::new(StoredTimers::new(store.clone()));
    let inbox = Inbox::open(
        store.clone(),
        identity.clone(),
        tunables.inbox.live(),
        &[rollout::RESOURCE_PREFIX],
        metrics.clone(),
        &tasks,
    )
    .map_err(RunError::Load)?;
    let outbox = Outbox::open(
        store,
        outbox::OutboxParts {
            config: tunables.outbox.live(),
            transport: transport.clone(),
            members: Members::new(hub.clone()),
            namespace: namespace.clone(),
            metrics: metrics.clone(),
            tasks: tasks.clone(),
        },
    )
    .map_err(RunError::Load)?;
    let rollout = Rollout::new(rollout::RolloutParts {
        leadership: leadership.clone(),
        versions: Versions::new(client.clone(), &namespace),
        outbox: outbox.clone(),
        inbox: inbox.clone(),
        barrier: Barrier::new(hub.clone()),
        namespace: namespace.clone(),
        transport,
        tasks: tasks.clone(),
    });
    let peer_server = match config.peer.listen {
        Some(addr) => {
            let listener = peer::bind(addr).await?;
            tracing::info!(address = %addr, tls = tls.is_some(), "serving peers");
            let (inbox, rollout) = (inbox.clone(), rollout.clone());
            // Service endpoints name the Pod, which is this daemon even when its identity is set otherwise.
            let pod = env.var("POD_NAME").filter(|name| !name.is_empty()).map(str::to_owned);
            let parts = (rollout, leadership.clone());
            Some(tasks.spawn(peer::serve(listener, tls, (inbox, pod), parts, serving.clone())))
        }
        None => None,
    };
    health.attach_messages(outbox.clone(), inbox.clone());
    let reconciler = Reconciler::new(
        (hub.clone(), objects.clone()),
        leadership.clone(),
        metrics.clone(),
        (tunables.consistency_timeout.live(), tunables.membership_ttl.live()),
        config.watch.linger,
        timers,
        &tasks,
    );
    health.attach_reconciler(reconciler.clone());
    let services = Services {
        hub,
        objects,
        leadership: leadership.clone(),
        outbox: outbox.clone(),
        inbox,
        namespace,
        rollout,
        reconciler,
        allowlist: tunables.allowlist.live(),
        access: tunables.access.live(),
        metrics: metrics.clone(),
    };
    // Elections from the config: campaigned for from boot until shutdown, or until a reload removes them.
    let mut elections = Elections::new(leadership.clone());
    elections.sync(&config.elections).map_err(RunError::Election)?;
    let grace = tunables.grace_period.live();
    let (socket_path, admin_socket) = (config.socket.path.clone(), config.admin.socket.clone());
    let reloader = Reloader::new(config, (source, env.clone()), tunables, elections, (health.clone(), metrics.clone()));
    let reloading = tasks.spawn(reloader.run(serving.signal().clone()));
    tasks.spawn(health::probe(client, health.clone(), metrics.clone(), tasks.signal().clone()));
    tasks.spawn(admin::serve(AdminListener::Unix(admin_listener), health.clone(), metrics.clone(), tasks.clone()));
    if let Some(listener) = admin_tcp {
        tracing::info!(address = ?listener.local_addr().ok(), "serving /metrics, /healthz and /readyz over TCP");
        tasks.spawn(admin::serve(AdminListener::Tcp(listener), health.clone(), metrics, tasks.clone()));
    }
    let grpc = tasks.spawn(api::serve(listener, services, serving.clone()));
    health.set_serving(true);
    tracing::info!(
        socket = %socket_path.display(),
        admin_socket = %admin_socket.display(),
        apiserver = %apiserver_url,
        version = env!("CARGO_PKG_VERSION"),
        "consistd serving"
    );
    Ok(Serving {
        tasks,
        serving,
        health,
        grpc,
        reloading,
        leadership,
        outbox,
        peer_server,
        grace,
        sockets: (socket_guard, admin_guard),
    })
}

impl Serving {
    /// Serves until a signal (or the gRPC server fails), then shuts down: stops serving, releases held
    /// Leases, drains in-flight calls, lets messages not yet ACKed leave, stops every other task, and
    /// removes the sockets; each step bounded by the grace period.
    async fn serve(mut self, mut signals: Signals) -> Result<(), RunError> {
        let early_exit = tokio::select! {
            () = signals.received() => None,
            joined = &mut self.grpc => Some(joined),
        };
        self.health.set_serving(false);
        // Stops the reloader too, which ends the config's campaigns: held Leases are released first, so
        // followers take over within a retry period.
        self.serving.signal_stop();
        let _ = (&mut self.reloading).await;
        let grace = self.grace.get();
        self.leadership.shutdown(grace).await;

        let result = match early_exit {
            Some(joined) => flatten(joined),
            None => drain(&mut self.grpc, grace).await,
        };
        // The apps have stopped (a native sidecar gets SIGTERM after them): their last sends may leave now.
        let held = self.outbox.settle(grace).await;
        if held > 0 {
            tracing::warn!(
                held,
                "stopping with messages not yet ACKed: they are resent when consistd starts again on this store, \
                 and lost if the pod is replaced (its store emptyDir goes with it)"
            );
        }
        self.tasks.signal_stop();
        if let Some(task) = self.peer_server.take() {
            match tokio::time::timeout(grace, task).await {
                Ok(Ok(Err(error))) => {
                    tracing::warn!(error = %consistd_core::error::chain(&error), "peer server failed");
                }
                Ok(_) => {}
                Err(_) => tracing::warn!("peer connections still open after the grace period; closing them"),
            }
        }
        // Whatever is left: watches, links, probes, the admin endpoint's connections.
        let left = self.tasks.wait(grace).await;
        if left > 0 {
            tracing::warn!(tasks = left, grace_period = ?grace, "tasks still running after the grace period; leaving them");
        }
        drop(self.sockets);
        if result.is_ok() {
            tracing::info!("consistd stopped");
        }
        result
    }
}

/// Waits for in-flight calls to finish, cutting them off when the grace period is over.
async fn drain(grpc: &mut JoinHandle<Result<(), ApiError>>, grace: Duration) -> Result<(), RunError> {
    match tokio::time::timeout(grace, &mut *grpc).await {
        Ok(joined) => flatten(joined),
        Err(_) => {
            tracing::warn!(grace_period = ?grace, "grace period over; cutting off calls still in flight");
            grpc.abort();
            Ok(())
        }
    }
}

fn flatten(joined: Result<Result<(), ApiError>, tokio::task::JoinError>) -> Result<(), RunError> {
    joined.map_err(RunError::Join)?.map_err(RunError::from)
}
