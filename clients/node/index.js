// redis-lease from Node.js: claim, claim-next, renew, commit and fail on the project's own
// Lua scripts (lua/), sent with EVALSHA. Keys, arguments and replies: docs/protocol.md.

import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import Redis from 'ioredis';

import { fromReply, InvalidInput, ProtocolMismatch, RedisUnavailable } from './errors.js';
import { sha1, source } from './scripts.js';

export * from './errors.js';
export { scriptNames, sha1, source } from './scripts.js';

/** The shard keys, in the order every shard script takes them; the attempt log is 8th. */
export const SHARD_KEY_NAMES = ['meta', 'counts', 'items', 'due', 'leases', 'held', 'dead'];
/** The scripts this client sends. */
const SCRIPTS = ['claim', 'claim_next', 'renew', 'commit', 'fail'];
/** Times a call is sent again after NOSCRIPT (the server lost its scripts meanwhile). */
const NOSCRIPT_RETRIES = 3;
/** This client's release (package.json), named when a protocol stamp refuses it. */
export const VERSION = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'))
  .version;
/** The protocol this client stamps where none is stamped yet (redis_lease/protocol/store/stamp.py). */
export const PROTOCOL = 1;
/** Every protocol this client speaks (docs/upgrading.md). */
export const PROTOCOLS = Object.freeze([PROTOCOL]);

/**
 * A lease granted by claim or claimNext: what the holder sends back to renew, commit, fail.
 * @typedef {object} Lease
 * @property {string} run
 * @property {string} item
 * @property {number} shard
 * @property {number} token the fencing token: every claim of the item raises it
 * @property {string} leaseId
 * @property {number} expiresAtMs server clock
 * @property {number} attempt
 * @property {unknown} payload the item's JSON payload (null when none)
 * @property {boolean} takeover true when an expired lease was taken over
 * @property {number} nowMs the server time of the grant
 * @property {string} worker
 * @property {string} traceId
 */

/**
 * Sees every script call (histories, tracing): `sent` returns a ticket, then exactly one
 * of `answered` (the reply, or the script's error reply as an Error) and `unanswered`
 * (no reply: the call may or may not have run).
 * @typedef {object} Observer
 * @property {(name: string, keys: string[], args: (string|number)[]) => unknown} sent
 * @property {(ticket: unknown, reply: unknown) => void} answered
 * @property {(ticket: unknown, error: unknown) => void} unanswered
 */

/**
 * The shard of an item: CRC-32 of its UTF-8 id modulo the shard count (as keys.py).
 * @param {string} itemId
 * @param {number} shards
 * @returns {number}
 */
export function shardOf(itemId, shards) {
  return crc32(Buffer.from(itemId, 'utf8')) % shards;
}

/** @type {Uint32Array | undefined} */
let crcTable;

/**
 * CRC-32 (IEEE, as zlib's), unsigned.
 * @param {Uint8Array} bytes
 * @returns {number}
 */
export function crc32(bytes) {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const byte of bytes) crc = crcTable[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

/** A new trace id: 32 lowercase hex characters, as the Python client makes them. */
export function newTraceId() {
  return randomBytes(16).toString('hex');
}

/**
 * The ioredis options of every connection. A command sent but not answered before a
 * disconnect is not sent again after the reconnect (ioredis would by default): it may
 * have run, so the call fails with RedisUnavailable and its outcome is unknown (`info`
 * in a history). A command queued while disconnected was never sent: it waits for up
 * to 3 reconnect attempts, then fails the same way.
 */
export const REDIS_OPTIONS = Object.freeze({
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 3,
});

/**
 * Connects to the Redis at `url` (redis:// or rediss://).
 * @param {string} url
 * @param {{prefix?: string, observer?: Observer}} [options] prefix: the key prefix (`rl`)
 * @returns {LeaseClient}
 */
export function connect(url, options = {}) {
  const redis = new Redis(url, { ...REDIS_OPTIONS });
  const client = new LeaseClient(redis, { ...options, url });
  redis.on('error', (/** @type {Error} */ error) => {
    client.lastError = error; // reported with the call that fails, not on its own
  });
  return client;
}

/**
 * A URL with its password masked, for messages.
 * @param {string} url
 * @returns {string}
 */
function masked(url) {
  return url.replace(/\/\/([^@/]*)@/, (_all, auth) => `//${auth.replace(/:.*/, ':***')}@`);
}

/** Fenced leases on the items of runs, under one key prefix. */
export class LeaseClient {
  /**
   * @param {import('ioredis').Redis} redis
   * @param {{prefix?: string, observer?: Observer, url?: string}} [options]
   */
  constructor(redis, { prefix = 'rl', observer, url = 'redis' } = {}) {
    this.redis = redis;
    this.url = masked(url);
    /** @type {Error | undefined} the connection's last error */
    this.lastError = undefined;
    this.prefix = prefix;
    this.observer = observer;
    /** @type {Map<string, {text: string, sha: string}>} */
    this.scripts = new Map(
      SCRIPTS.map((name) => {
        const text = source(name);
        return [name, { text, sha: sha1(text) }];
      }),
    );
    /** @type {Map<string, number>} */
    this.shardCounts = new Map();
    /** @type {Promise<number> | undefined} the protocol check, once it has begun */
    this.protocolChecked = undefined;
  }

  /**
   * Checks the protocol stamped under the prefix (`<prefix>:protocol`), stamping PROTOCOL
   * where none is stamped yet. Every script call waits for it first, so a client that does
   * not speak the stamped protocol sends nothing. Once per client (again after Redis did
   * not answer).
   * @returns {Promise<number>} the protocol the data is in; throws ProtocolMismatch
   */
  checkProtocol() {
    this.protocolChecked ??= this.stampProtocol().catch((error) => {
      if (!(error instanceof ProtocolMismatch)) this.protocolChecked = undefined;
      throw error;
    });
    return this.protocolChecked;
  }

  /** @returns {Promise<number>} */
  async stampProtocol() {
    const key = `${this.prefix}:protocol`;
    try {
      let found = await this.redis.get(key);
      if (found === null) {
        const stamped = await this.redis.set(key, String(PROTOCOL), 'NX');
        found = stamped === 'OK' ? String(PROTOCOL) : await this.redis.get(key);
      }
      found ??= String(PROTOCOL); // stamped by another, then deleted: none again
      const number = /^[0-9]{1,9}$/.test(found) ? Number(found) : undefined;
      if (number !== undefined && PROTOCOLS.includes(number)) return number;
      throw protocolMismatch(this.prefix, key, found, number);
    } catch (error) {
      if (error instanceof ProtocolMismatch) throw error;
      throw this.unavailable('the protocol stamp', error);
    }
  }

  /** Closes the connection. */
  async close() {
    await this.redis.quit();
  }

  /**
   * The eight keys of a shard: its seven and its attempt log.
   * @param {string} run
   * @param {number} shard
   * @returns {string[]}
   */
  shardKeys(run, shard) {
    const tag = `${this.prefix}:{${run}#${shard}}`;
    return [...SHARD_KEY_NAMES, 'attempts'].map((name) => `${tag}:${name}`);
  }

  /**
   * The run's shard count (HGET <prefix>:run:{<run>} shards); NotFound for an unknown run.
   * @param {string} run
   * @returns {Promise<number>}
   */
  async shardCount(run) {
    let count = this.shardCounts.get(run);
    if (count === undefined) {
      const key = `${this.prefix}:run:{${run}}`;
      const raw = await this.redis.hget(key, 'shards').catch((error) => {
        throw this.unavailable('HGET', error);
      });
      if (raw === null) throw fromReply(`NOT_FOUND run=${run}`, { run });
      count = Number(raw);
      this.shardCounts.set(run, count);
    }
    return count;
  }

  /**
   * Leases one named item.
   * @param {string} run
   * @param {string} item
   * @param {{ttlMs?: number, worker?: string, traceId?: string}} [options]
   * @returns {Promise<Lease>} throws NotClaimable, NotFound, RunClosed, InvalidInput
   */
  async claim(run, item, { ttlMs = 60000, worker = 'node', traceId } = {}) {
    const shard = shardOf(item, await this.shardCount(run));
    const row = await this.call('claim', run, shard, [item, worker, hexId(), ttlMs], { item });
    return grant(run, shard, worker, traceId ?? newTraceId(), /** @type {unknown[]} */ (row));
  }

  /**
   * Leases up to `limit` due items of one shard: expired leases first (takeovers), then
   * pending items by eligible time. Empty when nothing is due.
   * @param {string} run
   * @param {number} shard
   * @param {{ttlMs?: number, worker?: string, limit?: number, traceId?: string}} [options]
   * @returns {Promise<Lease[]>} throws RunClosed, NotFound (no such run), InvalidInput
   */
  async claimNext(run, shard, { ttlMs = 60000, worker = 'node', limit = 1, traceId } = {}) {
    const count = await this.shardCount(run);
    if (!Number.isInteger(shard) || shard < 0 || shard >= count) {
      throw new InvalidInput(
        `shard ${shard} out of range: run ${run} has shards 0-${count - 1}`,
        'INVALID',
        {},
        { run },
      );
    }
    const rows = await this.call('claim_next', run, shard, [worker, hexId(), ttlMs, limit]);
    return /** @type {unknown[][]} */ (rows).map((row) =>
      grant(run, shard, worker, traceId ?? newTraceId(), row),
    );
  }

  /**
   * Extends a lease by `ttlMs` from now; only its holder may.
   * @param {Lease} lease
   * @param {number} ttlMs
   * @returns {Promise<Lease>} the lease with its new expiry; throws LeaseLost
   */
  async renew(lease, ttlMs) {
    const [expires, now] = /** @type {unknown[]} */ (
      await this.holderCall('renew', lease, [ttlMs, lease.traceId])
    );
    return { ...lease, expiresAtMs: Number(expires), nowMs: Number(now) };
  }

  /**
   * Marks the item done with `result` (JSON); a repeat with the same lease returns the
   * stored outcome. Guarded writes are the Python client's (or send commit.lua's ARGV).
   * @param {Lease} lease
   * @param {unknown} [result]
   * @param {{label?: string}} [options] label: counted as outcome_<label>
   * @returns {Promise<{repeated: boolean, token: number, result: string, doneAtMs: number}>}
   *   throws LeaseLost, InvalidInput
   */
  async commit(lease, result = null, { label = '' } = {}) {
    const text = JSON.stringify(result === undefined ? null : result);
    const [status, token, stored, doneAt] = /** @type {unknown[]} */ (
      await this.holderCall('commit', lease, [text, '[]', '[]', label, lease.traceId])
    );
    return {
      repeated: String(status) === 'repeated',
      token: Number(token),
      result: String(stored),
      doneAtMs: Number(doneAt),
    };
  }

  /**
   * Reports a failed attempt: retried after a backoff with jitter, or dead.
   * @param {Lease} lease
   * @param {string} error what failed (1 to 4000 bytes)
   * @param {{permanent?: boolean, jitter?: number}} [options]
   * @returns {Promise<{state: string, eligibleAtMs: number, attempts: number, nowMs: number}>}
   *   throws LeaseLost, InvalidInput
   */
  async fail(lease, error, { permanent = false, jitter = Math.random() } = {}) {
    const args = [error, permanent ? '1' : '0', jitter.toFixed(6), lease.traceId];
    const [state, eligible, attempts, now] = /** @type {unknown[]} */ (
      await this.holderCall('fail', lease, args)
    );
    return {
      state: String(state),
      eligibleAtMs: Number(eligible),
      attempts: Number(attempts),
      nowMs: Number(now),
    };
  }

  /**
   * @param {string} name
   * @param {Lease} lease
   * @param {(string|number)[]} args after the holder's item, token and lease id
   */
  holderCall(name, lease, args) {
    const context = { item: lease.item, token: lease.token };
    const full = [lease.item, lease.token, lease.leaseId, ...args];
    return this.call(name, lease.run, lease.shard, full, context);
  }

  /**
   * The error for a call Redis did not answer, naming the connection's last error.
   * @param {string} what the script or command
   * @param {unknown} error
   * @returns {RedisUnavailable}
   */
  unavailable(what, error) {
    const cause = this.lastError?.message ?? (error instanceof Error ? error.message : error);
    return new RedisUnavailable(`Redis at ${this.url} did not answer ${what}: ${cause}`);
  }

  /**
   * Sends one script with EVALSHA (loading it on NOSCRIPT); error replies become typed.
   * @param {string} name
   * @param {string} run
   * @param {number} shard
   * @param {(string|number)[]} args
   * @param {{item?: string, token?: number}} [context]
   * @returns {Promise<unknown>}
   */
  async call(name, run, shard, args, context = {}) {
    await this.checkProtocol();
    const keys = this.shardKeys(run, shard);
    const ticket = this.observer?.sent(name, keys, args);
    let reply;
    try {
      reply = await this.evalsha(name, keys, args);
    } catch (error) {
      const text = error instanceof Error ? error.message : String(error);
      const typed = isReplyError(error) ? fromReply(text, { run, ...context }) : null;
      if (isReplyError(error)) this.observer?.answered(ticket, error);
      else this.observer?.unanswered(ticket, error);
      if (typed) throw typed;
      throw isReplyError(error) ? error : this.unavailable(name, error);
    }
    this.observer?.answered(ticket, reply);
    return reply;
  }

  /**
   * @param {string} name
   * @param {string[]} keys
   * @param {(string|number)[]} args
   */
  async evalsha(name, keys, args) {
    const script = this.scripts.get(name);
    if (!script) throw new Error(`the Node client does not send ${name}.lua`);
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.redis.evalsha(script.sha, keys.length, ...keys, ...args);
      } catch (error) {
        const missing = error instanceof Error && error.message.startsWith('NOSCRIPT');
        if (!missing || attempt === NOSCRIPT_RETRIES) throw error;
        await this.redis.script('LOAD', script.text);
      }
    }
  }
}

/**
 * The refusal of a stamp this client does not speak, in the words of the Python client's.
 * @param {string} prefix
 * @param {string} key
 * @param {string} found the stamp as read
 * @param {number | undefined} number the protocol it names, if it is a number
 * @returns {ProtocolMismatch}
 */
function protocolMismatch(prefix, key, found, number) {
  const speaks = [...PROTOCOLS];
  const release = `redis-lease-client ${VERSION} speaks protocol ${speaks.join(' and ')}`;
  const message =
    number === undefined
      ? `the protocol stamp ${key} holds ${JSON.stringify(found.slice(0, 40))}, not a protocol ` +
        `number, and ${release}: find what wrote it (docs/upgrading.md); nothing was written`
      : `the data under prefix '${prefix}' is in protocol ${number} (stamp ${key}), and ` +
        `${release}: run a release that speaks protocol ${number} (docs/upgrading.md), or use ` +
        'another prefix; nothing was written';
  return new ProtocolMismatch(message, found, speaks);
}

/**
 * @param {unknown} error
 * @returns {boolean} true for an error the server replied (not a lost connection)
 */
function isReplyError(error) {
  return error instanceof Error && error.name === 'ReplyError';
}

/** A random id for a lease, or a batch's base (64 random bits, 16 hex characters, as the
 * Python client makes them). */
function hexId() {
  return randomBytes(8).toString('hex');
}

/**
 * A claim row {item, token, lease id, expires_at, attempt, payload, takeover, now} as a Lease.
 * @param {string} run
 * @param {number} shard
 * @param {string} worker
 * @param {string} traceId
 * @param {unknown[]} row
 * @returns {Lease}
 */
function grant(run, shard, worker, traceId, row) {
  const [item, token, leaseId, expires, attempt, payload, takeover, now] = row;
  return {
    run,
    item: String(item),
    shard,
    token: Number(token),
    leaseId: String(leaseId),
    expiresAtMs: Number(expires),
    attempt: Number(attempt),
    payload: payload === '' ? null : JSON.parse(String(payload)),
    takeover: Number(takeover) === 1,
    nowMs: Number(now),
    worker,
    traceId,
  };
}

