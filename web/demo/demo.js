/**
 * The demo page: trains the digits MLP with onnxtrain-web on onnxruntime-web, draws the loss of every step as
 * it goes, and measures the accuracy on the held-out digits at the end.
 *
 * URL parameters (for the tests and the benchmark): `backend=wasm|webgpu`, `epochs=N`, `steps=N` (stop after
 * N steps), `threads=N` (WebAssembly threads; 1 turns them off), `autorun=1`. The results (losses, accuracy,
 * the parameters after training) are in `window.onnxtrainDemo`; the losses also, as JSON, in the hidden `#losses`.
 * @module
 */

import { TrainingSession, ort } from 'onnxtrain-web/web';

import { drawLosses } from './chart.js';
import { loadDigits, rows } from './digits.js';

const ASSETS = '/assets';
const params = new URLSearchParams(location.search);
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
const backendSelect = /** @type {HTMLSelectElement} */ ($('backend'));
const epochsInput = /** @type {HTMLInputElement} */ ($('epochs'));
const button = /** @type {HTMLButtonElement} */ ($('train'));
const canvas = /** @type {HTMLCanvasElement} */ ($('chart'));

/**
 * What the page reports, read by the browser test.
 * @type {{ state: string, backend: string, losses: number[], accuracy: number | null, error: string | null, msPerStep: number | null, parameters: { name: string, values: number[] }[] }}
 */
const result = { state: 'ready', backend: 'wasm', losses: [], accuracy: null, error: null, msPerStep: null, parameters: /** @type {{ name: string, values: number[] }[]} */ ([]) };
Object.assign(window, { onnxtrainDemo: result });

if (params.has('threads')) ort.env.wasm.numThreads = Number(params.get('threads'));
backendSelect.value = params.get('backend') === 'webgpu' ? 'webgpu' : 'wasm';
if (params.has('epochs')) epochsInput.value = String(params.get('epochs'));

/** Why WebGPU cannot be used here, or `null` when it can. */
async function webgpuMissing() {
  const gpu = /** @type {any} */ (navigator).gpu;
  if (!gpu) return 'this browser has no WebGPU (navigator.gpu is missing)';
  try {
    return (await gpu.requestAdapter()) ? null : 'the browser found no WebGPU adapter';
  } catch (error) {
    return `WebGPU failed: ${/** @type {Error} */ (error).message}`;
  }
}

/** Train, live; then the held-out accuracy. */
async function train() {
  button.disabled = true;
  $('message').textContent = '';
  $('accuracy').textContent = '-';
  Object.assign(result, { state: 'running', losses: [], accuracy: null, error: null, msPerStep: null, parameters: [] });
  let backend = backendSelect.value;
  if (backend === 'webgpu') {
    const missing = await webgpuMissing();
    if (missing) {
      $('message').textContent = `${missing}: training on WebAssembly instead.`;
      backend = 'wasm';
      backendSelect.value = 'wasm';
    }
  }
  result.backend = backend;
  const digits = await loadDigits(ASSETS);
  const session = await TrainingSession.create(
    {
      checkpointState: `${ASSETS}/artifacts/checkpoint`,
      trainModel: `${ASSETS}/artifacts/training_model.onnx`,
      evalModel: `${ASSETS}/artifacts/eval_model.onnx`,
      optimizerModel: `${ASSETS}/artifacts/optimizer_model.onnx`,
    },
    { executionProviders: [backend] },
  );
  try {
    const rate = session.checkpointState.properties.get('onnxtrain.learning_rate'); // onnxtrain generate --lr
    if (typeof rate === 'number') session.setLearningRate(rate);
    const { train: count, batchSize } = digits.manifest;
    const stepsPerEpoch = Math.ceil(count / batchSize);
    const epochs = Math.max(1, Number(epochsInput.value) || 1);
    const limit = params.has('steps') ? Number(params.get('steps')) : Infinity;
    const loss = session.trainingOutputNames[0];
    const started = performance.now();
    let drawn = performance.now();
    for (let epoch = 0; epoch < epochs && result.losses.length < limit; epoch++) {
      for (let start = 0; start < count && result.losses.length < limit; start += batchSize) {
        const out = await session.runTrainStep(rows(ort.Tensor, digits, start, Math.min(start + batchSize, count)));
        await session.runOptimizerStep();
        await session.lazyResetGrad();
        result.losses.push(Number(out[loss].data[0]));
        if (performance.now() - drawn > 50) {
          drawLosses(canvas, result.losses, stepsPerEpoch);
          $('status').textContent = `epoch ${epoch + 1}/${epochs}, step ${result.losses.length}: loss ${result.losses.at(-1)?.toFixed(4)}`;
          await new Promise(requestAnimationFrame); // let the page draw
          drawn = performance.now();
        }
      }
    }
    result.msPerStep = (performance.now() - started) / result.losses.length;
    result.parameters = session.parameterNames.map((name) => ({
      name,
      values: Array.from(/** @type {Float32Array} */ (session.checkpointState.getParameter(name).data)),
    }));
    drawLosses(canvas, result.losses, stepsPerEpoch);
    const scores = session.evalOutputNames[1];
    const heldOut = await session.runEvalStep(rows(ort.Tensor, digits, count, digits.manifest.count), [scores]);
    result.accuracy = accuracy(/** @type {Float32Array} */ (heldOut[scores].data), digits.labels.subarray(count), digits.manifest.classes);
    $('accuracy').textContent = `${(100 * result.accuracy).toFixed(1)}% of ${digits.manifest.count - count} digits`;
    $('status').textContent =
      `${result.losses.length} steps on ${backend === 'wasm' ? `WebAssembly (${threadsText(ort.env.wasm.numThreads)})` : 'WebGPU'}: ` +
      `${result.msPerStep.toFixed(2)} ms per step; final loss ${result.losses.at(-1)?.toFixed(4)}`;
    $('losses').textContent = JSON.stringify(result.losses);
    result.state = 'done';
  } finally {
    await session.release();
    button.disabled = false;
  }
}

/**
 * `1 thread`, `2 threads`, or onnxruntime-web's default.
 * @param {number | undefined} threads
 */
function threadsText(threads) {
  return threads === undefined ? "onnxruntime-web's default threads" : `${threads} thread${threads === 1 ? '' : 's'}`;
}

/**
 * The share of rows whose highest score is the label.
 * @param {Float32Array} scores [n, classes]
 * @param {BigInt64Array} labels [n]
 * @param {number} classes
 */
function accuracy(scores, labels, classes) {
  let right = 0;
  for (let i = 0; i < labels.length; i++) {
    const row = scores.subarray(i * classes, (i + 1) * classes);
    if (BigInt(row.indexOf(Math.max(...row))) === labels[i]) right++;
  }
  return right / labels.length;
}

/** Run `train`, showing an error on the page (and to the test) instead of losing it. */
function start() {
  train().catch((error) => {
    result.state = 'error';
    result.error = String(error?.stack ?? error);
    $('message').textContent = `Training failed: ${error?.message ?? error}`;
    button.disabled = false;
  });
}

button.addEventListener('click', start);
drawLosses(canvas, [], 1);
if (params.get('autorun') === '1') start();
