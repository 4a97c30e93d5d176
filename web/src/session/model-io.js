/**
 * What the training, eval and optimizer models take and give, checked against the checkpoint
 * (as `onnxtrain.training.model_io`). Inputs are classified by name, as ONNX Runtime does: a checkpoint
 * parameter is a parameter, `lazy_reset_grad` the flag, `<p>_grad.accumulation.buffer` a gradient buffer,
 * the rest are the user's inputs. Every mismatch throws here, before anything runs.
 * @module
 */

import * as N from './names.js';
import { shapeText } from './feeds.js';

/** @typedef {import('onnxruntime-common').InferenceSession.ValueMetadata} ValueMetadata */
/** @typedef {import('onnxruntime-common').InferenceSession.TensorValueMetadata} TensorValueMetadata */
/** @typedef {import('../checkpoint/state.js').CheckpointState} CheckpointState */
/** @typedef {import('../checkpoint/state.js').StateTensor} StateTensor */

/**
 * @typedef {Object} TrainingIO
 * @property {TensorValueMetadata[]} inputs the user's inputs, in model order
 * @property {string[]} parameters every parameter input, in model order
 * @property {string[]} trainable the trainable ones, in model order
 * @property {string[]} outputs the loss, then the additional outputs
 * @property {Map<string, string>} statistics BatchNormalization running statistic -> its `.updated` output
 */

/**
 * @typedef {Object} EvalIO
 * @property {TensorValueMetadata[]} inputs
 * @property {string[]} parameters
 * @property {string[]} outputs
 */

/**
 * @typedef {Object} OptimizerIO
 * @property {number} numStates moments per parameter
 * @property {number[]} initialValues each moment's initial value
 * @property {string[]} shared frozen parameters the model also updates (the loss scaler's state)
 */

/**
 * A parameter of the state as a model input must see it, or an error naming both.
 * @param {ValueMetadata} input
 * @param {StateTensor} tensor
 * @param {string} model
 */
function checkParameter(input, tensor, model) {
  if (!input.isTensor) throw new Error(`the ${model}'s input '${input.name}' is not a tensor`);
  const fits =
    input.type === tensor.type &&
    input.shape.length === tensor.dims.length &&
    input.shape.every((d, i) => typeof d !== 'number' || d < 0 || d === tensor.dims[i]);
  if (!fits) {
    throw new Error(
      `the checkpoint's parameter '${input.name}' is ${tensor.type}[${tensor.dims.join(', ')}], but the ${model} takes ` +
        `${shapeText(input)}: the checkpoint does not belong to this model`,
    );
  }
}

/**
 * Split a model's inputs into the user's and the parameters.
 * @param {readonly ValueMetadata[]} inputs
 * @param {CheckpointState} state
 * @param {string} model
 * @param {Set<string>} reserved names that are neither
 */
function split(inputs, state, model, reserved) {
  /** @type {TensorValueMetadata[]} */
  const users = [];
  /** @type {string[]} */
  const params = [];
  for (const input of inputs) {
    if (reserved.has(input.name)) continue;
    if (state.hasParameter(input.name)) {
      checkParameter(input, /** @type {StateTensor} */ (state.trainable.get(input.name) ?? state.frozen.get(input.name)), model);
      params.push(input.name);
    } else if (params.length) {
      throw new Error(
        `the ${model} takes '${input.name}' among its parameters, but the checkpoint has no parameter of that name; ` +
          `it has ${JSON.stringify([...state.trainable.keys(), ...state.frozen.keys()])}`,
      );
    } else if (!input.isTensor) {
      throw new Error(`the ${model}'s input '${input.name}' is not a tensor; onnxtrain-web feeds tensors only`);
    } else users.push(input);
  }
  return { users, params };
}

/**
 * Classify the training model's inputs and outputs against the checkpoint.
 * @param {readonly ValueMetadata[]} inputs
 * @param {readonly string[]} outputNames
 * @param {CheckpointState} state
 * @returns {TrainingIO}
 */
export function trainingIO(inputs, outputNames, state) {
  const model = 'training model';
  const names = new Set(inputs.map((i) => i.name));
  if (!names.has(N.LAZY_RESET_GRAD)) {
    throw new Error(
      `the ${model} has no '${N.LAZY_RESET_GRAD}' input, so it is not a training model written by onnxtrain ` +
        '(ONNX Runtime\'s com.microsoft training models do not run on stock onnxruntime); generate the artifacts with `onnxtrain generate`',
    );
  }
  const suffix = N.bufferName('');
  const buffered = inputs.filter((i) => i.name.endsWith(suffix)).map((i) => i.name.slice(0, -suffix.length));
  const { users, params } = split(inputs, state, model, new Set([N.LAZY_RESET_GRAD, ...buffered.map(N.bufferName)]));
  const extra = [...state.trainable.keys(), ...state.frozen.keys()].filter(
    (name) => !params.includes(name) && !N.SCALER_STATE.includes(name), // the scaler's: the optimizer model's
  );
  if (extra.length) {
    throw new Error(
      `the checkpoint has parameter(s) ${JSON.stringify(extra)} that the ${model} does not take; it trains ` +
        `${JSON.stringify(buffered)}: the checkpoint does not belong to this model`,
    );
  }
  for (const param of buffered) {
    if (!state.hasParameter(param)) {
      throw new Error(`the ${model} trains '${param}', but the checkpoint has no such parameter`);
    }
    if (!state.trainable.has(param)) {
      throw new Error(`the ${model} trains '${param}', but the checkpoint has it frozen: the checkpoint does not belong to this model`);
    }
  }
  const untrained = [...state.trainable.keys()].filter((name) => !buffered.includes(name));
  if (untrained.length) {
    throw new Error(
      `the checkpoint has ${JSON.stringify(untrained)} trainable, but the ${model} computes no gradient for them: ` +
        'the checkpoint does not belong to this model',
    );
  }
  const trainable = params.filter((name) => buffered.includes(name));
  const missing = trainable.map(N.accumulatedName).filter((name) => !outputNames.includes(name));
  if (missing.length) throw new Error(`the ${model} lacks the accumulated-gradient output(s) ${JSON.stringify(missing)}; regenerate the artifacts`);
  const statistics = new Map();
  for (const name of outputNames) {
    const stat = name.endsWith('.updated') ? name.slice(0, -'.updated'.length) : null;
    if (stat !== null && state.hasParameter(stat)) statistics.set(stat, name);
  }
  const hidden = new Set([...trainable.map(N.accumulatedName), ...statistics.values()]);
  return { inputs: users, parameters: params, trainable, outputs: outputNames.filter((n) => !hidden.has(n)), statistics };
}

/**
 * Classify the eval model's inputs against the checkpoint; an input that is neither a parameter nor one of the
 * training model's user inputs marks an eval model of other artifacts.
 * @param {readonly ValueMetadata[]} inputs
 * @param {readonly string[]} outputNames
 * @param {CheckpointState} state
 * @param {readonly string[]} trainingInputs the training model's user inputs
 * @returns {EvalIO}
 */
export function evalIO(inputs, outputNames, state, trainingInputs) {
  const { users, params } = split(inputs, state, 'eval model', new Set());
  const foreign = users.map((i) => i.name).filter((name) => !trainingInputs.includes(name));
  if (foreign.length) {
    throw new Error(
      `the eval model takes ${JSON.stringify(foreign)}, which are neither parameters of the checkpoint nor inputs of the ` +
        `training model (${JSON.stringify(trainingInputs)}): it comes from other artifacts; pass the eval model written with this training model`,
    );
  }
  return { inputs: users, parameters: params, outputs: [...outputNames] };
}

/**
 * Check the optimizer model against the trainable parameters; read how many moments it keeps and their
 * initial values (its metadata `onnxtrain.optimizer.initial_state`).
 * @param {readonly ValueMetadata[]} inputs
 * @param {readonly string[]} outputNames
 * @param {readonly string[]} trainable
 * @param {CheckpointState} state
 * @param {Map<string, string>} metadata the model's `metadata_props`
 * @returns {OptimizerIO}
 */
export function optimizerIO(inputs, outputNames, trainable, state, metadata) {
  const model = 'optimizer model';
  const names = inputs.map((i) => i.name);
  if (names[0] !== N.LEARNING_RATE || names[1] !== N.STEP) {
    throw new Error(
      `the ${model}'s first inputs are ${JSON.stringify(names.slice(0, 2))}, not ["${N.LEARNING_RATE}", "${N.STEP}"]: it is not an ` +
        "optimizer model written by onnxtrain (ONNX Runtime's com.microsoft optimizers do not run on stock onnxruntime)",
    );
  }
  if (!trainable.length) throw new Error('the training model has no trainable parameters, so there is nothing to optimize');
  const shared = N.SCALER_STATE.filter((n) => names.includes(n));
  const missingState = shared.filter((n) => !state.frozen.has(n) || !outputNames.includes(N.updatedName(n)));
  if (missingState.length) {
    throw new Error(
      `the ${model} scales the loss, but the checkpoint or the model lacks the scaler's ${JSON.stringify(missingState)}: ` +
        'load the checkpoint written with these artifacts',
    );
  }
  const params = names.slice(2).filter((n) => state.hasParameter(n) && !shared.includes(n));
  if ([...params].sort().join('\n') !== [...trainable].sort().join('\n')) {
    const updated = names.slice(2).filter((n) => names.includes(N.gradName(n))); // the model's own, not the state's
    throw new Error(`the ${model} updates ${JSON.stringify(updated)}, but the training model trains ${JSON.stringify(trainable)}: the artifacts do not belong together`);
  }
  let numStates = 0;
  while (names.includes(N.momentName(trainable[0], numStates))) numStates++;
  for (const param of trainable) {
    checkParameter(/** @type {ValueMetadata} */ (inputs.find((i) => i.name === param)), /** @type {StateTensor} */ (state.trainable.get(param)), model);
    const states = Array.from({ length: numStates }, (_, i) => N.momentName(param, i));
    const absent = [N.gradName(param), ...states].filter((n) => !names.includes(n));
    absent.push(...[param, ...states].map(N.updatedName).filter((n) => !outputNames.includes(n)));
    if (absent.length) throw new Error(`the ${model} lacks ${JSON.stringify(absent)} for parameter '${param}'; regenerate the artifacts`);
  }
  let initialValues = Array(numStates).fill(0);
  const text = metadata.get(N.INITIAL_STATE_KEY);
  if (text !== undefined) {
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
    if (!Array.isArray(parsed) || parsed.some((v) => typeof v !== 'number')) {
      throw new Error(`the ${model}'s metadata '${N.INITIAL_STATE_KEY}' is not a JSON list of numbers: ${text}`);
    }
    if (parsed.length !== numStates) {
      throw new Error(`the ${model}'s metadata '${N.INITIAL_STATE_KEY}' lists ${parsed.length} initial values, but the model keeps ${numStates} state tensor(s) per parameter`);
    }
    initialValues = parsed;
  }
  return { numStates, initialValues, shared };
}
