// The standard gRPC health check (grpc.health.v1.Health/Check), encoded by hand: two tiny messages.
import { BinaryReader } from "@bufbuild/protobuf/wire";
import type { Client } from "@grpc/grpc-js";
import { Metadata } from "@grpc/grpc-js";
import { toConsistdError } from "./errors.js";

/** The health service's answer: grpc.health.v1.HealthCheckResponse.ServingStatus. */
export enum ServingStatus {
  UNKNOWN = 0,
  SERVING = 1,
  NOT_SERVING = 2,
  SERVICE_UNKNOWN = 3,
}

const CHECK = "/grpc.health.v1.Health/Check";

/** Asks for the whole server's health (service ""), which encodes as an empty request. */
export function checkHealth(client: Client, deadline: Date): Promise<ServingStatus> {
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(
      CHECK,
      () => Buffer.alloc(0),
      decodeStatus,
      {},
      new Metadata(),
      { deadline },
      (error, status) => (error ? reject(toConsistdError(error)) : resolve(status ?? ServingStatus.UNKNOWN)),
    );
  });
}

/** Reads field 1 (status) of a HealthCheckResponse, skipping anything else. */
function decodeStatus(bytes: Buffer): ServingStatus {
  const reader = new BinaryReader(bytes);
  let status = ServingStatus.UNKNOWN;
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1) status = reader.int32();
    else reader.skip(wireType);
  }
  return status;
}
