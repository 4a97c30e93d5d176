/**
 * Class labels out of range, explained. onnxtrain's classification losses check their labels inside the
 * model (`onnxtrain.losses.label_check`): a `Reshape` named `labels_out_of_range...` of the `K` bad labels to
 * `[K, C, 2]` fails in onnxruntime as soon as one label is outside `[0, C)`. This turns onnxruntime's message
 * into one that says so and lists the offending labels of the int64 inputs.
 * @module
 */

const REQUESTED = /requested shape:\{(-?\d+),(-?\d+),2\}/;
const SHOWN = 5;

/**
 * The message for a failed run, or `null` when it is not a label check's failure.
 * @param {string} message onnxruntime's
 * @param {Record<string, import('onnxruntime-common').Tensor>} feeds the user's inputs of the run
 * @param {string} step `train step 3`, ...
 * @returns {string | null}
 */
export function labelError(message, feeds, step) {
  const requested = REQUESTED.exec(message);
  if (!/Name:'labels_out_of_range[^']*'/.test(message) || requested === null) return null;
  const classes = Number(requested[2]);
  /** @type {string[]} */
  const found = [];
  for (const [name, tensor] of Object.entries(feeds)) {
    if (tensor.type !== 'int64') continue;
    const data = /** @type {BigInt64Array} */ (tensor.data);
    data.forEach((label, i) => {
      if (label < 0n || label >= BigInt(classes)) found.push(`${label} at [${i}] of '${name}'`);
    });
  }
  const listed = found.length ? `: ${found.slice(0, SHOWN).join(', ')}${found.length > SHOWN ? `, and ${found.length - SHOWN} more` : ''}` : '';
  return (
    `${step}: class labels are out of range for the loss (${classes} classes)${listed}. Labels must be in [0, ${classes}) ` +
    "(or equal the loss's ignore_index, if it has one); the state is as before the step"
  );
}
