// The checkpoint format: the bytes Python writes, read and written again byte for byte; bad files rejected.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { before, describe, test } from 'node:test';

import { CheckpointError, CheckpointState } from 'onnxtrain-web';

import { referenceDir } from './helpers.js';

/** @type {string} */
let reference;
before(() => {
  reference = referenceDir();
});

/** @param {string} path */
const bytesOf = (path) => new Uint8Array(readFileSync(path));

describe("Python's checkpoints", () => {
  for (const name of ['mlp', 'cnn']) {
    test(`${name}: the initial checkpoint and one with optimizer state are written again byte for byte`, () => {
      for (const file of [join('artifacts', 'checkpoint'), 'python-10.ckpt']) {
        const bytes = bytesOf(join(reference, name, file));
        const state = CheckpointState.fromBuffer(bytes);
        assert.deepEqual(state.toBuffer({ includeOptimizerState: true }), bytes, `${name}/${file}`);
      }
    });
  }

  test("Python's nominal checkpoint and one with properties of every kind are written again byte for byte", () => {
    const nominalBytes = bytesOf(join(reference, 'mlp', 'python-nominal.ckpt'));
    const nominal = CheckpointState.fromBuffer(nominalBytes);
    assert.equal(nominal.isNominal, true);
    assert.deepEqual(nominal.trainable.get('linear.weight_6'), { type: 'float32', dims: [64, 10], data: null });
    assert.deepEqual(nominal.toBuffer({ includeOptimizerState: true }), nominalBytes);
    const withProperties = bytesOf(join(reference, 'mlp', 'python-properties.ckpt'));
    const state = CheckpointState.fromBuffer(withProperties);
    assert.deepEqual(
      new Map([...state.properties].map(([k, v]) => [k, Object.is(v, -0) ? '-0' : v])),
      new Map(/** @type {[string, any][]} */ ([['big', -(2n ** 62n)], ['epoch', 3n], ['best', 0.25], ['negative zero', '-0'], ['run', 'α']])),
    );
    assert.deepEqual(state.toBuffer({ includeOptimizerState: true }), withProperties);
  });

  test("a Node Buffer's bytes read as the file's, also where the Buffer is a view into a larger pool", async () => {
    // readFileSync gives small files in views of a shared pool, whose slice() is a view too: the values came from
    // the pool's start
    const bytes = bytesOf(join(reference, 'mlp', 'python-10.ckpt'));
    const pool = new ArrayBuffer(bytes.length + 48);
    const view = Buffer.from(pool, 24, bytes.length);
    view.set(bytes);
    const expected = CheckpointState.fromBuffer(bytes);
    for (const state of [CheckpointState.fromBuffer(view), await CheckpointState.loadCheckpoint(view)]) {
      for (const name of expected.trainable.keys()) assert.deepEqual(state.getParameter(name), expected.getParameter(name), name);
      assert.deepEqual(state.toBuffer({ includeOptimizerState: true }), bytes);
    }
  });

  test("a save without the optimizer state after steps records their count, as Python's; a save with it drops it", () => {
    const trained = CheckpointState.fromBuffer(bytesOf(join(reference, 'mlp', 'python-10.ckpt')));
    const dropped = bytesOf(join(reference, 'mlp', 'python-dropped.ckpt'));
    assert.deepEqual(trained.toBuffer(), dropped, "Python's bytes");
    const resumed = CheckpointState.fromBuffer(dropped);
    assert.equal(resumed.properties.get('onnxtrain.optimizer_state_dropped_at_step'), 10n);
    assert.deepEqual(resumed.toBuffer({ includeOptimizerState: true }), dropped, 'no optimizer state: the record stays');
    resumed.optimizer = trained.optimizer; // as after optimizer steps in this session
    const saved = CheckpointState.fromBuffer(resumed.toBuffer({ includeOptimizerState: true }));
    assert.equal(saved.properties.has('onnxtrain.optimizer_state_dropped_at_step'), false);
  });

  test("Python's checkpoint with external data is refused with the reason", () => {
    assert.throws(
      () => CheckpointState.fromBuffer(bytesOf(join(reference, 'mlp', 'python-external.ckpt'))),
      (e) => e instanceof CheckpointError && /external <checkpoint>.data file, which onnxtrain-web does not read/.test(e.message),
    );
  });

  test('the contents: parameters, optimizer state, properties', () => {
    const state = CheckpointState.fromBuffer(bytesOf(join(reference, 'mlp', 'python-10.ckpt')));
    assert.deepEqual([...state.trainable.keys()], ['linear.bias_1', 'linear.bias_7', 'linear.weight_0', 'linear.weight_6']);
    assert.equal(state.frozen.size, 0);
    assert.deepEqual(state.getParameter('linear.weight_0').dims, [64, 64]);
    assert.equal(state.optimizer?.step, 10);
    assert.equal(state.optimizer?.moments.get('linear.bias_7')?.length, 2);
    assert.equal(state.properties.get('onnxtrain.learning_rate'), Math.fround(0.01));
    // without the optimizer state the file is shorter and has none
    const bare = CheckpointState.fromBuffer(state.toBuffer());
    assert.equal(bare.optimizer, null);
    assert.deepEqual(bare.getParameter('linear.weight_6').data, state.getParameter('linear.weight_6').data);
  });
});

describe('states made in JavaScript', () => {
  test('properties of each kind, -0 and NaN floats, a nominal state', () => {
    const state = new CheckpointState({
      trainable: new Map([['w', { type: 'float32', dims: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, -6]) }]]),
      frozen: new Map([['steps', { type: 'int64', dims: [1], data: BigInt64Array.of(7n) }]]),
      properties: new Map(/** @type {[string, any][]} */ ([['epoch', 3n], ['best', 0.25], ['neg', -0], ['nan', NaN], ['run', 'α']])),
    });
    const back = CheckpointState.fromBuffer(state.toBuffer());
    assert.deepEqual(back.properties.get('epoch'), 3n);
    assert.equal(back.properties.get('best'), 0.25);
    assert.ok(Object.is(back.properties.get('neg'), -0));
    assert.ok(Number.isNaN(back.properties.get('nan')));
    assert.equal(back.properties.get('run'), 'α');
    assert.deepEqual(back.getParameter('steps').data, BigInt64Array.of(7n));
    assert.deepEqual(back.toBuffer(), state.toBuffer());
    const nominal = new CheckpointState({ trainable: new Map([['w', { type: 'float32', dims: [2, 3], data: null }]]), isNominal: true });
    const loaded = CheckpointState.fromBuffer(nominal.toBuffer());
    assert.equal(loaded.isNominal, true);
    assert.deepEqual(loaded.trainable.get('w'), { type: 'float32', dims: [2, 3], data: null });
    assert.throws(() => loaded.getParameter('w'), /Cannot get parameter from a nominal state/);
  });

  test('a state that could not be saved is refused when made', () => {
    const w = { type: /** @type {const} */ ('float32'), dims: [2], data: Float32Array.of(1, 2) };
    assert.throws(() => new CheckpointState({ trainable: new Map([['w', { ...w, data: Float32Array.of(1) }]]) }), /holds a Float32Array of 1 elements; expected a Float32Array of 2/);
    assert.throws(
      () => new CheckpointState({ trainable: new Map([['w', w]]), optimizer: { step: 1, initialLearningRate: 0.1, moments: new Map([['w', [{ ...w, dims: [1, 2] }]]]) } }),
      /momentum0 of 'w' is float32\[1, 2\] but the parameter is float32\[2\]/,
    );
    assert.throws(() => new CheckpointState({ trainable: new Map([['w', w]]), frozen: new Map([['w', w]]) }), /both trainable and frozen/);
  });
});

describe('files that are not valid checkpoints', () => {
  test('an ONNX model, a short file, another version, a truncated file, bad data', () => {
    const model = bytesOf(join(reference, 'mlp', 'artifacts', 'training_model.onnx'));
    assert.throws(() => CheckpointState.fromBuffer(model), (e) => e instanceof CheckpointError && /this is not an ONNX Runtime training checkpoint/.test(e.message));
    assert.throws(() => CheckpointState.fromBuffer(new Uint8Array(5)), /too few for a flatbuffer/);
    const good = bytesOf(join(reference, 'mlp', 'python-10.ckpt'));
    assert.throws(() => CheckpointState.fromBuffer(good.slice(0, good.length - 100)), CheckpointError);
    for (const cut of [12, 200, 4000]) assert.throws(() => CheckpointState.fromBuffer(good.slice(0, cut)), CheckpointError, `cut at ${cut}`);
    // the version field: find the int32 2 in the root table and make it 3
    const root = new DataView(good.buffer, good.byteOffset).getUint32(0, true);
    const vtable = root - new DataView(good.buffer, good.byteOffset).getInt32(root, true);
    const versionAt = root + new DataView(good.buffer, good.byteOffset).getUint16(vtable + 4, true);
    const other = good.slice();
    new DataView(other.buffer).setInt32(versionAt, 3, true);
    assert.throws(() => CheckpointState.fromBuffer(other), /checkpoint version 3 is not supported; only version 2 is/);
    assert.throws(() => CheckpointState.fromBuffer(/** @type {any} */ ('checkpoint')), TypeError);
    // every single-byte corruption is either read or rejected with a CheckpointError, never anything else
    for (let i = 0; i < good.length; i += 97) {
      const bad = good.slice();
      bad[i] ^= 0xff;
      try {
        CheckpointState.fromBuffer(bad);
      } catch (error) {
        assert.ok(error instanceof CheckpointError, `byte ${i}: ${error}`);
      }
    }
  });

  test('loadCheckpoint reads a path, a file: URL, bytes or an ArrayBuffer alike', async () => {
    const path = join(reference, 'mlp', 'python-10.ckpt');
    const bytes = bytesOf(path);
    for (const source of [path, pathToFileURL(path), bytes, bytes.slice().buffer]) {
      assert.deepEqual((await CheckpointState.loadCheckpoint(source)).toBuffer({ includeOptimizerState: true }), bytes);
    }
  });

  test('loadCheckpoint names the file it could not read', async () => {
    await assert.rejects(CheckpointState.loadCheckpoint('/nonexistent/checkpoint'), /could not read the checkpoint from \/nonexistent\/checkpoint/);
  });
});
