// The scripts' error replies (`CODE key=value ...`, see docs/protocol.md) as typed errors,
// one class per code of redis_lease/errors.py SCRIPT_CODES.

/**
 * @typedef {{run?: string, item?: string, token?: number}} Context
 */

/** Root of the errors a script answers; `code` is the reply's first word. */
export class LeaseError extends Error {
  /**
   * @param {string} message
   * @param {string} code
   * @param {Record<string, string>} fields the reply's key=value fields
   * @param {Context} context what the call was about
   */
  constructor(message, code, fields = {}, context = {}) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.fields = fields;
    this.run = context.run;
    this.item = fields.item ?? context.item;
    this.token = context.token;
  }
}

/** INVALID: a bad argument or key; nothing was written. */
export class InvalidInput extends LeaseError {}

/** LEASE_LOST: the caller no longer holds the lease; stop and do not commit. */
export class LeaseLost extends LeaseError {
  /** @param {ConstructorParameters<typeof LeaseError>} args */
  constructor(...args) {
    super(...args);
    const f = this.fields;
    this.currentToken = toInt(f.current_token);
    /** state, token, lease or expired */
    this.reason = f.reason;
    this.state = f.state;
    this.expiresAtMs = toInt(f.expires_at);
  }
}

/** NOT_CLAIMABLE: held by another lease, not yet due, or finished. */
export class NotClaimable extends LeaseError {
  /** @param {ConstructorParameters<typeof LeaseError>} args */
  constructor(...args) {
    super(...args);
    this.state = this.fields.state;
    this.untilMs = toInt(this.fields.until);
  }
}

/** NOT_FOUND: no such item (or run). */
export class NotFound extends LeaseError {}

/** RUN_CLOSED: the run grants no lease (closed, or past its deadline). */
export class RunClosed extends LeaseError {
  /** @param {ConstructorParameters<typeof LeaseError>} args */
  constructor(...args) {
    super(...args);
    this.reason = this.fields.reason;
    this.deadlineMs = toInt(this.fields.deadline);
  }
}

/** CONDITION_FAILED: a guarded commit's condition did not hold; nothing was written. */
export class ConditionFailed extends LeaseError {
  /** @param {ConstructorParameters<typeof LeaseError>} args */
  constructor(...args) {
    super(...args);
    this.condition = toInt(this.fields.condition);
  }
}

/** Redis did not answer (refused, unreachable, timed out): the call may or may not have run. */
export class RedisUnavailable extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'RedisUnavailable';
  }
}

/**
 * The data in Redis is in a protocol this client does not speak (its stamp, `<prefix>:protocol`,
 * names another, or holds no number); nothing was sent. worker.js exits 9, as the CLI does.
 */
export class ProtocolMismatch extends Error {
  /**
   * @param {string} message
   * @param {string} found the stamp as read
   * @param {number[]} speaks the protocols this client speaks
   */
  constructor(message, found, speaks) {
    super(message);
    this.name = 'ProtocolMismatch';
    this.found = found;
    this.speaks = speaks;
  }
}

/** Each script error code and its class. */
export const CODES = {
  INVALID: InvalidInput,
  LEASE_LOST: LeaseLost,
  NOT_CLAIMABLE: NotClaimable,
  NOT_FOUND: NotFound,
  RUN_CLOSED: RunClosed,
  CONDITION_FAILED: ConditionFailed,
};

/**
 * @param {string | undefined} text
 * @returns {number | undefined}
 */
function toInt(text) {
  const n = Number(text);
  return text === undefined || text === '' || !Number.isFinite(n) ? undefined : n;
}

/**
 * The typed error of a script's error reply, or null when the reply is not one of its codes.
 * @param {string} reply the error text, e.g. `LEASE_LOST item=x token=1 ...`
 * @param {Context} [context]
 * @returns {LeaseError | null}
 */
export function fromReply(reply, context = {}) {
  const [code, ...rest] = reply.split(' ');
  const Class = CODES[/** @type {keyof typeof CODES} */ (code)];
  if (!Class) return null;
  /** @type {Record<string, string>} */
  const fields = {};
  for (const part of rest) {
    const at = part.indexOf('=');
    if (at > 0) fields[part.slice(0, at)] = part.slice(at + 1);
  }
  return new Class(reply, code, fields, context);
}
