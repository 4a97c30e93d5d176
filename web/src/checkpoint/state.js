/**
 * `CheckpointState`: the parameters, optimizer state and properties of a
 * checkpoint, read from and written to ONNX Runtime's on-device training
 * checkpoint format, the bytes onnxtrain's Python runtime reads and writes.
 * @module
 */

import { decode } from './decode.js';
import { byType } from './dtypes.js';
import { encode } from './encode.js';
import { CheckpointError } from './errors.js';
import { readSource } from '../source.js';

/**
 * The values of a tensor, little-endian, in the typed array of its element type.
 * @typedef {Float32Array | Float64Array | Int8Array | Uint8Array | Int16Array | Uint16Array | Int32Array | Uint32Array | BigInt64Array | BigUint64Array} TensorData
 */

/**
 * A tensor of the state: onnxruntime's element type name, its dims and its values (`null` in a nominal state).
 * @typedef {{ type: import('onnxruntime-common').Tensor.Type, dims: readonly number[], data: TensorData | null }} StateTensor
 */

/**
 * ONNX Runtime's optimizer group `group0`: the step count, the initial learning rate and each trainable
 * parameter's moments (`momentum0`, `momentum1`, ...; AdamW: first and second moments).
 * @typedef {{ step: number, initialLearningRate: number, moments: Map<string, StateTensor[]> }} OptimizerState
 */

/**
 * A property's value: int64 properties are `bigint`, float32 properties `number`, string properties `string`.
 * @typedef {bigint | number | string} PropertyValue
 */

/**
 * What a checkpoint holds.
 * @typedef {Object} CheckpointContents
 * @property {Map<string, StateTensor>} trainable ONNX Runtime's `requires_grad_params`
 * @property {Map<string, StateTensor>} frozen ONNX Runtime's `frozen_params`
 * @property {OptimizerState | null} optimizer
 * @property {Map<string, PropertyValue>} properties
 * @property {boolean} isNominal names, types and shapes only: no values until they are loaded
 */

/** A checkpoint's state, which a {@link TrainingSession} trains in place. */
export class CheckpointState {
  /**
   * @param {Partial<CheckpointContents>} [contents]
   */
  constructor(contents = {}) {
    /** @type {Map<string, StateTensor>} */
    this.trainable = new Map(contents.trainable ?? []);
    /** @type {Map<string, StateTensor>} */
    this.frozen = new Map(contents.frozen ?? []);
    /** @type {OptimizerState | null} */
    this.optimizer = contents.optimizer ?? null;
    /** @type {Map<string, PropertyValue>} */
    this.properties = new Map(contents.properties ?? []);
    /** @type {boolean} */
    this.isNominal = contents.isNominal ?? false;
    check(this);
  }

  /**
   * The state in a checkpoint file's bytes; `CheckpointError` when they are not a valid checkpoint.
   * @param {Uint8Array | ArrayBuffer} bytes
   * @returns {CheckpointState}
   */
  static fromBuffer(bytes) {
    if (bytes instanceof ArrayBuffer) return new CheckpointState(decode(new Uint8Array(bytes)));
    if (!(bytes instanceof Uint8Array)) {
      throw new TypeError(`a checkpoint is given as a Uint8Array or ArrayBuffer of its file's bytes, not ${describe(bytes)}`);
    }
    return new CheckpointState(decode(bytes));
  }

  /**
   * Load a checkpoint: a path (Node.js), a URL (the browser: fetched) or the file's bytes.
   * @param {string | URL | Uint8Array | ArrayBuffer} source
   * @returns {Promise<CheckpointState>}
   */
  static async loadCheckpoint(source) {
    return CheckpointState.fromBuffer(await readSource(source, 'the checkpoint'));
  }

  /**
   * The checkpoint file's bytes (ONNX Runtime's `SaveCheckpoint`); with `includeOptimizerState`, the
   * optimizer's step, initial learning rate and moments too (ONNX Runtime's default leaves them out).
   * @param {{ includeOptimizerState?: boolean }} [options]
   * @returns {Uint8Array}
   */
  toBuffer({ includeOptimizerState = false } = {}) {
    check(this);
    return encode(this, includeOptimizerState);
  }

  /**
   * Whether the state has a parameter of this name.
   * @param {string} name
   */
  hasParameter(name) {
    return this.trainable.has(name) || this.frozen.has(name);
  }

  /**
   * A parameter (ONNX Runtime's `GetParameter`), with `requiresGrad`; its `data` is the state's own array.
   * @param {string} name
   * @returns {StateTensor & { requiresGrad: boolean }}
   */
  getParameter(name) {
    const tensor = this.trainable.get(name) ?? this.frozen.get(name);
    if (tensor === undefined) {
      throw new RangeError(`the checkpoint has no parameter '${name}'; it has ${listNames(this)}`);
    }
    if (this.isNominal && tensor.data === null) {
      throw new Error('Cannot get parameter from a nominal state. Please load the parameter states first.');
    }
    return { ...tensor, requiresGrad: this.trainable.has(name) };
  }

  /**
   * Replace a parameter's values (ONNX Runtime's `UpdateParameter`): a typed array of its type and size.
   * @param {string} name
   * @param {TensorData} data
   */
  updateParameter(name, data) {
    const group = this.trainable.has(name) ? this.trainable : this.frozen.has(name) ? this.frozen : null;
    if (group === null) throw new RangeError(`the checkpoint has no parameter '${name}'; it has ${listNames(this)}`);
    const tensor = /** @type {StateTensor} */ (group.get(name));
    const type = /** @type {import('./dtypes.js').ElementType} */ (byType(tensor.type));
    const count = elementCount(tensor.dims);
    if (!(data instanceof type.array) || data.length !== count) {
      throw new TypeError(`parameter '${name}' is ${tensor.type}[${tensor.dims.join(', ')}]: give a ${type.array.name} of ${count} elements, not ${describe(data)}`);
    }
    group.set(name, { ...tensor, data: data.slice() });
    if (this.isNominal && [...this.trainable.values(), ...this.frozen.values()].every((t) => t.data !== null)) {
      this.isNominal = false;
    }
  }
}

/**
 * The number of elements of a shape.
 * @param {readonly number[]} dims
 */
export function elementCount(dims) {
  return dims.reduce((a, b) => a * b, 1);
}

/**
 * A short description of a value for the errors: its constructor and length, or its type.
 * @param {unknown} value
 */
export function describe(value) {
  if (value === null || value === undefined) return String(value);
  if (ArrayBuffer.isView(value)) return `a ${value.constructor.name} of ${/** @type {any} */ (value).length} elements`;
  if (typeof value === 'object') return `a ${value.constructor?.name ?? 'object'}`;
  return `a ${typeof value}`;
}

/** @param {CheckpointState} state */
function listNames(state) {
  return JSON.stringify([...state.trainable.keys(), ...state.frozen.keys()]);
}

/**
 * Check the state's consistency (what a save would write): element types, sizes, moments, properties.
 * @param {CheckpointState} state
 */
function check(state) {
  for (const [group, tensors] of /** @type {const} */ ([['trainable', state.trainable], ['frozen', state.frozen]])) {
    for (const [name, tensor] of tensors) checkTensor(`${group} parameter '${name}'`, tensor, state.isNominal);
  }
  for (const name of state.trainable.keys()) {
    if (state.frozen.has(name)) throw new CheckpointError(`parameter '${name}' is both trainable and frozen`);
  }
  if (state.optimizer !== null) {
    const { step, initialLearningRate, moments } = state.optimizer;
    if (!Number.isSafeInteger(step) || step < 0) throw new CheckpointError(`the optimizer step must be an integer >= 0, not ${step}`);
    if (typeof initialLearningRate !== 'number') throw new CheckpointError('the initial learning rate must be a number');
    for (const [name, list] of moments) {
      const param = state.trainable.get(name);
      if (param === undefined) throw new CheckpointError(`the optimizer state has moments for '${name}', which is not a trainable parameter`);
      list.forEach((moment, i) => {
        checkTensor(`momentum${i} of '${name}'`, moment, false);
        if (moment.type !== param.type || moment.dims.join() !== param.dims.join()) {
          throw new CheckpointError(
            `momentum${i} of '${name}' is ${moment.type}[${moment.dims.join(', ')}] but the parameter is ${param.type}[${param.dims.join(', ')}]`,
          );
        }
      });
    }
  }
  for (const [name, value] of state.properties) {
    if (!['bigint', 'number', 'string'].includes(typeof value)) {
      throw new CheckpointError(`property '${name}' is ${describe(value)}; properties are bigint (int64), number (float32) or string`);
    }
  }
}

/**
 * @param {string} what
 * @param {StateTensor} tensor
 * @param {boolean} nominal
 */
function checkTensor(what, tensor, nominal) {
  const type = byType(tensor.type);
  if (type === undefined) throw new CheckpointError(`${what} has an unknown element type ${JSON.stringify(tensor.type)}`);
  if (!Array.isArray(tensor.dims) || tensor.dims.some((d) => !Number.isSafeInteger(d) || d < 0)) {
    throw new CheckpointError(`${what} has invalid dims ${JSON.stringify(tensor.dims)}`);
  }
  if (tensor.data === null && nominal) return;
  if (!(tensor.data instanceof type.array) || tensor.data.length !== elementCount(tensor.dims)) {
    throw new CheckpointError(
      `${what} is ${tensor.type}[${tensor.dims.join(', ')}] but holds ${describe(tensor.data)}; expected a ${type.array.name} of ${elementCount(tensor.dims)}`,
    );
  }
}
