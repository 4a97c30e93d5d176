/**
 * Write a checkpoint's contents as ONNX Runtime's `ODTC` version 2 flatbuffer.
 *
 * The tables are built in the order onnxtrain's Python writer builds them
 * (`onnxtrain/checkpoint/format.py`, as ONNX Runtime's `FromCheckpointState`
 * writes a state), with the same `flatbuffers` builder algorithm, so the same
 * state gives the same bytes in JavaScript and in Python: `module_state` with
 * both parameter vectors sorted by name; one optimizer group `group0` (only
 * with `includeOptimizerState`) whose per-parameter moments are tensors
 * `momentum0`, `momentum1`, ...; the property bag only when there are
 * properties, each kind sorted by name.
 * @module
 */

import { Builder } from 'flatbuffers';

import { byType } from './dtypes.js';
import * as S from './schema.js';

/** @typedef {import('./state.js').StateTensor} StateTensor */
/** @typedef {import('./state.js').CheckpointContents} CheckpointContents */

/** The property Python's runtime writes when it saves a state without the optimizer state after optimizer steps. */
export const OPTIMIZER_STATE_DROPPED = 'onnxtrain.optimizer_state_dropped_at_step';

/**
 * The checkpoint file's bytes.
 * @param {CheckpointContents} contents
 * @param {boolean} includeOptimizerState
 * @returns {Uint8Array}
 */
export function encode(contents, includeOptimizerState) {
  const b = new Builder(1024);
  const moduleState = writeModuleState(b, contents);
  const optimizer = includeOptimizerState ? contents.optimizer : null;
  const groups = optimizer !== null ? [writeOptimizerGroup(b, optimizer)] : [];
  const properties = new Map(contents.properties);
  // as Python's runtime: a save without the optimizer state after optimizer steps records their count, so that a
  // resume can say its moments restart; a save with it drops that record
  if (optimizer !== null) properties.delete(OPTIMIZER_STATE_DROPPED);
  else if (contents.optimizer !== null && contents.optimizer.step > 0) {
    properties.set(OPTIMIZER_STATE_DROPPED, BigInt(contents.optimizer.step));
  }
  const bag = properties.size ? writePropertyBag(b, properties) : null;
  const groupVector = offsets(b, groups);
  b.startObject(S.Checkpoint.COUNT);
  b.addFieldInt32(S.Checkpoint.VERSION, S.VERSION, 0);
  b.addFieldOffset(S.Checkpoint.MODULE_STATE, moduleState, 0);
  b.addFieldOffset(S.Checkpoint.OPTIMIZER_GROUPS, groupVector, 0);
  if (bag !== null) b.addFieldOffset(S.Checkpoint.PROPERTY_BAG, bag, 0);
  b.finish(b.endObject(), S.FILE_IDENTIFIER);
  return b.asUint8Array().slice();
}

/**
 * Sort names as Python's `sorted` does: by code point.
 * @param {string} a
 * @param {string} b
 */
export function byCodePoint(a, b) {
  const x = Array.from(a, (c) => /** @type {number} */ (c.codePointAt(0)));
  const y = Array.from(b, (c) => /** @type {number} */ (c.codePointAt(0)));
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

/**
 * A vector of table offsets.
 * @param {Builder} b
 * @param {number[]} items
 */
function offsets(b, items) {
  b.startVector(4, items.length, 4);
  for (let i = items.length - 1; i >= 0; i--) b.addOffset(items[i]);
  return b.endVector();
}

/**
 * @param {Builder} b
 * @param {string} name
 * @param {StateTensor} tensor
 * @param {boolean} nominal
 */
function writeTensor(b, name, tensor, nominal) {
  const type = /** @type {import('./dtypes.js').ElementType} */ (byType(tensor.type));
  const nameOffset = b.createString(name);
  b.startVector(8, tensor.dims.length, 8);
  for (let i = tensor.dims.length - 1; i >= 0; i--) b.addInt64(BigInt(tensor.dims[i]));
  const dims = b.endVector();
  const data = tensor.data;
  const raw = b.createByteVector(
    nominal || data === null ? new Uint8Array(0) : new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  );
  b.startObject(S.Tensor.COUNT);
  b.addFieldOffset(S.Tensor.NAME, nameOffset, 0);
  b.addFieldOffset(S.Tensor.DIMS, dims, 0);
  b.addFieldInt32(S.Tensor.DATA_TYPE, type.code, 0);
  b.addFieldOffset(S.Tensor.RAW_DATA, raw, 0);
  b.addFieldInt64(S.Tensor.EXTERNAL_DATA_OFFSET, -1n, -1n);
  return b.endObject();
}

/**
 * @param {Builder} b
 * @param {Map<string, StateTensor>} tensors
 * @param {boolean} nominal
 */
function writeTensors(b, tensors, nominal) {
  const names = [...tensors.keys()].sort(byCodePoint);
  return offsets(
    b,
    names.map((name) => writeTensor(b, name, /** @type {StateTensor} */ (tensors.get(name)), nominal)),
  );
}

/**
 * @param {Builder} b
 * @param {CheckpointContents} contents
 */
function writeModuleState(b, contents) {
  const trainable = writeTensors(b, contents.trainable, contents.isNominal);
  const frozen = writeTensors(b, contents.frozen, contents.isNominal);
  b.startObject(S.ModuleState.COUNT);
  b.addFieldOffset(S.ModuleState.REQUIRES_GRAD_PARAMS, trainable, 0);
  b.addFieldOffset(S.ModuleState.FROZEN_PARAMS, frozen, 0);
  b.addFieldInt8(S.ModuleState.IS_NOMINAL_STATE, contents.isNominal ? 1 : 0, 0);
  return b.endObject();
}

/**
 * @param {Builder} b
 * @param {import('./state.js').OptimizerState} optimizer
 */
function writeOptimizerGroup(b, optimizer) {
  const states = [];
  for (const name of [...optimizer.moments.keys()].sort(byCodePoint)) {
    const moments = /** @type {StateTensor[]} */ (optimizer.moments.get(name));
    const order = moments.map((_, i) => i).sort((i, j) => byCodePoint(`momentum${i}`, `momentum${j}`));
    const momentums = offsets(
      b,
      order.map((i) => writeTensor(b, `momentum${i}`, moments[i], false)),
    );
    const paramName = b.createString(name);
    b.startObject(S.ParameterOptimizerState.COUNT);
    b.addFieldOffset(S.ParameterOptimizerState.PARAM_NAME, paramName, 0);
    b.addFieldOffset(S.ParameterOptimizerState.MOMENTUMS, momentums, 0);
    states.push(b.endObject());
  }
  const groupName = b.createString(S.GROUP_NAME);
  const stateVector = offsets(b, states);
  b.startObject(S.OptimizerGroup.COUNT);
  b.addFieldOffset(S.OptimizerGroup.GROUP_NAME, groupName, 0);
  b.addFieldInt64(S.OptimizerGroup.STEP, BigInt(optimizer.step), 0n);
  float32Field(b, S.OptimizerGroup.INITIAL_LEARNING_RATE, optimizer.initialLearningRate);
  b.addFieldOffset(S.OptimizerGroup.OPTIMIZER_STATES, stateVector, 0);
  return b.endObject();
}

/**
 * @param {Builder} b
 * @param {Map<string, import('./state.js').PropertyValue>} properties
 */
function writePropertyBag(b, properties) {
  /** @type {{bigint: number[], number: number[], string: number[]}} */
  const kinds = { bigint: [], number: [], string: [] };
  for (const name of [...properties.keys()].sort(byCodePoint)) {
    const value = /** @type {import('./state.js').PropertyValue} */ (properties.get(name));
    const nameOffset = b.createString(name);
    const valueOffset = typeof value === 'string' ? b.createString(value) : 0;
    b.startObject(S.Property.COUNT);
    b.addFieldOffset(S.Property.NAME, nameOffset, 0);
    if (typeof value === 'string') b.addFieldOffset(S.Property.VALUE, valueOffset, 0);
    else if (typeof value === 'bigint') b.addFieldInt64(S.Property.VALUE, value, 0n);
    else float32Field(b, S.Property.VALUE, value);
    kinds[/** @type {'bigint' | 'number' | 'string'} */ (typeof value)].push(b.endObject());
  }
  const ints = offsets(b, kinds.bigint);
  const floats = offsets(b, kinds.number);
  const strings = offsets(b, kinds.string);
  b.startObject(S.PropertyBag.COUNT);
  b.addFieldOffset(S.PropertyBag.INTS, ints, 0);
  b.addFieldOffset(S.PropertyBag.FLOATS, floats, 0);
  b.addFieldOffset(S.PropertyBag.STRINGS, strings, 0);
  return b.endObject();
}

/**
 * A float32 field, left out only for +0 (its default): -0 and NaNs keep their bits, as the Python writer does.
 * @param {Builder} b
 * @param {number} slot
 * @param {number} value
 */
function float32Field(b, slot, value) {
  if (Object.is(value, 0)) return;
  b.addFloat32(value);
  b.slot(slot);
}
