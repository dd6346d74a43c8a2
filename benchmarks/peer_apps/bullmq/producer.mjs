// Adds COUNT jobs to a BullMQ queue with addBulk (blocks of 1000), removed when completed.
// Usage: node producer.mjs QUEUE PREFIX HOST PORT COUNT
import { Queue } from "bullmq";

const [name, prefix, host, port, countText] = process.argv.slice(2);
const count = Number(countText);
const queue = new Queue(name, { prefix, connection: { host, port: Number(port) } });
const BLOCK = 1000;
for (let start = 0; start < count; start += BLOCK) {
  const jobs = [];
  for (let n = start; n < Math.min(count, start + BLOCK); n += 1) {
    jobs.push({ name: "work", data: { n }, opts: { removeOnComplete: true } });
  }
  await queue.addBulk(jobs);
}
const waiting = await queue.getWaitingCount();
await queue.close();
console.log(JSON.stringify({ added: count, waiting }));
