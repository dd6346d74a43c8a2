// A history of script calls as JSON lines, in the format of tests/faults/recorder.py, so
// that tests/faults/checker.py checks runs worked by Node and Python processes together.
// Each call is an `invoke` line when sent and one end line: `ok` (with the reply), `fail`
// (the script's error reply) or `info` (no reply: it may or may not have run). Each line is
// one write on an O_APPEND descriptor, so a killed process never garbles a line.

import { closeSync, openSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';

const TAG = /\{(.*)#(\d+)\}/;
/** Scripts that take an item, a token and a lease id as ARGV[1..3]. */
const HOLDER_CALLS = ['renew', 'commit', 'fail', 'release', 'record_effect'];

/**
 * @param {unknown} value
 * @returns {number | string}
 */
function tokenOf(value) {
  const text = String(value);
  return /^\d+$/.test(text) ? Number(text) : text;
}

/**
 * The invoke line's fields: script, run, shard, prefix, item, token, lease.
 * @param {string} name
 * @param {string[]} keys
 * @param {(string|number)[]} args
 * @returns {Record<string, unknown>}
 */
function describeCall(name, keys, args) {
  /** @type {Record<string, unknown>} */
  const fields = { f: name };
  const found = keys.length ? TAG.exec(keys[0]) : null;
  if (found) {
    fields.run = found[1];
    fields.shard = Number(found[2]);
    fields.prefix = keys[0].slice(0, found.index).replace(/:+$/, '');
  }
  if (name === 'claim') {
    fields.item = String(args[0]);
    fields.lease = String(args[2] ?? '');
  } else if (HOLDER_CALLS.includes(name)) {
    fields.item = String(args[0]);
    fields.token = tokenOf(args[1]);
    fields.lease = String(args[2]);
  }
  if (name === 'commit') {
    fields.writes = String(args[5]).slice(0, 2000);
    fields.guarded = keys.slice(7);
  }
  if (name === 'claim_next') fields.lease = String(args[1]);
  return fields;
}

/**
 * @param {unknown[]} row a claim row
 * @returns {Record<string, unknown>}
 */
function grantOf(row) {
  const [item, token, lease, expires, attempt, , takeover, now] = row;
  return {
    item: String(item),
    token: Number(token),
    lease: String(lease),
    expires_ms: Number(expires),
    attempt: Number(attempt),
    takeover: Number(takeover) === 1,
    server_ms: Number(now),
  };
}

/**
 * The ok line's fields for a raw reply of script `name`.
 * @param {string} name
 * @param {unknown} reply
 * @returns {Record<string, unknown>}
 */
function describeReply(name, reply) {
  const r = /** @type {unknown[]} */ (reply);
  if (name === 'claim') return { grants: [grantOf(r)], server_ms: Number(r[7]) };
  if (name === 'claim_next') {
    const grants = /** @type {unknown[][]} */ (r).map(grantOf);
    const times = grants.map((g) => /** @type {number} */ (g.server_ms));
    return { grants, server_ms: times.length ? Math.max(...times) : null };
  }
  if (name === 'commit') {
    return { repeated: String(r[0]) === 'repeated', token: Number(r[1]), server_ms: Number(r[3]) };
  }
  if (name === 'renew') return { expires_ms: Number(r[0]), server_ms: Number(r[1]) };
  if (name === 'fail') return { state: String(r[0]), server_ms: Number(r[3]) };
  return { reply: JSON.stringify(reply).slice(0, 200) };
}

/** An Observer (see index.js) that appends each call to a JSON-lines file. */
export class History {
  /**
   * @param {string} path the file, e.g. <dir>/node-<pid>.jsonl
   * @param {string} [label] the first part of the process name
   */
  constructor(path, label = 'node') {
    this.fd = openSync(path, 'a');
    this.process = `${label}:${hostname()}:${process.pid}`;
    this.next = 1;
  }

  /** @param {Record<string, unknown>} fields */
  write(fields) {
    writeSync(this.fd, `${JSON.stringify(fields)}\n`);
  }

  /**
   * @param {string} name
   * @param {string[]} keys
   * @param {(string|number)[]} args
   * @returns {{op: number, name: string}}
   */
  sent(name, keys, args) {
    const op = this.next++;
    const fields = describeCall(name, keys, args);
    this.write({ process: this.process, op, type: 'invoke', ...fields, wall_ms: Date.now() });
    return { op, name };
  }

  /**
   * @param {unknown} ticket
   * @param {unknown} reply the raw reply, or the error reply as an Error
   */
  answered(ticket, reply) {
    const { op, name } = /** @type {{op: number, name: string}} */ (ticket);
    const base = { process: this.process, op, wall_ms: Date.now() };
    if (reply instanceof Error) {
      this.write({ ...base, type: 'fail', error: reply.message.slice(0, 500) });
    } else {
      this.write({ ...base, type: 'ok', ...describeReply(name, reply) });
    }
  }

  /**
   * @param {unknown} ticket
   * @param {unknown} error
   */
  unanswered(ticket, error) {
    const { op } = /** @type {{op: number}} */ (ticket);
    const detail = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    const base = { process: this.process, op, wall_ms: Date.now() };
    this.write({ ...base, type: 'info', error: detail.slice(0, 500) });
  }

  /** Closes the file. */
  close() {
    closeSync(this.fd);
  }
}
