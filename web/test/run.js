/**
 * `npm test`: make Python's reference data once (reference.py prepare), then run the test files with Node's
 * test runner (each test file makes the data itself when run alone). `node test/run.js node` runs the Node.js tests only, `browser` the Chromium test only.
 * @module
 */

import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { python } from './helpers.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const SUITES = { node: ['checkpoint.test.js', 'training.test.js'], browser: ['browser.test.js'] };
const which = process.argv[2] ?? 'all';
const files = which === 'all' ? [...SUITES.node, ...SUITES.browser] : SUITES[/** @type {'node' | 'browser'} */ (which)];
if (!files) {
  console.error(`usage: node test/run.js [node|browser|all], not ${which}`);
  process.exit(2);
}
const reference = mkdtempSync(join(tmpdir(), 'onnxtrain-web-reference-'));
try {
  python('prepare', reference);
  const run = spawnSync(process.execPath, ['--test', ...files.map((f) => join(HERE, f))], {
    stdio: 'inherit',
    env: { ...process.env, ONNXTRAIN_WEB_REFERENCE: reference },
  });
  process.exitCode = run.status ?? 1;
} finally {
  rmSync(reference, { recursive: true, force: true });
}
