"""The Kopf side of the Kopf comparison (daemon/benches/kopf.rs): a handler on changes of `data.value` of the
ConfigMaps labelled bench.consistd.io/kopf=true, which records each execution, works BENCH_HANDLER_MS (an
asyncio sleep) and patches the value it handled back into the annotation bench.consistd.io/handled. Kopf
keeps its own record of what it handled (its last-handled-configuration annotation) and waits for its own
patch's version (persistence.consistency_timeout) before it runs the handler again.

    kopf run --standalone --namespace NS kopf_operator.py

Environment: BENCH_EXECUTIONS, the file each execution is appended to as one JSON line {name, value, at}
(at: wall-clock seconds); BENCH_PASSES, the file each pass (a call of the handler) is appended to as one JSON
line {name, value, at, executed}; BENCH_HANDLER_MS, how long the handler works (default 0).

Kopf calls a field handler only when the field changed since the state it last handled (its
last-handled-configuration annotation), so every pass executes: passes equal executions on this side, and the
events Kopf looks at and lets go without a call are not passes here.
"""

import asyncio
import json
import os
import time

import kopf

HANDLED = "bench.consistd.io/handled"
WORK = int(os.environ.get("BENCH_HANDLER_MS", "0")) / 1000
executions = open(os.environ["BENCH_EXECUTIONS"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)
passes = open(os.environ["BENCH_PASSES"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)


@kopf.on.field("configmaps", field="data.value", labels={"bench.consistd.io/kopf": "true"})
async def changed(name: str, new: str, patch: kopf.Patch, **_: object) -> None:
    at = time.time()
    # A call is a pass, and always an execution: Kopf calls only on a change of data.value (see the top).
    passes.write(json.dumps({"name": name, "value": new, "at": at, "executed": True}) + "\n")
    executions.write(json.dumps({"name": name, "value": new, "at": at}) + "\n")
    await asyncio.sleep(WORK)
    patch.metadata.annotations[HANDLED] = new
