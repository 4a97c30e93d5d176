/**
 * Shared by the tests: Python's reference data (made at test time by reference.py), the batches, and the
 * comparisons.
 * @module
 */

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root (web/..): Python runs there, so that it imports this checkout's onnxtrain. */
export const ROOT = join(HERE, '..', '..');
/** The Python that has onnxtrain: `ONNXTRAIN_PYTHON`, else the repository's .venv, else python3. */
export const PYTHON =
  process.env.ONNXTRAIN_PYTHON ?? (existsSync(join(ROOT, '.venv/bin/python')) ? join(ROOT, '.venv/bin/python') : 'python3');
/** The relative tolerance of every comparison with Python. */
export const RTOL = 1e-5;

/**
 * Run reference.py with `args` (from the repository root).
 * @param {string[]} args
 */
export function python(...args) {
  execFileSync(PYTHON, [join(HERE, 'reference.py'), ...args], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
}

/**
 * The folder of Python's reference data: `ONNXTRAIN_WEB_REFERENCE` when the caller made it once for all test
 * files (`npm test` does), else made now in a temporary folder.
 */
export function referenceDir() {
  const given = process.env.ONNXTRAIN_WEB_REFERENCE;
  if (given && existsSync(join(given, 'mlp', 'case.json'))) return given;
  const dir = temporaryDir('onnxtrain-web-');
  python('prepare', dir);
  return dir;
}

/**
 * A new temporary folder, removed when the process exits (kept when `ONNXTRAIN_WEB_KEEP` is set, to look at).
 * @param {string} prefix
 */
export function temporaryDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  if (!process.env.ONNXTRAIN_WEB_KEEP) process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * @typedef {Object} Case
 * @property {string} dir
 * @property {string} artifacts
 * @property {{ steps: number, saveAt: number, learningRate: number, inputs: { name: string, type: string, dims: number[] }[] }} manifest
 * @property {(step: number) => Record<string, { type: string, data: Float32Array | BigInt64Array, dims: number[] }>} batch
 */

/**
 * One case of the reference data (`mlp`, `cnn`): its artifacts and batches.
 * @param {string} root
 * @param {string} name
 * @returns {Case}
 */
export function loadCase(root, name) {
  const dir = join(root, name);
  const manifest = JSON.parse(readFileSync(join(dir, 'case.json'), 'utf8'));
  const arrays = manifest.inputs.map((/** @type {any} */ input) => {
    const bytes = readFileSync(join(dir, 'batches', `${input.name}.bin`));
    const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
    return input.type === 'float32' ? new Float32Array(buffer) : new BigInt64Array(buffer);
  });
  return {
    dir,
    artifacts: join(dir, 'artifacts'),
    manifest,
    batch(step) {
      /** @type {Record<string, any>} */
      const feeds = {};
      manifest.inputs.forEach((/** @type {any} */ input, /** @type {number} */ i) => {
        const size = input.dims.reduce((/** @type {number} */ a, /** @type {number} */ b) => a * b, 1);
        feeds[input.name] = { type: input.type, data: arrays[i].slice(step * size, (step + 1) * size), dims: input.dims };
      });
      return feeds;
    },
  };
}

/**
 * A run written by reference.py: its losses and the parameters before and after each optimizer step.
 * @param {string} dir
 * @param {string} name
 */
export function loadRun(dir, name) {
  const { losses, evalLoss } = JSON.parse(readFileSync(join(dir, `${name}.json`), 'utf8'));
  const bytes = readFileSync(join(dir, `${name}-params.bin`));
  const params = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  return { losses: /** @type {number[]} */ (losses), params, evalLoss: /** @type {number} */ (evalLoss) };
}

/**
 * Assert `actual` equals `expected` element-wise to `rtol` relative (of the larger magnitude), with an absolute
 * floor `atol`; the message names the worst element.
 * @param {ArrayLike<number>} actual
 * @param {ArrayLike<number>} expected
 * @param {string} what
 * @param {number} [atol]
 * @param {number} [rtol]
 */
export function assertClose(actual, expected, what, atol = 0, rtol = RTOL) {
  assert.equal(actual.length, expected.length, `${what}: ${actual.length} values, expected ${expected.length}`);
  let worst = 0;
  let at = -1;
  for (let i = 0; i < actual.length; i++) {
    const a = actual[i];
    const e = expected[i];
    const excess = Math.abs(a - e) - (rtol * Math.max(Math.abs(a), Math.abs(e)) + atol);
    if (!(excess <= worst)) {
      worst = Number.isNaN(excess) ? Infinity : excess;
      at = i;
    }
  }
  if (at >= 0) assert.fail(`${what}: element ${at} is ${actual[at]}, Python's ${expected[at]} (beyond ${rtol} relative)`);
}

/**
 * Compare a run with Python's: every loss to `rtol` relative, every parameter tensor after every step to
 * `rtol` of the tensor's largest magnitude in Python's run.
 * @param {{ losses: number[], params: ArrayLike<number>[] }} run the losses and the parameters (in
 *   training-model order) before the first step and after each
 * @param {{ losses: number[], params: Float32Array }} expected a run written by reference.py
 * @param {{ names: readonly string[], sizes: readonly number[] }} layout the parameters' names and sizes
 * @param {{ what: string, firstStep?: number, expectedFrom?: number, rtol?: number }} how `firstStep`: the step
 *   count the run starts at; `expectedFrom`: where the run starts in `expected` (default `firstStep`)
 */
export function compareRun(run, expected, { names, sizes }, { what, firstStep = 0, expectedFrom = firstStep, rtol = RTOL }) {
  assertClose(run.losses, expected.losses.slice(expectedFrom, expectedFrom + run.losses.length), `${what}: losses`, 0, rtol);
  const total = sizes.reduce((a, b) => a + b, 0);
  run.params.forEach((params, k) => {
    const python = expected.params.subarray((expectedFrom + k) * total, (expectedFrom + k + 1) * total);
    assert.equal(python.length, total, `${what}: Python's run has no parameters after ${firstStep + k} steps`);
    let offset = 0;
    names.forEach((name, i) => {
      const e = python.subarray(offset, offset + sizes[i]);
      const scale = e.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
      const actual = Array.prototype.slice.call(params, offset, offset + sizes[i]);
      assertClose(actual, e, `${what}: '${name}' after ${firstStep + k} steps`, rtol * scale, rtol);
      offset += sizes[i];
    });
  });
}
