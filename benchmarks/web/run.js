/**
 * The step time of the digits MLP (64-64-10, batch 32, AdamW, cross-entropy; web/demo's artifacts made by
 * `onnxtrain generate`) in onnxtrain-web on Node.js (onnxruntime-node, and onnxruntime-web's WebAssembly in
 * Node), in headless Chromium (WebAssembly with threads off and on; WebGPU where Chromium has an adapter),
 * and in onnxtrain's Python runtime, on this machine. Prints a Markdown table for docs/benchmarks.md.
 *
 *     cd web && npm run bench      # or: node benchmarks/web/run.js (after npm ci in web/)
 *     node benchmarks/web/run.js --quick   # a few steps of each, to check that it runs
 *
 * A step is `runTrainStep; runOptimizerStep; lazyResetGrad` (Python: `module(x, y); optimizer.step();
 * module.lazy_reset_grad()`) on one fixed batch, after a warm-up; each figure is the median of 5 repeats.
 * @module
 */

import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { cpus, platform, tmpdir, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from '../../web/node_modules/playwright-core/index.mjs';
import * as ortWeb from '../../web/node_modules/onnxruntime-web/dist/ort.node.min.mjs';

import { startServer } from '../../web/demo/serve.js';
import { TrainingSession, ort } from '../../web/src/node.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, '..', '..');
const PYTHON = process.env.ONNXTRAIN_PYTHON ?? (existsSync(join(ROOT, '.venv/bin/python')) ? join(ROOT, '.venv/bin/python') : 'python3');
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const QUICK = process.argv.includes('--quick');
const REPEATS = QUICK ? 2 : 5;
/** Steps per repeat, scaled down with --quick. @param {number} n */
const count = (n) => (QUICK ? Math.max(2, Math.round(n / 50)) : n);

/** @param {number[]} values */
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

/**
 * Milliseconds per step of each repeat, in this process.
 * @param {any} runtime an onnxruntime package
 * @param {string} assets
 * @param {{ warmup: number, steps: number }} counts
 * @param {object} [sessionOptions]
 */
async function timeInNode(runtime, assets, { warmup, steps }, sessionOptions) {
  const artifacts = join(assets, 'artifacts');
  const session = await TrainingSession.createWith(
    runtime,
    {
      checkpointState: join(artifacts, 'checkpoint'),
      trainModel: join(artifacts, 'training_model.onnx'),
      optimizerModel: join(artifacts, 'optimizer_model.onnx'),
    },
    sessionOptions,
  );
  session.setLearningRate(0.01);
  const manifest = JSON.parse(readFileSync(join(assets, 'digits.json'), 'utf8'));
  const raw = readFileSync(join(assets, 'digits.bin'));
  const size = manifest.batchSize;
  const pixels = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + 4 * size * manifest.features));
  const labels = BigInt64Array.from(raw.subarray(4 * manifest.count * manifest.features, 4 * manifest.count * manifest.features + size), (v) => BigInt(v));
  const batch = { pixels: new runtime.Tensor('float32', pixels, [size, manifest.features]), labels: new runtime.Tensor('int64', labels, [size]) };
  const step = async () => {
    await session.runTrainStep(batch);
    await session.runOptimizerStep();
    await session.lazyResetGrad();
  };
  for (let i = 0; i < warmup; i++) await step();
  const times = [];
  for (let r = 0; r < REPEATS; r++) {
    const started = performance.now();
    for (let i = 0; i < steps; i++) await step();
    times.push((performance.now() - started) / steps);
  }
  await session.release();
  return times;
}

/**
 * Milliseconds per step of each repeat in the bench page.
 * @param {import('playwright-core').Browser} browser
 * @param {string} url
 * @param {string} query
 */
async function timeInPage(browser, url, query) {
  const page = await browser.newPage();
  await page.goto(`${url}/demo/bench.html?repeats=${REPEATS}&${query}`);
  await page.waitForFunction(() => ['done', 'error'].includes(/** @type {any} */ (window).onnxtrainBench?.state), null, { timeout: 300_000 });
  const result = await page.evaluate(() => /** @type {any} */ (window).onnxtrainBench);
  await page.close();
  if (result.error) throw new Error(`bench page (${query}): ${result.error}`);
  return result;
}

const assets = join(mkdtempSync(join(tmpdir(), 'onnxtrain-web-bench-')), 'assets');
execFileSync(PYTHON, [join(ROOT, 'web', 'demo', 'make_assets.py'), assets], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });

/** @type {[string, number[]][]} */
const rows = [];
const pythonCounts = ['--warmup', String(count(200)), '--steps', String(count(1000)), '--repeats', String(REPEATS)];
const python = JSON.parse(execFileSync(PYTHON, [join(HERE, 'python_step.py'), assets, ...pythonCounts], { cwd: ROOT, encoding: 'utf8' }));
rows.push([`Python, onnxtrain (onnxruntime ${python.onnxruntime}), fused step (default)`, python.fused]);
rows.push([`Python, onnxtrain (onnxruntime ${python.onnxruntime}), fuse=False: two models per step`, python.unfused]);
rows.push(['Node.js, onnxtrain-web on onnxruntime-node (default session options)', await timeInNode(ort, assets, { warmup: count(200), steps: count(1000) })]);
rows.push([
  'Node.js, onnxtrain-web on onnxruntime-node, `intraOpNumThreads: 1`',
  await timeInNode(ort, assets, { warmup: count(200), steps: count(1000) }, { intraOpNumThreads: 1 }),
]);
ortWeb.env.wasm.numThreads = 1;
rows.push(["Node.js, onnxtrain-web on onnxruntime-web's WebAssembly (1 thread)", await timeInNode(ortWeb, assets, { warmup: count(300), steps: count(500) })]);

const server = await startServer({ port: 0, assets });
const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-dev-shm-usage', '--enable-unsafe-webgpu', '--use-webgpu-adapter=swiftshader'] });
try {
  for (const threads of [1, 2]) {
    const r = await timeInPage(browser, server.url, `backend=wasm&threads=${threads}&warmup=${count(300)}&steps=${count(500)}`);
    rows.push([`Chromium ${browser.version()}, WebAssembly, ${threads === 1 ? 'threads off (1)' : `threads on (${threads})`}`, r.msPerStep]);
  }
  const gpu = await timeInPage(browser, server.url, `backend=webgpu&warmup=${QUICK ? 1 : 5}&steps=${QUICK ? 2 : 20}`);
  rows.push([`Chromium ${browser.version()}, WebGPU on SwiftShader (the CPU; no GPU here)`, gpu.msPerStep]);
} finally {
  await browser.close();
  await server.close();
}

const cores = cpus();
console.log(
  `\n${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, ${cores[0].model}, ${cores.length} logical CPUs, ` +
    `${Math.round(totalmem() / 2 ** 30)} GiB, ${platform()}; Node.js ${process.version}, onnxruntime-node and onnxruntime-web ` +
    `${ort.env.versions.common}; Python's onnxruntime ${python.onnxruntime}\n`,
);
console.log(`| runtime | ms per step (median) | min - max of ${REPEATS} repeats |`);
console.log('|---|---:|---:|');
for (const [name, times] of rows) {
  console.log(`| ${name} | ${median(times).toFixed(3)} | ${Math.min(...times).toFixed(3)} - ${Math.max(...times).toFixed(3)} |`);
}
