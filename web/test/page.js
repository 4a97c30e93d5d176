/**
 * The browser test's page: trains one case of reference.py's data (`/assets/<case>/`: artifacts, batches)
 * as training.test.js does in Node.js, and leaves the losses and the parameters after every step in
 * `window.onnxtrainCase`. URL parameters: `case`, `backend`, `threads`.
 * @module
 */

import { TrainingSession, ort } from 'onnxtrain-web/web';

const params = new URLSearchParams(location.search);
const base = `/assets/${params.get('case')}`;
/** @type {{ state: string, error: string | null, noWebGPU: string | null, labelError: string | null, losses: number[], params: number[][], names: readonly string[], sizes: number[] }} */
const result = { state: 'running', error: null, noWebGPU: null, labelError: null, losses: [], params: [], names: [], sizes: [] };
Object.assign(window, { onnxtrainCase: result });

/** @param {string} url */
async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response;
}

/** Train the case's steps. */
async function run() {
  if (params.has('threads')) ort.env.wasm.numThreads = Number(params.get('threads'));
  if (params.get('backend') === 'webgpu') {
    const gpu = /** @type {any} */ (navigator).gpu;
    result.noWebGPU = !gpu ? 'no navigator.gpu' : (await gpu.requestAdapter()) ? null : 'no WebGPU adapter';
    if (result.noWebGPU) {
      result.state = 'done';
      return;
    }
  }
  const manifest = await (await fetchOk(`${base}/case.json`)).json();
  const inputs = /** @type {{ name: string, type: 'float32' | 'int64', dims: number[] }[]} */ (manifest.inputs);
  const arrays = await Promise.all(
    inputs.map(async (input) => {
      const bytes = await (await fetchOk(`${base}/batches/${input.name}.bin`)).arrayBuffer();
      return input.type === 'float32' ? new Float32Array(bytes) : new BigInt64Array(bytes);
    }),
  );
  const session = await TrainingSession.create(
    {
      checkpointState: `${base}/artifacts/checkpoint`,
      trainModel: `${base}/artifacts/training_model.onnx`,
      evalModel: `${base}/artifacts/eval_model.onnx`,
      optimizerModel: `${base}/artifacts/optimizer_model.onnx`,
    },
    { executionProviders: [params.get('backend') ?? 'wasm'] },
  );
  session.setLearningRate(manifest.learningRate);
  result.names = session.parameterNames;
  result.sizes = result.names.map((name) => session.checkpointState.getParameter(name).data?.length ?? 0);
  const snapshot = async () => result.params.push(Array.from(/** @type {Float32Array} */ ((await session.getContiguousParameters(false)).data)));
  await snapshot();
  /** @param {number} step */
  const batch = (step) => {
    /** @type {Record<string, import('onnxruntime-common').Tensor>} */
    const feeds = {};
    inputs.forEach((input, i) => {
      const size = input.dims.reduce((a, b) => a * b, 1);
      feeds[input.name] = new ort.Tensor(input.type, arrays[i].slice(step * size, (step + 1) * size), input.dims);
    });
    return feeds;
  };
  // on WebAssembly, a class label out of range first: the step fails with its explanation (onnxruntime-web's
  // message names no node), and the state stays as it was (WebGPU's failed runs are not tried here)
  const labels = inputs.at(-1);
  if (labels?.type === 'int64' && (params.get('backend') ?? 'wasm') === 'wasm') {
    const bad = batch(0);
    const data = BigInt64Array.from(/** @type {BigInt64Array} */ (bad[labels.name].data));
    data[1] = 1000n;
    bad[labels.name] = new ort.Tensor('int64', data, labels.dims);
    result.labelError = await session.runTrainStep(bad).then(() => 'no error', (error) => String(error?.message ?? error));
  }
  for (let step = 0; step < manifest.steps; step++) {
    const feeds = batch(step);
    const out = await session.runTrainStep(feeds);
    result.losses.push(Number(out[session.trainingOutputNames[0]].data[0]));
    await session.runOptimizerStep();
    await session.lazyResetGrad();
    await snapshot();
  }
  await session.release();
  result.state = 'done';
}

run().catch((error) => {
  result.error = String(error?.stack ?? error);
  result.state = 'error';
});
