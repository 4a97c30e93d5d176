/**
 * A static server for the demo and the benchmark page: web/ at `/`, the demo's generated files at `/assets/`,
 * with the cross-origin isolation headers that WebAssembly threads need (SharedArrayBuffer).
 *
 *     node demo/serve.js [--port 8000] [--assets demo/assets]
 * @module
 */

import { createReadStream, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, extname, join, resolve, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const WEB = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** @type {Record<string, string>} */
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
  '.map': 'application/json',
};

/**
 * The file a URL path names under `base`, or `null` outside it or missing.
 * @param {string} base
 * @param {string} path
 * @returns {string | null}
 */
function fileUnder(base, path) {
  const file = resolve(base, `.${sep}${decodeURIComponent(path)}`);
  if (file !== base && !file.startsWith(base + sep)) return null;
  try {
    return statSync(file).isFile() ? file : statSync(file).isDirectory() ? fileUnder(file, 'index.html') : null;
  } catch {
    return null;
  }
}

/**
 * Start the server; resolves when it listens.
 * @param {{ port?: number, assets?: string, host?: string }} [options] port 0 picks a free one
 * @returns {Promise<{ url: string, close: () => Promise<void> }>}
 */
export function startServer({ port = 8000, assets = join(WEB, 'demo', 'assets'), host = '127.0.0.1' } = {}) {
  const assetsDir = resolve(assets);
  const server = createServer((request, response) => {
    const path = new URL(request.url ?? '/', 'http://localhost').pathname;
    const file = path.startsWith('/assets/') ? fileUnder(assetsDir, path.slice('/assets/'.length)) : fileUnder(WEB, path);
    if (file === null) {
      response.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${path}\n`);
      return;
    }
    response.writeHead(200, {
      'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
      'cross-origin-opener-policy': 'same-origin',
      'cross-origin-embedder-policy': 'require-corp',
      'cache-control': 'no-store',
    });
    createReadStream(file).pipe(response);
  });
  return new Promise((resolvePromise, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      const address = /** @type {import('node:net').AddressInfo} */ (server.address());
      resolvePromise({
        url: `http://${host}:${address.port}`,
        close: () => new Promise((done) => server.close(() => done())),
      });
    });
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const args = process.argv.slice(2);
  const option = (/** @type {string} */ name) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const { url } = await startServer({ port: Number(option('--port') ?? 8000), assets: option('--assets') });
  console.log(`onnxtrain-web demo: ${url}/demo/  (Ctrl-C stops)`);
}
