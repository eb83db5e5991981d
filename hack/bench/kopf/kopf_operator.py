"""The Kopf side of the Kopf comparison (daemon/benches/kopf.rs): a handler on changes of `data.value` of the
ConfigMaps labelled bench.consistd.io/kopf=true, which records each execution and patches the value it handled
back into the annotation bench.consistd.io/handled. Kopf keeps its own record of what it handled (its
last-handled-configuration annotation) and waits for its own patch's version (persistence.consistency_timeout).

    kopf run --standalone --namespace NS kopf_operator.py

Environment: BENCH_EXECUTIONS, the file each execution is appended to as one JSON line {name, value, at}
(at: wall-clock seconds); BENCH_CONSISTENCY_TIMEOUT, if set, Kopf's persistence.consistency_timeout (0 turns
the wait for its own patch off).
"""

import json
import os
import time

import kopf

HANDLED = "bench.consistd.io/handled"
executions = open(os.environ["BENCH_EXECUTIONS"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    timeout = os.environ.get("BENCH_CONSISTENCY_TIMEOUT")
    if timeout is not None:
        settings.persistence.consistency_timeout = float(timeout)


@kopf.on.field("configmaps", field="data.value", labels={"bench.consistd.io/kopf": "true"})
def changed(name: str, new: str, patch: kopf.Patch, **_: object) -> None:
    executions.write(json.dumps({"name": name, "value": new, "at": time.time()}) + "\n")
    patch.metadata.annotations[HANDLED] = new
