/**
 * The names onnxtrain's artifacts give the inputs and outputs the runtime feeds and reads
 * (docs/artifacts.md): the same as `onnxtrain.artifacts.accumulation` and `onnxtrain.optim`.
 * @module
 */

/** The training model's flag: `true` overwrites the gradient buffers, `false` adds to them. */
export const LAZY_RESET_GRAD = 'lazy_reset_grad';
/** The optimizer model's learning rate input, float[1]. */
export const LEARNING_RATE = 'learning_rate';
/** The optimizer model's step input, int64[1]: the state's step count + 1. */
export const STEP = 'step';
/**
 * The dynamic loss scaler's state (artifacts generated with `precision="fp16"` or `loss_scaling=True`): frozen
 * parameters of the checkpoint that the optimizer model reads and writes back as `<name>.updated`
 * (`onnxtrain.optim.loss_scaling`); the training model reads `loss_scale`.
 */
export const SCALER_STATE = Object.freeze([
  'loss_scale',
  'loss_scale.growth_tracker',
  'loss_scale.skipped_steps',
  'loss_scale.last_step_skipped',
]);
/** The optimizer model's metadata key listing each moment's initial value (a JSON list). */
export const INITIAL_STATE_KEY = 'onnxtrain.optimizer.initial_state';

/** @param {string} param */
export const bufferName = (param) => `${param}_grad.accumulation.buffer`;
/** @param {string} param */
export const accumulatedName = (param) => `${param}_grad.accumulation.out`;
/** @param {string} param */
export const gradName = (param) => `${param}_grad`;
/**
 * @param {string} param
 * @param {number} index
 */
export const momentName = (param, index) => `${param}.momentum${index}`;
/** @param {string} name */
export const updatedName = (name) => `${name}.updated`;
