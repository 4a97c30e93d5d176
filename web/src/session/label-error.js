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
 *
 * onnxruntime-node names the failing node (`Name:'labels_out_of_range_12'`); onnxruntime-web's WebAssembly and
 * WebGPU builds do not, so a model whose label checks are known (`checks`) takes the check's `[K, C, 2]` shape
 * alone. The offending values are listed from the inputs the checks read, the ignored label left out (every
 * int64 input where the checks are not known).
 * @param {string} message onnxruntime's
 * @param {Record<string, import('onnxruntime-common').Tensor>} feeds the user's inputs of the run
 * @param {string} step `train step 3`, ...
 * @param {import('./model-proto.js').LabelCheck[]} [checks] the model's label checks
 * @returns {string | null}
 */
export function labelError(message, feeds, step, checks = []) {
  const requested = REQUESTED.exec(message);
  const named = /Name:'[^']*_out_of_range[^']*'/.test(message);
  if (requested === null || !(named || checks.length)) return null;
  const classes = Number(requested[2]);
  const read = checks.length ? checks : Object.keys(feeds).map((labels) => ({ labels, classes: null, ignoreIndex: null }));
  /** @type {string[]} */
  const found = [];
  for (const check of read) {
    const tensor = feeds[check.labels];
    if (tensor === undefined || (tensor.type !== 'int64' && tensor.type !== 'int32')) continue;
    const count = BigInt(check.classes ?? classes);
    const ignored = check.ignoreIndex === null ? null : BigInt(check.ignoreIndex);
    Array.from(/** @type {ArrayLike<bigint | number>} */ (tensor.data), BigInt).forEach((label, i) => {
      if ((label < 0n || label >= count) && label !== ignored) found.push(`${label} at [${i}] of '${check.labels}'`);
    });
  }
  const listed = found.length ? `: ${found.slice(0, SHOWN).join(', ')}${found.length > SHOWN ? `, and ${found.length - SHOWN} more` : ''}` : '';
  const skipped = checks.find((check) => check.ignoreIndex !== null);
  const rule = skipped ? ` or equal its ignore_index ${skipped.ignoreIndex}` : checks.length ? '' : " (or equal the loss's ignore_index, if it has one)";
  return `${step}: class labels are out of range for the loss (${classes} classes)${listed}. Labels must be in [0, ${classes})${rule}; the state is as before the step`;
}
