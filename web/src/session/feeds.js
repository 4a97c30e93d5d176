/**
 * Check a step's feeds against the model's input metadata before anything runs: every input given once,
 * tensors of the declared element type, rank and fixed dimensions, and each symbolic dimension (`batch`)
 * of one size across the inputs. The errors name the input, what the model takes and what came.
 * @module
 */

/** @typedef {import('onnxruntime-common').InferenceSession.TensorValueMetadata} TensorValueMetadata */
/** @typedef {import('onnxruntime-common').Tensor} Tensor */

/**
 * `float32[batch, 64]`: an input's type and shape as the errors write it.
 * @param {{ type: string, shape: readonly (number | string)[] }} input
 */
export function shapeText(input) {
  return `${input.type}[${input.shape.map((d) => (typeof d === 'number' && d < 0 ? '?' : String(d))).join(', ')}]`;
}

/**
 * The model's user inputs, listed for the errors.
 * @param {readonly TensorValueMetadata[]} inputs
 */
function listing(inputs) {
  return inputs.map((i) => `${i.name}: ${shapeText(i)}`).join(', ');
}

/**
 * Whether `value` looks like an onnxruntime tensor (from any copy of onnxruntime-common).
 * @param {unknown} value
 * @returns {value is Tensor}
 */
function isTensor(value) {
  const v = /** @type {any} */ (value);
  return typeof v === 'object' && v !== null && typeof v.type === 'string' && Array.isArray(v.dims) && 'data' in v;
}

/**
 * The user's feeds, checked; throws `TypeError` (what is given) or `RangeError` (shapes) naming the input.
 * @param {unknown} feeds a record of input name -> Tensor
 * @param {readonly TensorValueMetadata[]} inputs the model's user inputs
 * @param {string} call `runTrainStep`, `runEvalStep`
 * @param {string} model `training model`, `eval model`
 * @returns {Record<string, Tensor>}
 */
export function checkFeeds(feeds, inputs, call, model) {
  if (typeof feeds !== 'object' || feeds === null || Array.isArray(feeds) || isTensor(feeds)) {
    throw new TypeError(`${call}: feeds must be an object of input name -> Tensor; the ${model} takes ${listing(inputs)}`);
  }
  const given = /** @type {Record<string, unknown>} */ (feeds);
  const known = new Set(inputs.map((i) => i.name));
  const extra = Object.keys(given).filter((name) => !known.has(name));
  if (extra.length) {
    throw new TypeError(`${call}: the ${model} has no input(s) ${JSON.stringify(extra)}; it takes ${listing(inputs)}`);
  }
  /** @type {Map<string, [number, string]>} */
  const symbols = new Map();
  /** @type {Record<string, Tensor>} */
  const checked = {};
  for (const input of inputs) {
    const value = given[input.name];
    if (value === undefined) {
      throw new TypeError(`${call}: the ${model}'s input '${input.name}' (${shapeText(input)}) is missing; it takes ${listing(inputs)}`);
    }
    if (!isTensor(value)) {
      throw new TypeError(`${call}: input '${input.name}' must be an onnxruntime Tensor (${shapeText(input)}), not ${typeof value}`);
    }
    const got = `${value.type}[${value.dims.join(', ')}]`;
    if (value.type !== input.type) {
      throw new TypeError(`${call}: input '${input.name}' of the ${model} is ${shapeText(input)}; got ${got}: make it a ${input.type} tensor`);
    }
    if (value.dims.length !== input.shape.length) {
      throw new RangeError(
        `${call}: input '${input.name}' of the ${model} is ${shapeText(input)} (rank ${input.shape.length}); got ${got} (rank ${value.dims.length})`,
      );
    }
    input.shape.forEach((dim, axis) => {
      const size = value.dims[axis];
      if (typeof dim === 'number' && dim >= 0) {
        if (size !== dim) {
          throw new RangeError(`${call}: input '${input.name}' of the ${model} is ${shapeText(input)}; got ${got}: axis ${axis} must be ${dim}`);
        }
      } else if (typeof dim === 'string' && dim !== '') {
        const seen = symbols.get(dim);
        if (seen !== undefined && seen[0] !== size) {
          throw new RangeError(
            `${call}: '${dim}' is ${seen[0]} in input '${seen[1]}' but ${size} in input '${input.name}' (${got}); ` +
              `the ${model}'s inputs share it: ${listing(inputs)}`,
          );
        }
        symbols.set(dim, [size, input.name]);
      }
    });
    checked[input.name] = value;
  }
  return checked;
}
