// A BullMQ worker of benchmarks/takeover.py, at BullMQ's defaults (concurrency 1, lock
// 30 s, stalled check every 30 s), with a sleeping processor that records, in Redis, which
// process started each job and when, and when each job was done.
// Usage: node takeover_worker.mjs QUEUE PREFIX HOST PORT SLEEP_MS
import { Worker } from "bullmq";
import IORedis from "ioredis";

const [queue, prefix, host, port, sleepMs] = process.argv.slice(2);
const ms = Number(sleepMs);
const notes = new IORedis({ host, port: Number(port) });
const started = `${queue}:bench:started`;

const worker = new Worker(
  queue,
  async (job) => {
    await notes.hset(started, job.id, process.pid);
    await notes.hset(`${started}:at`, job.id, Date.now());
    await new Promise((r) => setTimeout(r, ms));
    await notes.hset(`${queue}:bench:done`, job.id, Date.now());
  },
  { prefix, connection: { host, port: Number(port), maxRetriesPerRequest: null } },
);
worker.on("error", (error) => console.error(`worker error: ${error}`));

const stop = async () => {
  await worker.close();
  await notes.quit();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
