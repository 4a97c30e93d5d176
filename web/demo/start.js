/**
 * `npm run demo`: make the demo's files if they are missing (demo/make_assets.py, with the Python that has
 * onnxtrain: `ONNXTRAIN_PYTHON`, else ../.venv/bin/python, else python3), then serve the page on localhost.
 * @module
 */

import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { startServer } from './serve.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, '..', '..');
const assets = join(HERE, 'assets');
if (!existsSync(join(assets, 'digits.json'))) {
  const venv = join(ROOT, '.venv', 'bin', 'python');
  const python = process.env.ONNXTRAIN_PYTHON ?? (existsSync(venv) ? venv : 'python3');
  console.log(`making the demo's artifacts and data in ${assets} (onnxtrain generate) with ${python}`);
  execFileSync(python, [join(HERE, 'make_assets.py'), assets], { cwd: ROOT, stdio: 'inherit' });
}
const port = Number(process.env.PORT ?? 8000);
const { url } = await startServer({ port, assets });
console.log(`onnxtrain-web demo: open ${url}/demo/ (Ctrl-C stops)`);
