/**
 * onnxtrain-web on onnxruntime-node: `TrainingSession.create(options, sessionOptions)` runs the models with it.
 * @module
 */

import * as ort from 'onnxruntime-node';

import { TrainingSession as Base } from './session/training-session.js';

export { CheckpointState } from './checkpoint/state.js';
export { CheckpointError } from './checkpoint/errors.js';
export { DEFAULT_LEARNING_RATE } from './session/training-session.js';
export { saveCheckpoint } from './save-file.js';
export { ort };

/** A {@link Base TrainingSession} whose `create` runs on onnxruntime-node. */
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
