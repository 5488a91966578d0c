// A meshrl EnvService in Node.js: the calculator environment without Python.
//
// It loads protos/meshrl/v1/env.proto at run time (no generated code), answers
// grpc.health.v1 checks, and plays the calculator as services/env/calculator.py
// does: <calc>EXPR</calc> (integers, + - * and parentheses) is answered with
// <result>VALUE</result>, anything else is the final answer, scored 1.0 when its
// last integer is the task's ground truth.
//
//   node server.js [--port 0] [--protos ../../protos]
//
// prints "listening on 127.0.0.1:PORT" once it serves.
'use strict';

const crypto = require('crypto');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const protos = path.resolve(arg('protos', path.join(__dirname, '..', '..', 'protos')));
const definition = protoLoader.loadSync('meshrl/v1/env.proto', {
  includeDirs: [protos], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
});
const meshrl = grpc.loadPackageDefinition(definition).meshrl.v1;
const MAX_EPISODES = 4096;
const episodes = new Map();  // episode_id -> { truth, calls }

// An integer expression of + - * and parentheses, by recursive descent (BigInt: no rounding).
function evaluate(text) {
  const tokens = text.match(/\d+|[-+*()]|\S/g) || [];
  let i = 0;
  const peek = () => tokens[i];
  function atom() {
    const t = tokens[i++];
    if (t === undefined) throw new Error('unexpected end');
    if (/^\d+$/.test(t)) return BigInt(t);
    if (t === '-') return -atom();
    if (t === '(') { const v = sum(); if (tokens[i++] !== ')') throw new Error('missing )'); return v; }
    throw new Error(`unexpected '${t}'`);
  }
  function product() { let v = atom(); while (peek() === '*') { i++; v *= atom(); } return v; }
  function sum() {
    let v = product();
    while (peek() === '+' || peek() === '-') { const op = tokens[i++]; const r = product(); v = op === '+' ? v + r : v - r; }
    return v;
  }
  if (text.length > 200) throw new Error('expression longer than 200 characters');
  const v = sum();
  if (i !== tokens.length) throw new Error(`unexpected '${tokens[i]}'`);
  return v.toString();
}

function fail(callback, code, details) { callback({ code, details }); }

function reset(call, callback) {
  let task;
  try { task = JSON.parse(call.request.task_json || '{}'); } catch (e) {
    return fail(callback, grpc.status.INVALID_ARGUMENT, `task_json is not JSON: ${e.message}`);
  }
  if (task === null || typeof task !== 'object' || Array.isArray(task)) {
    return fail(callback, grpc.status.INVALID_ARGUMENT, 'task_json must be a JSON object');
  }
  if (episodes.size >= MAX_EPISODES) {
    return fail(callback, grpc.status.RESOURCE_EXHAUSTED, `${episodes.size} episodes are open`);
  }
  const truth = task.ground_truth ?? (task.reward_model || {}).ground_truth;
  const id = crypto.randomUUID().replace(/-/g, '');
  episodes.set(id, { truth: truth == null ? null : String(truth).trim(), calls: 0 });
  callback(null, { episode_id: id, observation: '', info_json: '{}' });
}

function step(call, callback) {
  const { episode_id: id, action } = call.request;
  const ep = episodes.get(id);
  if (!ep) return fail(callback, grpc.status.FAILED_PRECONDITION, `no episode '${id}'`);
  const m = /<calc>([\s\S]*?)(?:<\/calc>|$)/.exec(action);
  if (m) {
    ep.calls += 1;
    let result;
    try { result = evaluate(m[1].trim()); } catch (e) { result = `error: ${e.message}`; }
    return callback(null, { episode_id: id, observation: `<result>${result}</result>`, reward: 0, done: false,
      info_json: JSON.stringify({ tool: 'calc', result }) });
  }
  const numbers = action.match(/-?\d+/g) || [];
  const pred = numbers.length ? numbers[numbers.length - 1] : null;
  const correct = pred !== null && pred === ep.truth;
  episodes.delete(id);
  callback(null, { episode_id: id, observation: '', reward: correct ? 1 : 0, done: true,
    info_json: JSON.stringify({ acc: correct, pred, tool_calls: ep.calls }) });
}

function close(call, callback) { callback(null, { closed: episodes.delete(call.request.episode_id) }); }

function describe(call, callback) {
  callback(null, { service: 'env', backend: 'node', model: 'calculator',
    details: { stop: JSON.stringify(['</calc>']), episodes_open: String(episodes.size) } });
}

const server = new grpc.Server();
server.addService(meshrl.EnvService.service, { Describe: describe, Reset: reset, Step: step, Close: close });
new HealthImplementation({ '': 'SERVING', 'meshrl.v1.EnvService': 'SERVING' }).addToServer(server);
server.bindAsync(`127.0.0.1:${arg('port', '0')}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) { console.error(err.message); process.exit(1); }
  console.log(`listening on 127.0.0.1:${port}`);
});
process.on('SIGTERM', () => server.tryShutdown(() => process.exit(0)));
