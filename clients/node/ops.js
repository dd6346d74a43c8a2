#!/usr/bin/env node
// Client operations driven line by line: reads one JSON request per stdin line, answers
// one JSON line on stdout. For scripting from a shell or another language's tests.
//
//   node ops.js REDIS_URL [PREFIX]
//   {"op": "claim", "run": "r", "item": "x", "ttlMs": 5000, "worker": "n1"}
//   {"op": "claimNext", "run": "r", "shard": 0, "limit": 5, "ttlMs": 5000}
//   {"op": "renew", "lease": {...}, "ttlMs": 5000}
//   {"op": "commit", "lease": {...}, "result": {...}}
//   {"op": "fail", "lease": {...}, "error": "text", "permanent": false}
//   {"op": "scripts"}   the SHA1 of every expanded script of lua/
//   {"op": "protocol"}  the protocol stamped (stamps it where none is; ProtocolMismatch)
// Answers: {"ok": <lease, leases or reply>} or
//   {"error": {"name": "LeaseLost", "code": "LEASE_LOST", "message": ..., ...fields}}

import { createInterface } from 'node:readline';

import { connect, LeaseError, ProtocolMismatch, scriptNames, sha1, source } from './index.js';

const [url, prefix = 'rl'] = process.argv.slice(2);
if (!url) {
  process.stderr.write('ops.js: give the Redis URL: node ops.js redis://127.0.0.1:6379/0 [PREFIX]\n');
  process.exit(2);
}
const client = connect(url, { prefix });

/**
 * @param {Record<string, any>} r a request
 * @returns {Promise<unknown>}
 */
async function run(r) {
  switch (r.op) {
    case 'claim':
      return client.claim(r.run, r.item, r);
    case 'claimNext':
      return client.claimNext(r.run, r.shard, r);
    case 'renew':
      return client.renew(r.lease, r.ttlMs);
    case 'commit':
      return client.commit(r.lease, r.result, r);
    case 'fail':
      return client.fail(r.lease, r.error, r);
    case 'protocol':
      return client.checkProtocol();
    case 'scripts':
      return Object.fromEntries(scriptNames().map((name) => [name, sha1(source(name))]));
    default:
      throw new Error(`unknown op ${JSON.stringify(r.op)}: use claim, claimNext, renew, commit, fail, protocol or scripts`);
  }
}

/** @param {unknown} error */
function described(error) {
  if (error instanceof LeaseError) {
    const { name, code, message, fields, run: runId, item, token, ...typed } = error;
    return { name: error.name, code, message, fields, run: runId, item, token, ...typed };
  }
  if (error instanceof ProtocolMismatch) {
    return { name: error.name, message: error.message, found: error.found, speaks: error.speaks };
  }
  return { name: 'Error', message: error instanceof Error ? error.message : String(error) };
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  let answer;
  try {
    answer = { ok: await run(JSON.parse(line)) };
  } catch (error) {
    answer = { error: described(error) };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
await client.close();
