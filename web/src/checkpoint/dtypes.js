/**
 * Element types: ONNX's numbering (the checkpoint's `data_type`) against
 * onnxruntime's JavaScript tensor types and typed arrays.
 * @module
 */

/**
 * @typedef {Object} ElementType
 * @property {number} code ONNX `TensorProto.DataType`
 * @property {import('onnxruntime-common').Tensor.Type} type onnxruntime's JavaScript name
 * @property {number} size bytes per element
 * @property {new (buffer: ArrayBuffer, offset?: number, length?: number) => import('./state.js').TensorData} array
 */

/** @type {readonly ElementType[]} */
const TYPES = [
  { code: 1, type: 'float32', size: 4, array: Float32Array },
  { code: 2, type: 'uint8', size: 1, array: Uint8Array },
  { code: 3, type: 'int8', size: 1, array: Int8Array },
  { code: 4, type: 'uint16', size: 2, array: Uint16Array },
  { code: 5, type: 'int16', size: 2, array: Int16Array },
  { code: 6, type: 'int32', size: 4, array: Int32Array },
  { code: 7, type: 'int64', size: 8, array: BigInt64Array },
  { code: 9, type: 'bool', size: 1, array: Uint8Array },
  { code: 10, type: 'float16', size: 2, array: Uint16Array },
  { code: 11, type: 'float64', size: 8, array: Float64Array },
  { code: 12, type: 'uint32', size: 4, array: Uint32Array },
  { code: 13, type: 'uint64', size: 8, array: BigUint64Array },
];

/** ONNX's names of the codes onnxruntime's JavaScript tensors cannot hold, for the errors. */
const OTHER_NAMES = /** @type {Record<number, string>} */ ({
  8: 'STRING',
  14: 'COMPLEX64',
  15: 'COMPLEX128',
  16: 'BFLOAT16',
  17: 'FLOAT8E4M3FN',
  18: 'FLOAT8E4M3FNUZ',
  19: 'FLOAT8E5M2',
  20: 'FLOAT8E5M2FNUZ',
});

/**
 * The element type of an ONNX code; `undefined` for a code onnxruntime's JavaScript tensors cannot hold.
 * @param {number} code
 * @returns {ElementType | undefined}
 */
export function byCode(code) {
  return TYPES.find((t) => t.code === code);
}

/**
 * The element type of an onnxruntime JavaScript tensor type (`'float32'`, ...), or `undefined`.
 * @param {string} type
 * @returns {ElementType | undefined}
 */
export function byType(type) {
  return TYPES.find((t) => t.type === type);
}

/**
 * A name for an ONNX code in messages: `float32`, or ONNX's name of a type JavaScript cannot hold.
 * @param {number} code
 * @returns {string}
 */
export function codeName(code) {
  return byCode(code)?.type ?? OTHER_NAMES[code] ?? `unknown element type ${code}`;
}
