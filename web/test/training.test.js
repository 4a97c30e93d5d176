// Training in Node.js on onnxruntime-node: the same numbers as onnxtrain's Python runtime, step by step,
// checkpoints that move both ways, parameter buffers, gradient accumulation, and the errors.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';

import { TrainingSession as Unbound } from 'onnxtrain-web';
import { CheckpointState, TrainingSession, ort, saveCheckpoint } from 'onnxtrain-web/node';

import { labelError } from '../src/session/label-error.js';
import { readModelHeader } from '../src/session/model-proto.js';

import { assertClose, compareRun, loadCase, loadRun, python, referenceDir, temporaryDir } from './helpers.js';

/** @type {string} */
let reference;
before(() => {
  reference = referenceDir();
});

/**
 * A session over a case's artifacts, at the test's learning rate.
 * @param {import('./helpers.js').Case} c
 * @param {CheckpointState | string} [checkpointState]
 */
async function open(c, checkpointState = join(c.artifacts, 'checkpoint')) {
  const session = await TrainingSession.create({
    checkpointState,
    trainModel: join(c.artifacts, 'training_model.onnx'),
    evalModel: join(c.artifacts, 'eval_model.onnx'),
    optimizerModel: join(c.artifacts, 'optimizer_model.onnx'),
  });
  session.setLearningRate(c.manifest.learningRate);
  return session;
}

/**
 * A batch as onnxruntime tensors.
 * @param {import('./helpers.js').Case} c
 * @param {number} step
 */
function feeds(c, step) {
  return Object.fromEntries(Object.entries(c.batch(step)).map(([name, v]) => [name, new ort.Tensor(/** @type {any} */ (v.type), v.data, v.dims)]));
}

/**
 * Train steps `from` .. `to - 1` (each a list of micro-batches), as reference.py does; the losses and the
 * parameters after each optimizer step.
 * @param {TrainingSession} session
 * @param {import('./helpers.js').Case} c
 * @param {number[][]} steps
 */
async function train(session, c, steps) {
  /** @type {number[]} */
  const losses = [];
  const params = [/** @type {Float32Array} */ ((await session.getContiguousParameters(false)).data)];
  for (const microBatches of steps) {
    for (const step of microBatches) {
      const out = await session.runTrainStep(feeds(c, step));
      losses.push(Number(out[session.trainingOutputNames[0]].data[0]));
    }
    await session.runOptimizerStep();
    await session.lazyResetGrad();
    params.push(/** @type {Float32Array} */ ((await session.getContiguousParameters(false)).data));
  }
  return { losses, params };
}

/**
 * Compare a run with Python's (helpers.compareRun), the parameters laid out as the session's.
 * @param {TrainingSession} session
 * @param {{ losses: number[], params: Float32Array[] }} run
 * @param {{ losses: number[], params: Float32Array }} expected
 * @param {number} firstStep the step count the run starts at
 * @param {string} what
 * @param {number} [expectedFrom] where the run starts in `expected` (default `firstStep`)
 */
function compare(session, run, expected, firstStep, what, expectedFrom = firstStep) {
  const names = session.parameterNames;
  const sizes = names.map((name) => session.checkpointState.getParameter(name).data?.length ?? 0);
  compareRun(run, expected, { names, sizes }, { what, firstStep, expectedFrom });
}

const range = (/** @type {number} */ from, /** @type {number} */ to) => Array.from({ length: to - from }, (_, i) => [from + i]);

describe('the same numbers as Python', () => {
  for (const name of ['mlp', 'cnn']) {
    test(`${name}: 20 steps, every loss and every parameter after every step, then an eval step`, async () => {
      const c = loadCase(reference, name);
      const session = await open(c);
      const python = loadRun(c.dir, 'python');
      compare(session, await train(session, c, range(0, c.manifest.steps)), python, 0, name);
      assert.equal(session.checkpointState.optimizer?.step, c.manifest.steps);
      // the eval model: inference-mode BatchNormalization reads the running statistics the train steps carried
      const evaluated = await session.runEvalStep(feeds(c, 0));
      assertClose([Number(evaluated[session.evalOutputNames[0]].data[0])], [python.evalLoss], `${name}: eval loss`);
      await session.release();
    });
  }

  test('mlp: gradient accumulation, two train steps per optimizer step', async () => {
    const c = loadCase(reference, 'mlp');
    const session = await open(c);
    const pairs = Array.from({ length: c.manifest.steps / 2 }, (_, k) => [2 * k, 2 * k + 1]);
    compare(session, await train(session, c, pairs), loadRun(c.dir, 'accumulate'), 0, 'accumulate');
  });
});

describe('dynamic loss scaling (artifacts with loss_scaling=True)', () => {
  test('a batch with an infinite gradient is skipped and backs the scale off; the rest trains as without scaling', async () => {
    const c = loadCase(reference, 'mlp');
    const scaledArtifacts = join(c.dir, 'artifacts-scaled');
    const scaled = await open({ ...c, artifacts: scaledArtifacts });
    const plain = await open(c);
    const scaler = (/** @type {string} */ name) => Number(scaled.checkpointState.getParameter(name).data?.[0]);
    for (const step of [0, 1, -1, 2, 3]) {
      if (step < 0) {
        const bad = feeds(c, 0);
        const pixels = /** @type {any} */ (bad[c.manifest.inputs[0].name]);
        bad[c.manifest.inputs[0].name] = new ort.Tensor('float32', new Float32Array(pixels.size).fill(Infinity), pixels.dims);
        await scaled.runTrainStep(bad);
        await scaled.runOptimizerStep();
        await scaled.lazyResetGrad();
        assert.deepEqual([scaler('loss_scale'), scaler('loss_scale.last_step_skipped'), scaler('loss_scale.skipped_steps')], [32768, 1, 1]);
        continue;
      }
      for (const session of [scaled, plain]) {
        await session.runTrainStep(feeds(c, step));
        await session.runOptimizerStep();
        await session.lazyResetGrad();
      }
    }
    // scaling by a power of two is exact in float32: the parameters are bit for bit those of the unscaled run
    for (const name of plain.parameterNames) {
      assert.deepEqual(scaled.checkpointState.getParameter(name).data, plain.checkpointState.getParameter(name).data, name);
    }
    assert.deepEqual([scaler('loss_scale'), scaler('loss_scale.last_step_skipped'), scaler('loss_scale.growth_tracker')], [32768, 0, 2]);
    await scaled.release();
    await plain.release();
  });
});

describe('checkpoints move between Python and JavaScript', () => {
  for (const name of ['mlp', 'cnn']) {
    test(`${name}: Python's checkpoint after 10 steps resumes in JavaScript on Python's course`, async () => {
      const c = loadCase(reference, name);
      const { saveAt, steps } = c.manifest;
      const state = await CheckpointState.loadCheckpoint(join(c.dir, `python-${saveAt}.ckpt`));
      const session = await open(c, state);
      assert.equal(session.getLearningRate(), Math.fround(c.manifest.learningRate));
      compare(session, await train(session, c, range(saveAt, steps)), loadRun(c.dir, 'python'), saveAt, `${name} resumed`);
    });

    test(`${name}: JavaScript's checkpoint after 10 steps resumes in Python on JavaScript's course`, async () => {
      const c = loadCase(reference, name);
      const { saveAt, steps } = c.manifest;
      const session = await open(c);
      await train(session, c, range(0, saveAt));
      const saved = session.checkpointState.toBuffer({ includeOptimizerState: true });
      const dir = temporaryDir('onnxtrain-web-resume-');
      await saveCheckpoint(session.checkpointState, join(dir, 'js.ckpt'), { includeOptimizerState: true });
      assert.deepEqual(readdirSync(dir), ['js.ckpt'], 'no temporary file left');
      python('resume', c.dir, join(dir, 'js.ckpt'), String(saveAt), String(steps - saveAt), join(dir, 'python'));
      assert.deepEqual(new Uint8Array(readFileSync(join(dir, 'python.resaved'))), saved, "Python's save of the loaded state is JavaScript's bytes");
      const rest = await train(session, c, range(saveAt, steps));
      compare(session, rest, loadRun(dir, 'python'), saveAt, `${name} resumed in Python`, 0);
    });
  }
});

describe('parameter buffers (federated learning)', () => {
  test('getContiguousParameters / loadParametersBuffer round trip, sizes, and a federated average', async () => {
    const c = loadCase(reference, 'mlp');
    const a = await open(c);
    const b = await open(c);
    assert.equal(await a.getParametersSize(), 64 * 64 + 64 + 64 * 10 + 10);
    assert.equal(await a.getParametersSize(false), await a.getParametersSize(true));
    await train(a, c, range(0, 3));
    await train(b, c, range(3, 6));
    const pa = /** @type {Float32Array} */ ((await a.getContiguousParameters(true)).data);
    const pb = /** @type {Float32Array} */ ((await b.getContiguousParameters(true)).data);
    assert.notDeepEqual(pa, pb);
    const average = pa.map((v, i) => (v + pb[i]) / 2);
    await a.loadParametersBuffer(new Uint8Array(average.buffer), true); // ONNX Runtime's form: the bytes
    await b.loadParametersBuffer(average); // a Float32Array
    const pooled = Buffer.from(new ArrayBuffer(average.byteLength + 16), 8, average.byteLength); // a Node Buffer, a view
    pooled.set(new Uint8Array(average.buffer));
    const c2 = await open(c);
    await c2.loadParametersBuffer(pooled);
    assert.deepEqual((await c2.getContiguousParameters()).data, average);
    assert.deepEqual((await a.getContiguousParameters()).data, average);
    assert.deepEqual((await b.getContiguousParameters()).data, average);
    assert.deepEqual(a.checkpointState.getParameter('linear.bias_7').data, average.subarray(64 * 64 + 64 + 64 * 10));
    await assert.rejects(a.loadParametersBuffer(average.subarray(1)), /holds 4809 float32 values, but the 4 parameters take 4810/);
    assert.deepEqual((await a.getContiguousParameters()).data, average, 'a refused buffer writes nothing');
    // a session on a nominal checkpoint gets its values from a buffer
    const nominal = CheckpointState.fromBuffer(readFileSync(join(c.artifacts, 'checkpoint')));
    for (const [name, t] of nominal.trainable) nominal.trainable.set(name, { ...t, data: null });
    nominal.isNominal = true;
    const fresh = await open(c, CheckpointState.fromBuffer(nominal.toBuffer()));
    await assert.rejects(fresh.runTrainStep(feeds(c, 0)), /^Error: Cannot perform TrainStep with a nominal state. Please load the model parameters first./);
    await assert.rejects(fresh.getContiguousParameters(), /Cannot copy parameters from a nominal checkpoint state/);
    await fresh.loadParametersBuffer(average, false);
    const after = await train(fresh, c, range(0, 1));
    const reference2 = await open(c);
    await reference2.loadParametersBuffer(average);
    const expected = await train(reference2, c, range(0, 1));
    assert.deepEqual(after.params[1], expected.params[1]);
  });
});

describe('lazyResetGrad and the optimizer step', () => {
  test('no optimizer step without gradients; a reset discards the accumulated ones', async () => {
    const c = loadCase(reference, 'mlp');
    const session = await open(c);
    await assert.rejects(session.runOptimizerStep(), /runOptimizerStep before any train step: there are no gradients to apply/);
    await session.runTrainStep(feeds(c, 5)); // accumulated, then discarded by the reset
    await session.lazyResetGrad();
    await assert.rejects(session.runOptimizerStep(), /runOptimizerStep after lazyResetGrad\(\): there are no gradients/);
    const run = await train(session, c, range(0, 2));
    const fresh = await open(c);
    assert.deepEqual(run.params, (await train(fresh, c, range(0, 2))).params);
    assert.equal(session.checkpointState.optimizer?.step, 2);
  });

  test('the learning rate: float32, validated, stored as the initial rate', async () => {
    const c = loadCase(reference, 'mlp');
    const session = await open(c);
    session.setLearningRate(0.1);
    assert.equal(session.getLearningRate(), Math.fround(0.1));
    assert.equal(session.checkpointState.optimizer?.initialLearningRate, Math.fround(0.1));
    assert.throws(() => session.setLearningRate(-1), /finite number >= 0/);
    assert.throws(() => session.setLearningRate(NaN), /finite number >= 0/);
  });

  test('an eval step gives the loss of the same parameters', async () => {
    const c = loadCase(reference, 'mlp');
    const session = await open(c);
    const evaluated = await session.runEvalStep(feeds(c, 0));
    const trained = await session.runTrainStep(feeds(c, 0));
    const loss = session.trainingOutputNames[0];
    assert.deepEqual(session.evalOutputNames, session.trainingOutputNames);
    assert.equal(evaluated[loss].data[0], trained[loss].data[0]);
    assert.deepEqual(Object.keys(await session.runEvalStep(feeds(c, 0), [loss])), [loss]);
    assert.deepEqual(Object.keys(await session.runEvalStep(feeds(c, 0), { [loss]: null })), [loss]);
    await assert.rejects(session.runEvalStep(feeds(c, 0), ['nothing']), /no output\(s\) \["nothing"\]; the outputs are/);
  });
});

describe('bad input gets a clear error', () => {
  test('batches of the wrong type or shape, missing or extra inputs', async () => {
    const c = loadCase(reference, 'mlp');
    const session = await open(c);
    const good = feeds(c, 0);
    const labels = good.labels;
    const cases = /** @type {[Record<string, any>, RegExp][]} */ ([
      [{ pixels: new ort.Tensor('float64', new Float64Array(32 * 64), [32, 64]), labels }, /input 'pixels' of the training model is float32\[batch, 64\]; got float64\[32, 64\]/],
      [{ pixels: new ort.Tensor('float32', new Float32Array(32 * 63), [32, 63]), labels }, /float32\[batch, 64\]; got float32\[32, 63\]: axis 1 must be 64/],
      [{ pixels: new ort.Tensor('float32', new Float32Array(32 * 64), [32, 8, 8]), labels }, /rank 2.*got float32\[32, 8, 8\] \(rank 3\)/],
      [{ pixels: good.pixels, labels: new ort.Tensor('int64', new BigInt64Array(16), [16]) }, /'batch' is 32 in input 'pixels' but 16 in input 'labels'/],
      [{ pixels: good.pixels }, /the training model's input 'labels' \(int64\[batch\]\) is missing; it takes pixels: float32\[batch, 64\], labels: int64\[batch\]/],
      [{ ...good, images: good.pixels }, /has no input\(s\) \["images"\]/],
      [{ pixels: new Float32Array(32 * 64), labels }, /input 'pixels' must be an onnxruntime Tensor/],
    ]);
    for (const [bad, message] of cases) await assert.rejects(session.runTrainStep(bad), message);
    await assert.rejects(session.runEvalStep({ pixels: good.pixels }), /runEvalStep: the eval model's input 'labels'/);
    const wrong = BigInt64Array.from(/** @type {BigInt64Array} */ (labels.data));
    wrong[3] = 10n;
    wrong[7] = -1n;
    await assert.rejects(
      session.runTrainStep({ pixels: good.pixels, labels: new ort.Tensor('int64', wrong, [32]) }),
      /^Error: train step 1: class labels are out of range for the loss \(10 classes\): 10 at \[3\] of 'labels', -1 at \[7\] of 'labels'. Labels must be in \[0, 10\)/,
    );
    // nothing ran: the first real step gives Python's first loss
    const out = await session.runTrainStep(good);
    assertClose([Number(out[session.trainingOutputNames[0]].data[0])], [loadRun(c.dir, 'python').losses[0]], 'first loss');
  });

  test('labels out of range are explained on every backend: the checked labels alone, the ignored one left out', async () => {
    const c = loadCase(reference, 'mlp');
    const header = readModelHeader(readFileSync(join(c.artifacts, 'training_model.onnx')));
    assert.deepEqual(
      header?.labelChecks.map((check) => [check.labels, check.classes, check.ignoreIndex]),
      [['labels', 10, null]],
    );
    // onnxruntime-web's WebAssembly and WebGPU messages name no node: the model's checks and the [K, C, 2] shape tell it
    const web = '[WebAssembly] Non-zero status code returned while running Reshape node. Status Message: ' +
      'reshape_helper.h:40 ReshapeHelper size != 0 && (input_shape_size % size) == 0 was false. The input tensor ' +
      'cannot be reshaped to the requested shape. Input shape:{4}, requested shape:{2,10,2}';
    const ids = new ort.Tensor('int64', BigInt64Array.from([10n, 20n, 3n]), [3]);
    const labels = new ort.Tensor('int64', BigInt64Array.from([-100n, 7n, 12n]), [3]);
    const checks = [{ loss: 'CrossEntropyLoss', labels: 'labels', classes: 10, ignoreIndex: -100 }];
    assert.equal(
      labelError(web, { ids, labels }, 'train step 2', checks),
      "train step 2: class labels are out of range for the loss (10 classes): 12 at [2] of 'labels'. Labels must be in " +
        '[0, 10) or equal its ignore_index -100; the state is as before the step',
    );
    assert.equal(labelError(web, { ids, labels }, 'train step 2'), null); // no check known, no node named
    assert.equal(labelError('Status Message: something else', { labels }, 'train step 2', checks), null);
  });

  test('missing or wrong models and checkpoints', async () => {
    const c = loadCase(reference, 'mlp');
    const cnn = loadCase(reference, 'cnn');
    const model = join(c.artifacts, 'training_model.onnx');
    const checkpoint = join(c.artifacts, 'checkpoint');
    await assert.rejects(Unbound.create({ checkpointState: checkpoint, trainModel: model }), /import \{ TrainingSession \} from 'onnxtrain-web\/node'/);
    await assert.rejects(TrainingSession.create(/** @type {any} */ ({ checkpointState: checkpoint })), /trainModel is missing; give training_model.onnx/);
    await assert.rejects(TrainingSession.create(/** @type {any} */ ({ trainModel: model })), /checkpointState is missing/);
    await assert.rejects(TrainingSession.create({ checkpointState: checkpoint, trainModel: join(c.dir, 'nothing.onnx') }), /could not read the training model from .*nothing.onnx/);
    await assert.rejects(TrainingSession.create({ checkpointState: checkpoint, trainModel: checkpoint }), /the training model is not an ONNX model/);
    await assert.rejects(TrainingSession.create({ checkpointState: model, trainModel: model }), /this is not an ONNX Runtime training checkpoint/);
    await assert.rejects(TrainingSession.create({ checkpointState: checkpoint, trainModel: join(c.artifacts, 'eval_model.onnx') }), /has no 'lazy_reset_grad' input, so it is not a training model/);
    await assert.rejects(
      TrainingSession.create({ checkpointState: join(cnn.artifacts, 'checkpoint'), trainModel: model }),
      /does not take; it trains \["linear.*"\]: the checkpoint does not belong to this model/, // the model's names, not []
    );
    await assert.rejects(
      TrainingSession.create({ checkpointState: checkpoint, trainModel: model, optimizerModel: join(cnn.artifacts, 'optimizer_model.onnx') }),
      /the optimizer model updates \[".+"\], but the training model trains/,
    );
    await assert.rejects(
      TrainingSession.create({ checkpointState: checkpoint, trainModel: model, evalModel: join(cnn.artifacts, 'eval_model.onnx') }),
      /the eval model takes \[.*\], which are neither parameters of the checkpoint nor inputs of the training model .*: it comes from other artifacts/,
    );
    const proxied = { InferenceSession: ort.InferenceSession, Tensor: ort.Tensor, env: { wasm: { proxy: true } } };
    await assert.rejects(TrainingSession.createWith(proxied, { checkpointState: checkpoint, trainModel: model }), /env.wasm.proxy = false/);
    const bare = await TrainingSession.create({ checkpointState: checkpoint, trainModel: model });
    await assert.rejects(bare.runEvalStep(feeds(c, 0)), /no eval model; pass evalModel/);
    await bare.runTrainStep(feeds(c, 0));
    await assert.rejects(bare.runOptimizerStep(), /no optimizer model; pass optimizerModel/);
    await bare.release();
    await assert.rejects(bare.runTrainStep(feeds(c, 0)), /this TrainingSession was released/);
  });

  test('one step at a time', async () => {
    const c = loadCase(reference, 'mlp');
    const session = await open(c);
    const first = session.runTrainStep(feeds(c, 0));
    await assert.rejects(session.runTrainStep(feeds(c, 1)), /another step of this session is still running/);
    await assert.rejects(session.lazyResetGrad(), /a step of this session is still running/);
    await first;
  });
});
