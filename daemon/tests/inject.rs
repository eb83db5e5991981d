//! `consistd inject`: the offline injector against golden files (tests/inject/), and manifests/base's
//! sidecar, which must be exactly what the injector adds.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde::Deserialize;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inject")
}

/// `consistd inject -f - ARGS` with `input` on standard input; its standard output and error, once it
/// succeeded.
fn run_inject(input: &str, args: &[String]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(["inject", "-f", "-"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start consistd inject");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait for consistd inject");
    assert!(out.status.success(), "consistd inject failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `consistd inject -f -` with `input` on standard input; its standard output.
fn inject(input: &str) -> String {
    String::from_utf8(run_inject(input, &[]).stdout).expect("utf-8 output")
}

/// The default image is not published: `inject -f` says so, and names the image each run used.
#[test]
fn offline_injection_names_its_image_and_warns_about_the_unpublished_default() {
    let input = std::fs::read_to_string(golden_dir().join("workloads.yaml")).expect("read workloads.yaml");
    let run = |args: &[String]| String::from_utf8(run_inject(&input, args).stderr).expect("utf-8");
    let default = run(&[]);
    assert!(default.contains("is not published yet") && default.contains("--image"), "{default}");
    let own = run(&["--image=registry.example/consistd:0.1.0".to_owned()]);
    assert!(own.contains("sidecar image registry.example/consistd:0.1.0"), "{own}");
    assert!(!own.contains("not published"), "{own}");
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml).map(|d| Value::deserialize(d).expect("YAML document")).collect()
}

#[test]
fn offline_injection_matches_the_golden_file() {
    let input = std::fs::read_to_string(golden_dir().join("workloads.yaml")).expect("read workloads.yaml");
    let output = inject(&input);
    let golden = golden_dir().join("workloads.injected.yaml");
    #[allow(clippy::disallowed_methods, reason = "a test's switch, not the daemon's configuration")]
    let regenerate = std::env::var_os("CONSISTD_REGENERATE").is_some();
    if regenerate {
        std::fs::write(&golden, &output).expect("write the golden file");
    }
    let expected =
        std::fs::read_to_string(&golden).expect("read workloads.injected.yaml (CONSISTD_REGENERATE=1 writes it)");
    assert_eq!(
        documents(&output),
        documents(&expected),
        "consistd inject -f tests/inject/workloads.yaml changed; if on purpose, run with CONSISTD_REGENERATE=1 and review the diff"
    );
    // Idempotent: injecting the injected output changes nothing.
    assert_eq!(documents(&inject(&output)), documents(&output));
}

/// Removes from a pod template what the injector adds, so only the app remains.
fn strip_sidecar(template: &mut Value) {
    let spec = &mut template["spec"];
    if let Some(init) = spec["initContainers"].as_array_mut() {
        init.retain(|c| c["name"] != "consistd");
    }
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.retain(|v| !v["name"].as_str().unwrap_or_default().starts_with("consistd-"));
    }
    for app in spec["containers"].as_array_mut().into_iter().flatten() {
        if let Some(env) = app["env"].as_array_mut() {
            env.retain(|e| e["name"] != "CONSISTD_SOCKET");
        }
        if let Some(mounts) = app["volumeMounts"].as_array_mut() {
            mounts.retain(|m| m["name"] != "consistd-socket");
        }
    }
}

#[test]
fn manifests_base_runs_the_sidecar_exactly_as_inject_adds_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/deployment.yaml");
    let base = documents(&std::fs::read_to_string(path).expect("read manifests/base/deployment.yaml")).remove(0);
    let mut app_only = base.clone();
    strip_sidecar(&mut app_only["spec"]["template"]);
    assert_ne!(app_only, base, "the base runs a sidecar to compare");

    let mut injected = documents(&inject(&serde_yaml::to_string(&app_only).expect("YAML"))).remove(0);
    let template = &mut injected["spec"]["template"];
    assert_eq!(template["metadata"]["annotations"]["consistd.io/status"], "injected");
    // The base is written by hand and needs no status annotation.
    template["metadata"].as_object_mut().expect("metadata").remove("annotations");
    assert_eq!(injected, base, "manifests/base/deployment.yaml and `consistd inject` disagree");
}

mod webhook {
    //! The webhook in the real apiserver's admission chain: it keeps its certificates in a Secret and the
    //! CA bundle in its MutatingWebhookConfiguration, renews them, injects labelled pods exactly as the
    //! offline path does, and both failure policies behave as documented.

    use std::time::Duration;

    use k8s_openapi::api::{admissionregistration::v1::MutatingWebhookConfiguration, core::v1::Pod};
    use kube::{
        Api,
        api::{DeleteParams, Patch, PatchParams, PostParams},
    };
    use serde_json::{Value, json};
    use tokio::process::{Child, Command};

    use super::{BIN, documents, inject};

    /// A pod for `ns` named `name`, labelled for injection with `label` (none: unlabelled).
    fn pod(name: &str, label: Option<&str>) -> Value {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}]}
        });
        if let Some(label) = label {
            pod["metadata"]["labels"] = json!({"consistd.io/inject": label});
        }
        pod
    }

    async fn create(api: &Api<Pod>, pod: &Value) -> Result<Pod, kube::Error> {
        let pod: Pod = serde_json::from_value(pod.clone()).expect("a Pod");
        api.create(&PostParams::default(), &pod).await
    }

    fn init_names(pod: &Pod) -> Vec<String> {
        let spec = pod.spec.as_ref().expect("spec");
        spec.init_containers.iter().flatten().map(|c| c.name.clone()).collect()
    }

    /// Grants user `user` exactly the injector's RBAC from manifests/injector/rbac.yaml, in `ns` and for the
    /// configuration `configuration` (the test's own names), and returns a kubeconfig for that user.
    async fn injector_rbac(client: &kube::Client, ns: &str, configuration: &str, user: &str) -> std::path::PathBuf {
        use kube::{
            api::DynamicObject,
            discovery::{Discovery, Scope},
        };
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/injector/rbac.yaml");
        let discovery = Discovery::new(client.clone()).run().await.expect("discover apiserver resources");
        for mut object in documents(&std::fs::read_to_string(path).expect("read manifests/injector/rbac.yaml")) {
            object["metadata"]["name"] = json!(format!("{user}"));
            if let Some(rules) = object["rules"].as_array_mut() {
                for names in rules.iter_mut().filter_map(|r| r["resourceNames"].as_array_mut()) {
                    for name in names.iter_mut().filter(|n| *n == "consistd-injector") {
                        *name = json!(configuration);
                    }
                }
            }
            if object.get("roleRef").is_some() {
                object["roleRef"]["name"] = json!(user);
                object["subjects"] = json!([{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]);
            }
            let object: DynamicObject = serde_json::from_value(object).expect("an RBAC object");
            let gvk = kube::core::GroupVersionKind::try_from(object.types.as_ref().expect("types")).expect("a kind");
            let (resource, capabilities) = discovery.resolve_gvk(&gvk).expect("served");
            let api: Api<DynamicObject> = match capabilities.scope {
                Scope::Namespaced => Api::namespaced_with(client.clone(), ns, &resource),
                Scope::Cluster => Api::all_with(client.clone(), &resource),
            };
            api.create(&PostParams::default(), &object).await.expect("create the injector's RBAC");
        }
        let dir = std::env::temp_dir().join(format!("consistd-injector-{ns}"));
        std::fs::create_dir_all(&dir).expect("a directory for the kubeconfig");
        consistd_testkit::kubeconfig_for_user(user, &dir)
    }

    fn start_injector(port: u16, ns: &str, configuration: &str, kubeconfig: &std::path::Path) -> Child {
        Command::new(BIN)
            .args([
                "inject",
                "webhook",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--namespace",
                ns,
                "--san",
                "127.0.0.1",
            ])
            .args(["--webhook-configuration", configuration, "--check-every", "1s", "--cert-validity", "15s"])
            .env("KUBECONFIG", kubeconfig)
            .kill_on_drop(true)
            .spawn()
            .expect("start consistd inject webhook")
    }

    async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(value) = check().await {
                return value;
            }
            assert!(tokio::time::Instant::now() < deadline, "{what}: not within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    #[tokio::test]
    async fn labelled_pods_are_injected_in_the_apiserver_as_offline_and_certificates_renew() {
        let client = consistd_testkit::kube_client().await;
        let ns = consistd_testkit::namespace(&client).await;
        let port = consistd_testkit::free_port();
        let name = format!("consistd-injector-{ns}");
        let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "inject.consistd.io",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate")},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {"consistd.io/inject": "true"}},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10
            }]
        }))
        .expect("a MutatingWebhookConfiguration");
        configurations.create(&PostParams::default(), &configuration).await.expect("create the configuration");
        // Exactly the RBAC manifests/injector grants: the webhook works with no more.
        let kubeconfig = injector_rbac(&client, &ns, &name, &name).await;
        let mut injector = start_injector(port, &ns, &name, &kubeconfig);

        let bundle = until("caBundle published", async || {
            let c = configurations.get(&name).await.ok()?;
            c.webhooks?.first()?.client_config.ca_bundle.clone()
        })
        .await;
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
        let secret = secrets.get("consistd-injector-tls").await.expect("the injector's Secret");
        assert_eq!(secret.data.as_ref().and_then(|d| d.get("ca.crt")), Some(&bundle), "caBundle is the Secret's CA");

        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let webhook = create(&pods, &pod("webhook", Some("true"))).await.expect("create a labelled pod");
        assert_eq!(init_names(&webhook), ["consistd"]);
        // The same pod through the offline path, labelled so the webhook skips it.
        let mut offline =
            documents(&inject(&serde_yaml::to_string(&pod("offline", Some("true"))).expect("YAML"))).remove(0);
        offline["metadata"]["labels"]["consistd.io/inject"] = json!("false");
        let offline = create(&pods, &offline).await.expect("create the offline-injected pod");
        assert_eq!(webhook.spec, offline.spec, "the webhook and the offline path agree");
        assert_eq!(webhook.metadata.annotations, offline.metadata.annotations);

        let plain = create(&pods, &pod("plain", None)).await.expect("create an unlabelled pod");
        assert!(init_names(&plain).is_empty(), "an unlabelled pod is untouched");
        let mut already = offline_value(&offline);
        already["metadata"]["name"] = json!("already");
        already["metadata"]["labels"]["consistd.io/inject"] = json!("true");
        let already = create(&pods, &already).await.expect("create an injected, labelled pod");
        assert_eq!(already.spec, offline.spec, "a pod that has the sidecar is not injected twice");
        let mut bad = pod("bad", Some("true"));
        bad["metadata"]["annotations"] = json!({"consistd.io/peer-port": "seventy"});
        let refused = create(&pods, &bad).await.expect_err("a bad annotation is refused");
        assert!(refused.to_string().contains("consistd.io/peer-port"), "{refused}");

        // A serving certificate valid 15 s is renewed with 5 s left; the new one serves.
        let first = secret.data.as_ref().and_then(|d| d.get("tls.crt")).cloned();
        until("the serving certificate renewed", async || {
            let s = secrets.get("consistd-injector-tls").await.ok()?;
            (s.data?.get("tls.crt").cloned() != first).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let renewed = create(&pods, &pod("after-renewal", Some("true"))).await.expect("create after renewal");
        assert_eq!(init_names(&renewed), ["consistd"]);

        // failurePolicy Fail: with the injector down, a labelled pod is refused; Ignore: created as is.
        injector.kill().await.expect("stop the injector");
        let refused = create(&pods, &pod("down", Some("true"))).await.expect_err("Fail refuses while down");
        assert!(refused.to_string().contains("inject.consistd.io"), "{refused}");
        let ignore = json!({"webhooks": [{"name": "inject.consistd.io", "failurePolicy": "Ignore"}]});
        configurations
            .patch(&name, &PatchParams::default(), &Patch::Strategic(ignore))
            .await
            .expect("switch to failurePolicy Ignore");
        // The apiserver reads webhook configurations through a cache: retry until it has the new policy.
        let ignored = until("failurePolicy Ignore lets a labelled pod through", async || {
            create(&pods, &pod("ignored", Some("true"))).await.ok()
        })
        .await;
        assert!(init_names(&ignored).is_empty(), "created without the sidecar");
        configurations.delete(&name, &DeleteParams::default()).await.expect("delete the configuration");
    }

    fn offline_value(pod: &Pod) -> Value {
        let mut value = serde_json::to_value(pod).expect("JSON");
        let metadata = value["metadata"].as_object_mut().expect("metadata");
        for key in ["uid", "resourceVersion", "creationTimestamp", "managedFields", "namespace"] {
            metadata.remove(key);
        }
        value.as_object_mut().expect("pod").remove("status");
        value
    }
}
