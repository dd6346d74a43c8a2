// A BullMQ worker of benchmarks/peers.py: concurrency N, a no-op or sleeping processor.
// Usage: node worker.mjs QUEUE PREFIX HOST PORT CONCURRENCY SLEEP_MS
import { Worker } from "bullmq";

const [queue, prefix, host, port, concurrency, sleepMs] = process.argv.slice(2);
const ms = Number(sleepMs);
const processor =
  ms > 0 ? async () => { await new Promise((r) => setTimeout(r, ms)); } : async () => {};

const worker = new Worker(queue, processor, {
  concurrency: Number(concurrency),
  prefix,
  connection: { host, port: Number(port), maxRetriesPerRequest: null },
});
worker.on("error", (error) => console.error(`worker error: ${error}`));

const stop = async () => {
  await worker.close();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
