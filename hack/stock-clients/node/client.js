// Proves stock @grpc/grpc-js (unix: target, insecure credentials, default channel options) can call consistd.
'use strict';

// Usage: node client.js SOCKET_PATH   (node_modules from NODE_PATH: hack/stock-clients.sh installs them
// into target/stock-clients/node)
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const DEADLINE_MS = 30_000;
const repo = path.resolve(__dirname, '../../..');

const definition = protoLoader.loadSync(
  ['consistd/v1/objects.proto', 'consistd/v1/watch.proto', 'health.proto'],
  { includeDirs: [path.join(repo, 'proto'), __dirname], enums: String },
);
const proto = grpc.loadPackageDefinition(definition);

const deadline = () => new Date(Date.now() + DEADLINE_MS);

function health(target, credentials) {
  const client = new proto.grpc.health.v1.Health(target, credentials);
  return new Promise((resolve, reject) => {
    client.check({ service: '' }, { deadline: deadline() }, (err, response) => {
      client.close();
      if (err) return reject(err);
      if (response.status !== 'SERVING') return reject(new Error(`status ${response.status}, want SERVING`));
      resolve(response.status);
    });
  });
}

function listNamespaces(target, credentials) {
  const client = new proto.consistd.v1.ObjectsService(target, credentials);
  return new Promise((resolve, reject) => {
    client.list({ resource: 'namespaces' }, { deadline: deadline() }, (err, response) => {
      client.close();
      if (err) return reject(err);
      if (response.objects.length === 0) return reject(new Error('no namespaces listed'));
      resolve(`${response.objects.length} items (${response.objects.map((o) => o.name).join(', ')})`);
    });
  });
}

function subscribeUntilSynced(target, credentials) {
  const client = new proto.consistd.v1.WatchService(target, credentials);
  return new Promise((resolve, reject) => {
    const call = client.subscribe({ resource: 'namespaces', mode: 'DELIVERY_MODE_RAW' }, { deadline: deadline() });
    let before = 0;
    let synced = false;
    call.on('data', (event) => {
      if (synced) return;
      if (event.type === 'EVENT_TYPE_SYNCED') {
        synced = true;
        call.cancel();
        resolve(`SYNCED after ${before} events, then cancelled`);
        return;
      }
      before += 1;
    });
    call.on('error', (err) => {
      client.close();
      // Our own cancel ends the call with CANCELLED; anything else is a failure.
      if (!(synced && err.code === grpc.status.CANCELLED)) reject(err);
    });
    call.on('end', () => {
      client.close();
      if (!synced) reject(new Error(`stream ended after ${before} events without SYNCED`));
    });
  });
}

async function main() {
  if (process.argv.length !== 3) {
    console.error('usage: node client.js SOCKET_PATH');
    return 2;
  }
  const target = `unix:${process.argv[2]}`;
  const label = `grpc-js ${target}`;
  const credentials = grpc.credentials.createInsecure();
  let ok = true;
  for (const [name, call] of [
    ['Health/Check', health],
    ['ObjectsService/List', listNamespaces],
    ['WatchService/Subscribe', subscribeUntilSynced],
  ]) {
    try {
      console.log(`${label}: ${name} ${await call(target, credentials)}`);
    } catch (err) {
      const why = err.code !== undefined ? `${grpc.status[err.code]}: ${err.details}` : err.message;
      console.error(`${label}: ${name} FAILED: ${why}`);
      ok = false;
    }
  }
  return ok ? 0 : 1;
}

main().then((code) => process.exit(code));
