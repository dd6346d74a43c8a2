#!/usr/bin/env node
// A worker: claims the due items of some shards of a run, "handles" each (waits
// --handle-ms), commits it, and stops when no item of those shards is pending or leased.
// Prints a JSON summary line on exit. HISTORY_FILE=<path>: records every script call as
// JSON lines for tests/faults/checker.py. Exits 9, touching nothing, when the data is in a
// protocol the client does not speak (its stamp, <prefix>:protocol; docs/upgrading.md).
//
//   node worker.js --run RUN [--url redis://127.0.0.1:6379/0] [--prefix rl] [--shards 0,2]
//     [--worker NAME] [--ttl-ms 60000] [--batch 10] [--handle-ms 0] [--timeout-s 300]

import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';

import { connect, LeaseLost, NotFound, ProtocolMismatch } from './index.js';
import { History } from './history.js';

const OPTIONS = {
  url: { type: 'string', default: process.env.REDIS_URL || 'redis://127.0.0.1:6379/0' },
  prefix: { type: 'string', default: 'rl' },
  run: { type: 'string' },
  shards: { type: 'string' },
  worker: { type: 'string', default: `node-${process.pid}` },
  'ttl-ms': { type: 'string', default: '60000' },
  batch: { type: 'string', default: '10' },
  'handle-ms': { type: 'string', default: '0' },
  'timeout-s': { type: 'string', default: '300' },
};

/**
 * A whole number option, or exit 2 naming it.
 * @param {Record<string, string | undefined>} values
 * @param {string} name
 * @param {number} lowest
 * @returns {number}
 */
function whole(values, name, lowest) {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < lowest) usage(`--${name} must be a whole number >= ${lowest}`);
  return n;
}

/** @param {string} problem */
function usage(problem) {
  process.stderr.write(`worker.js: ${problem} (see the usage at the top of worker.js)\n`);
  process.exit(2);
}

/**
 * @param {import('./index.js').LeaseClient} client
 * @param {string} run
 * @param {number[]} shards
 * @returns {Promise<number>} items of those shards that are pending or leased
 */
async function unfinished(client, run, shards) {
  let count = 0;
  for (const shard of shards) {
    const keys = client.shardKeys(run, shard);
    count += (await client.redis.zcard(keys[3])) + (await client.redis.zcard(keys[4]));
  }
  return count;
}

async function main() {
  let parsed;
  try {
    parsed = parseArgs({ options: OPTIONS, strict: true });
  } catch (error) {
    usage(error instanceof Error ? error.message : String(error));
    return;
  }
  const values = /** @type {Record<string, string | undefined>} */ (parsed.values);
  if (!values.run) usage('--run is required: the run to work');
  const run = /** @type {string} */ (values.run);
  const ttlMs = whole(values, 'ttl-ms', 1);
  const batch = whole(values, 'batch', 1);
  const handleMs = whole(values, 'handle-ms', 0);
  const ends = Date.now() + whole(values, 'timeout-s', 1) * 1000;
  const history = process.env.HISTORY_FILE ? new History(process.env.HISTORY_FILE) : undefined;
  const client = connect(/** @type {string} */ (values.url), {
    prefix: values.prefix,
    observer: history,
  });
  await client.checkProtocol().catch((error) => {
    if (!(error instanceof ProtocolMismatch)) throw error;
    process.stderr.write(`worker.js: ${error.message}\n`);
    process.exit(9); // as the CLI: the data is in a protocol this client does not speak
  });
  const count = await client.shardCount(run).catch((error) => {
    if (!(error instanceof NotFound)) throw error;
    process.stderr.write(`worker.js: run ${run} not found under prefix ${values.prefix}; `);
    process.stderr.write('check --run and --prefix (add its items first)\n');
    process.exit(5);
  });
  const shards = values.shards
    ? values.shards.split(',').map(Number)
    : Array.from({ length: count }, (_, n) => n);
  if (shards.some((s) => !Number.isInteger(s) || s < 0 || s >= count)) {
    usage(`--shards must name shards 0-${count - 1} of run ${run}, comma-separated`);
  }
  const worker = /** @type {string} */ (values.worker);
  const summary = { worker, claimed: 0, takeovers: 0, committed: 0, renewed: 0, stale: 0 };

  /** @param {import('./index.js').Lease} lease claimed at local time `since` */
  async function handle(lease, since) {
    try {
      // renew when less than half the lease is left (by the local clock since the claim)
      if (Date.now() - since > ttlMs / 2) {
        await client.renew(lease, ttlMs);
        summary.renewed++;
      }
      await sleep(handleMs);
      await client.commit(lease, { worker, token: lease.token });
      summary.committed++;
    } catch (error) {
      if (!(error instanceof LeaseLost)) throw error;
      summary.stale++; // another holder has it now: stop, do not commit
    }
  }

  while (Date.now() < ends) {
    let found = 0;
    for (const shard of shards) {
      const leases = await client.claimNext(run, shard, { ttlMs, worker, limit: batch });
      const since = Date.now();
      found += leases.length;
      summary.claimed += leases.length;
      summary.takeovers += leases.filter((lease) => lease.takeover).length;
      for (const lease of leases) await handle(lease, since);
    }
    if (!found) {
      if ((await unfinished(client, run, shards)) === 0) break;
      await sleep(20); // others hold the rest: look again
    }
  }
  await client.close();
  history?.close();
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  if (Date.now() >= ends) {
    process.stderr.write(`worker.js: run ${run} not finished within --timeout-s\n`);
    process.exit(1);
  }
}

main().catch((error) => {
  process.stderr.write(`worker.js: ${error instanceof Error ? error.message : error}\n`);
  process.exit(1);
});
