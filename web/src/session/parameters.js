/**
 * Parameters as one contiguous float32 buffer, in training-model order (ONNX Runtime's `ToBuffer` and
 * `FromBuffer`): the exchange of federated learning. As in ONNX Runtime, float32 parameters only.
 * @module
 */

import { elementCount } from '../checkpoint/state.js';
import { plainBytes } from '../source.js';

/** @typedef {import('../checkpoint/state.js').CheckpointState} CheckpointState */
/** @typedef {import('../checkpoint/state.js').StateTensor} StateTensor */

/**
 * The parameters a buffer holds, in order: every parameter, or the trainable ones.
 * @param {CheckpointState} state
 * @param {readonly string[]} order the training model's parameters
 * @param {boolean} trainableOnly
 * @returns {[string, StateTensor][]}
 */
export function selected(state, order, trainableOnly) {
  return order
    .filter((name) => !trainableOnly || state.trainable.has(name))
    .map((name) => [name, /** @type {StateTensor} */ (state.trainable.get(name) ?? state.frozen.get(name))]);
}

/**
 * The number of elements of the selected parameters.
 * @param {[string, StateTensor][]} params
 */
export function parametersSize(params) {
  return params.reduce((total, [, t]) => total + elementCount(t.dims), 0);
}

/**
 * @param {[string, StateTensor][]} params
 * @param {string} call
 */
function checkFloat32(params, call) {
  const other = params.filter(([, t]) => t.type !== 'float32');
  if (other.length) {
    throw new TypeError(
      `${call}: parameters ${JSON.stringify(other.map(([n, t]) => `${n}: ${t.type}`))} are not float32; ` +
        'contiguous parameter buffers hold float32 parameters only (as in ONNX Runtime)',
    );
  }
}

/**
 * The selected parameters, copied into one Float32Array.
 * @param {[string, StateTensor][]} params
 * @returns {Float32Array}
 */
export function toBuffer(params) {
  checkFloat32(params, 'getContiguousParameters');
  const out = new Float32Array(parametersSize(params));
  let offset = 0;
  for (const [name, t] of params) {
    if (t.data === null) {
      throw new Error(`Cannot copy parameters from a nominal checkpoint state. Please load the model parameters first. ('${name}' holds no values)`);
    }
    out.set(/** @type {Float32Array} */ (t.data), offset);
    offset += t.data.length;
  }
  return out;
}

/**
 * New values for the selected parameters, cut out of `buffer` (float32 values or their bytes); checks the size.
 * @param {[string, StateTensor][]} params
 * @param {unknown} buffer
 * @returns {Map<string, Float32Array>}
 */
export function fromBuffer(params, buffer) {
  checkFloat32(params, 'loadParametersBuffer');
  /** @type {Float32Array} */
  let values;
  const b = /** @type {any} */ (buffer);
  if (b instanceof Float32Array) values = b;
  else if (b instanceof Uint8Array) {
    if (b.byteLength % 4) throw new RangeError(`loadParametersBuffer: a buffer of ${b.byteLength} bytes does not hold whole float32 values`);
    values = new Float32Array(plainBytes(b).slice().buffer); // a copy, also of a Node Buffer
  } else if (b !== null && typeof b === 'object' && b.type === 'float32' && b.data instanceof Float32Array) values = b.data;
  else {
    throw new TypeError('loadParametersBuffer: give the parameters as a Float32Array, its bytes (Uint8Array) or a float32 Tensor');
  }
  const size = parametersSize(params);
  if (values.length !== size) {
    throw new RangeError(
      `loadParametersBuffer: the buffer holds ${values.length} float32 values, but the ${params.length} parameters ` +
        `take ${size} (${params.map(([n, t]) => `${n}[${t.dims.join(', ')}]`).join(', ')})`,
    );
  }
  const out = new Map();
  let offset = 0;
  for (const [name, t] of params) {
    const count = elementCount(t.dims);
    out.set(name, values.slice(offset, offset + count));
    offset += count;
  }
  return out;
}
