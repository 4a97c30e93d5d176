/**
 * onnxtrain-web on onnxruntime-web (WebAssembly, WebGPU): `TrainingSession.create(options, sessionOptions)` runs the
 * models with it; `sessionOptions.executionProviders` picks the backend (`["webgpu", "wasm"]`, `["wasm"]`).
 * @module
 */

import * as ort from 'onnxruntime-web';

import { TrainingSession as Base } from './session/training-session.js';

export { CheckpointState } from './checkpoint/state.js';
export { CheckpointError } from './checkpoint/errors.js';
export { DEFAULT_LEARNING_RATE } from './session/training-session.js';
export { ort };

/** A {@link Base TrainingSession} whose `create` runs on onnxruntime-web. */
export class TrainingSession extends Base {
  /**
   * @param {import('./session/training-session.js').TrainingSessionCreateOptions} options
   * @param {import('onnxruntime-common').InferenceSession.SessionOptions} [sessionOptions]
   * @returns {Promise<TrainingSession>}
   */
  static async create(options, sessionOptions) {
    return this.createWith(/** @type {any} */ (ort), options, sessionOptions);
  }
}
