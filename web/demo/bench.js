/**
 * The benchmark's page (benchmarks/web/run.js): times the step `runTrainStep; runOptimizerStep; lazyResetGrad`
 * of the digits MLP on one batch of 32 digits. URL parameters: `backend=wasm|webgpu`, `threads=N`,
 * `warmup=N`, `steps=N` (per repeat), `repeats=N`. The result is `window.onnxtrainBench`.
 * @module
 */

import { TrainingSession, ort } from 'onnxtrain-web/web';

import { loadDigits, rows } from './digits.js';

const ASSETS = '/assets';
const params = new URLSearchParams(location.search);
const number = (/** @type {string} */ name, /** @type {number} */ fallback) => Number(params.get(name) ?? fallback);
/** @type {{ state: string, msPerStep: number[], threads: number | undefined, backend: string, error: string | null }} */
const result = { state: 'running', msPerStep: [], threads: undefined, backend: params.get('backend') ?? 'wasm', error: null };
Object.assign(window, { onnxtrainBench: result });

/** Time the repeats. */
async function bench() {
  if (params.has('threads')) ort.env.wasm.numThreads = number('threads', 1);
  const digits = await loadDigits(ASSETS);
  const session = await TrainingSession.create(
    {
      checkpointState: `${ASSETS}/artifacts/checkpoint`,
      trainModel: `${ASSETS}/artifacts/training_model.onnx`,
      optimizerModel: `${ASSETS}/artifacts/optimizer_model.onnx`,
    },
    { executionProviders: [result.backend] },
  );
  result.threads = ort.env.wasm.numThreads;
  const batch = rows(ort.Tensor, digits, 0, digits.manifest.batchSize);
  const step = async () => {
    await session.runTrainStep(batch);
    await session.runOptimizerStep();
    await session.lazyResetGrad();
  };
  for (let i = 0; i < number('warmup', 50); i++) await step();
  for (let r = 0; r < number('repeats', 5); r++) {
    const steps = number('steps', 200);
    const started = performance.now();
    for (let i = 0; i < steps; i++) await step();
    result.msPerStep.push((performance.now() - started) / steps);
  }
  await session.release();
  /** @type {HTMLElement} */ (document.getElementById('result')).textContent = JSON.stringify(result.msPerStep);
  result.state = 'done';
}

bench().catch((error) => {
  result.error = String(error?.stack ?? error);
  result.state = 'error';
});
