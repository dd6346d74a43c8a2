// The Lua scripts of lua/, with their includes expanded exactly as redis_lease/scripts.py
// expands them, so that every script's SHA1 is the same in both languages.
//
// A line `-- @include "name.lua"` becomes lua/include/name.lua (includes nest; each file is
// expanded once per script). `-- @include "limits.json"` becomes the Lua table LIMITS with
// the entries of each table of limits.json (bounds, defaults, run_states) that the expanded
// script names.

import { createHash } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository's lua/ folder (REDIS_LEASE_LUA_DIR overrides it). */
export const LUA_DIR =
  process.env.REDIS_LEASE_LUA_DIR || fileURLToPath(new URL('../../lua/', import.meta.url));

const INCLUDE = /^-- @include "([a-z_]+\.(?:lua|json))"$/gm;
const LIMITS_MARK = '-- @limits';

/**
 * A file's text as Python's read_text() gives it (universal newlines).
 * @param {string} path
 * @returns {string}
 */
function readText(path) {
  return readFileSync(path, 'utf8').replace(/\r\n?/g, '\n');
}

/**
 * A value as a Lua literal, as scripts.py's _lua_literal writes it.
 * @param {unknown} value
 * @returns {string}
 */
function luaLiteral(value) {
  if (Array.isArray(value)) return `{${value.map(luaLiteral).join(', ')}}`;
  if (value !== null && typeof value === 'object') {
    const parts = Object.entries(value).map(([k, v]) => `${k} = ${luaLiteral(v)}`);
    return `{${parts.join(', ')}}`;
  }
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' && !Number.isInteger(value)) return String(value);
  return String(value);
}

/**
 * limits.json as parsed data.
 * @param {string} dir
 * @returns {{about: string, bounds: Record<string, number[]>, defaults: Record<string, unknown>,
 *   run_states: Record<string, string[]>}}
 */
function limits(dir) {
  return JSON.parse(readText(join(dir, 'include', 'limits.json')));
}

/**
 * `local LIMITS = {...}` with the bounds, defaults and run states the script names.
 * @param {string} script
 * @param {string} dir
 * @returns {string}
 */
function limitsTable(script, dir) {
  const words = new Set(script.match(/[A-Za-z_]+/g) || []);
  const table = limits(dir);
  /** @type {Record<string, Record<string, unknown>>} */
  const data = {};
  for (const [part, entries] of Object.entries(table)) {
    if (typeof entries !== 'object' || entries === null || Array.isArray(entries)) continue;
    data[part] = Object.fromEntries(
      Object.entries(entries).filter(([name]) => words.has(name)),
    );
  }
  return `local LIMITS = ${luaLiteral(data)}`;
}

/**
 * @param {string} text
 * @param {Set<string>} seen
 * @param {string} dir
 * @returns {string}
 */
function expand(text, seen, dir) {
  return text.replace(INCLUDE, (_line, name) => {
    if (seen.has(name)) return '';
    seen.add(name);
    if (name === 'limits.json') return LIMITS_MARK;
    return expand(readText(join(dir, 'include', name)), seen, dir);
  });
}

/**
 * The script's text with its includes expanded: what EVAL/EVALSHA sends.
 * @param {string} name a script of lua/, without `.lua` (e.g. `claim_next`)
 * @param {string} [dir] the lua/ folder
 * @returns {string}
 */
export function source(name, dir = LUA_DIR) {
  const text = expand(readText(join(dir, `${name}.lua`)), new Set(), dir);
  // a function replacement: '$' in the table must not be read as a pattern
  return text.replace(LIMITS_MARK, () => limitsTable(text, dir));
}

/**
 * The SHA1 (hex) of a script's expanded text, as EVALSHA names it.
 * @param {string} text
 * @returns {string}
 */
export function sha1(text) {
  return createHash('sha1').update(text, 'utf8').digest('hex');
}

/**
 * The names of every script in lua/ (not the includes), sorted.
 * @param {string} [dir]
 * @returns {string[]}
 */
export function scriptNames(dir = LUA_DIR) {
  return readdirSync(dir)
    .filter((file) => file.endsWith('.lua'))
    .map((file) => file.slice(0, -4))
    .sort();
}

/** The bounds of limits.json: name -> [lowest, highest]. */
export const BOUNDS = limits(LUA_DIR).bounds;
