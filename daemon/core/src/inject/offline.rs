//! `consistd inject -f FILE`: the same injection as the webhook, applied to manifests before they are
//! applied: Pods, and the pod templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and
//! CronJobs, in a multi-document YAML file or a `List`. Other documents pass through unchanged.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::Deserialize;
use serde_json::Value;

use super::sidecar::{self, BadAnnotation, Defaults, INJECT_LABEL, Injection};

/// Why a file could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// A document is not YAML.
    #[error("parse document {index}")]
    Parse {
        /// Its position in the file, from 0.
        index: usize,
        /// The parser's error.
        #[source]
        source: serde_yaml::Error,
    },
    /// A workload's pod template is not a valid pod template.
    #[error("read the pod template of {kind} {name:?}")]
    Template {
        /// The workload's kind.
        kind: String,
        /// Its name.
        name: String,
        /// Why it could not be read.
        #[source]
        source: serde_json::Error,
    },
    /// A pod asks for a setting that cannot be used.
    #[error("{kind} {name:?}")]
    Annotation {
        /// The workload's kind.
        kind: String,
        /// Its name.
        name: String,
        /// The annotation and why.
        #[source]
        source: BadAnnotation,
    },
    /// The result could not be written as YAML.
    #[error("write YAML")]
    Write(#[source] serde_yaml::Error),
}

/// Rewrites every workload in `yaml`; returns the new YAML and how many pod templates got the sidecar.
/// A template labelled `consistd.io/inject: "false"` is skipped.
pub fn inject_documents(yaml: &str, defaults: &Defaults) -> Result<(String, usize), OfflineError> {
    let mut out = Vec::new();
    let mut injected = 0;
    for (index, document) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let mut value = Value::deserialize(document).map_err(|source| OfflineError::Parse { index, source })?;
        if value.is_null() {
            continue;
        }
        injected += inject_object(&mut value, defaults)?;
        out.push(serde_yaml::to_string(&value).map_err(OfflineError::Write)?);
    }
    Ok((out.join("---\n"), injected))
}

/// Injects into one object (or each item of a `List`); returns how many templates got the sidecar.
fn inject_object(object: &mut Value, defaults: &Defaults) -> Result<usize, OfflineError> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    if kind == "List" {
        let mut injected = 0;
        if let Some(items) = object["items"].as_array_mut() {
            for item in items {
                injected += inject_object(item, defaults)?;
            }
        }
        return Ok(injected);
    }
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let template = match kind.as_str() {
        // A Pod is its own template: metadata and spec at the top.
        "Pod" => object,
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => &mut object["spec"]["template"],
        "CronJob" => &mut object["spec"]["jobTemplate"]["spec"]["template"],
        _ => return Ok(0),
    };
    let mut pod: PodTemplateSpec = serde_json::from_value(template.clone())
        .map_err(|source| OfflineError::Template { kind: kind.clone(), name: name.clone(), source })?;
    let opted_out = pod
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(INJECT_LABEL))
        .is_some_and(|v| v == "false");
    if opted_out {
        return Ok(0);
    }
    let mut meta = pod.metadata.take().unwrap_or_default();
    let mut spec = pod.spec.take().unwrap_or_default();
    let outcome = sidecar::inject(&mut meta, &mut spec, defaults).map_err(|source| OfflineError::Annotation {
        kind: kind.clone(),
        name: name.clone(),
        source,
    })?;
    if outcome == Injection::AlreadyPresent {
        return Ok(0);
    }
    let write = |field: &mut Value, value: Result<Value, serde_json::Error>| {
        value.map(|v| *field = v).map_err(|source| OfflineError::Template {
            kind: kind.clone(),
            name: name.clone(),
            source,
        })
    };
    write(&mut template["metadata"], serde_json::to_value(&meta))?;
    write(&mut template["spec"], serde_json::to_value(&spec))?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKLOADS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: app, image: "app:1"}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 0 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: job, image: "job:1"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: skipped
  labels: {consistd.io/inject: "false"}
spec:
  containers: [{name: app, image: "app:1"}]
"#;

    fn init_names(doc: &Value, template: &str) -> Vec<String> {
        let template = doc.pointer(template).unwrap_or(&Value::Null);
        template["spec"]["initContainers"]
            .as_array()
            .map(|list| list.iter().map(|c| c["name"].as_str().unwrap_or_default().to_owned()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_workload_kind_gets_the_sidecar_and_the_rest_passes_through() {
        let (yaml, injected) = inject_documents(WORKLOADS, &Defaults::default()).expect("inject");
        assert_eq!(injected, 2);
        let docs: Vec<Value> =
            serde_yaml::Deserializer::from_str(&yaml).map(|d| Value::deserialize(d).expect("output is YAML")).collect();
        assert_eq!(docs.len(), 4);
        assert_eq!(init_names(&docs[0], "/spec/template"), ["consistd"]);
        assert_eq!(docs[1]["kind"], "Service");
        assert_eq!(docs[1]["spec"], serde_json::json!({"ports": [{"port": 80}]}), "untouched");
        assert_eq!(init_names(&docs[2], "/spec/jobTemplate/spec/template"), ["consistd"]);
        assert!(init_names(&docs[3], "").is_empty(), "opted out");

        let (again, injected_again) = inject_documents(&yaml, &Defaults::default()).expect("inject again");
        assert_eq!((again, injected_again), (yaml, 0), "running it twice changes nothing");
    }

    #[test]
    fn a_bad_annotation_names_the_workload_and_the_annotation() {
        let yaml = "kind: Pod\nmetadata:\n  name: p\n  annotations: {consistd.io/peer-port: \"x\"}\nspec:\n  containers: [{name: a}]\n";
        let error = inject_documents(yaml, &Defaults::default()).expect_err("refused");
        assert_eq!(
            crate::error::chain(&error),
            "Pod \"p\": annotation consistd.io/peer-port: \"x\" is not a port between 1 and 65535"
        );
    }
}
