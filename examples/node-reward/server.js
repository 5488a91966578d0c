// A meshrl RewardService in Node.js: proof that the contract needs no Python.
//
// It loads protos/meshrl/v1/*.proto at run time (no generated code), answers
// grpc.health.v1 checks, and scores the bundled arithmetic task: 1.0 when the
// first line of response_text is exactly reward_model.ground_truth.
//
//   node server.js [--port 0] [--protos ../../protos]
//
// prints "listening on 127.0.0.1:PORT" once it serves.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const protos = path.resolve(arg('protos', path.join(__dirname, '..', '..', 'protos')));
const definition = protoLoader.loadSync('meshrl/v1/reward.proto', {
  includeDirs: [protos], keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true,
});
const meshrl = grpc.loadPackageDefinition(definition).meshrl.v1;

// A meshrl.v1.Value as a plain JavaScript value.
function fromValue(v) {
  switch (v.kind) {
    case 'null_value': return null;
    case 'list_value': return (v.list_value.values || []).map(fromValue);
    case 'map_value': {
      const out = {};
      for (const [k, item] of Object.entries(v.map_value.fields || {})) out[k] = fromValue(item);
      return out;
    }
    default: return v[v.kind];
  }
}

// A meshrl.v1.Column's values: one typed list (strings, ints, floats, bools) or Values.
function fromColumn(col) {
  for (const typed of ['strings', 'ints', 'floats', 'bools']) {
    if (col[typed] && col[typed].length) return col[typed];
  }
  return (col.values || []).map(fromValue);
}

// The rows of a streamed batch, in order; throws on gaps (see docs/wire.md).
function column(parts, name) {
  const out = [];
  for (const part of parts) {
    const data = part.data || {};
    if ((data.row_offset || 0) !== out.length) {
      throw new Error(`part holds rows from ${data.row_offset}, expected ${out.length}`);
    }
    const col = (data.non_tensors || {})[name];
    if (!col) throw new Error(`column '${name}' is missing`);
    out.push(...fromColumn(col));
  }
  const total = (parts[0] && parts[0].data && parts[0].data.total_rows) || out.length;
  if (out.length !== total) throw new Error(`stream ended after ${out.length} of ${total} rows`);
  return out;
}

function scoreArithmetic(response, groundTruth) {
  const firstLine = String(response).trim().split('\n')[0].trim();
  return firstLine === String(groundTruth).trim() ? 1.0 : 0.0;
}

function score(call) {
  const parts = [];
  call.on('data', (msg) => parts.push(msg));
  call.on('error', () => {});
  call.on('end', () => {
    let responses, rewardModels;
    try {
      responses = column(parts, 'response_text');
      rewardModels = column(parts, 'reward_model');
    } catch (e) {
      call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: e.message });
      return;
    }
    const scores = new Float32Array(responses.length);
    responses.forEach((r, i) => { scores[i] = scoreArithmetic(r, (rewardModels[i] || {}).ground_truth); });
    const mean = scores.length ? scores.reduce((a, b) => a + b, 0) / scores.length : 0;
    call.write({
      data: {
        num_rows: scores.length,
        tensors: [{ name: 'scores', dtype: 'FLOAT32', shape: [scores.length], data: Buffer.from(scores.buffer) }],
        non_tensors: { acc: { bools: Array.from(scores, (s) => s === 1.0) } },
      },
      metrics: { 'reward/score/mean': mean },
    });
    call.end();
  });
}

function describe(call, callback) {
  callback(null, { service: 'reward', backend: 'node', model: 'arithmetic' });
}

const server = new grpc.Server();
server.addService(meshrl.RewardService.service, { Describe: describe, Score: score });
new HealthImplementation({ '': 'SERVING', 'meshrl.v1.RewardService': 'SERVING' }).addToServer(server);
server.bindAsync(`127.0.0.1:${arg('port', '0')}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) { console.error(err.message); process.exit(1); }
  console.log(`listening on 127.0.0.1:${port}`);
});
process.on('SIGTERM', () => server.tryShutdown(() => process.exit(0)));
