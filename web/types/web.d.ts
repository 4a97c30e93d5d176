// Types of onnxtrain-web/web (src/web.js): TrainingSession.create runs on onnxruntime-web.
import type { InferenceSession } from 'onnxruntime-common';
import * as ort from 'onnxruntime-web';

import { TrainingSession as Base, type TrainingSessionCreateOptions } from './index.js';

export { CheckpointError, CheckpointState, DEFAULT_LEARNING_RATE } from './index.js';
export type * from './index.js';
export { ort };

/** A TrainingSession whose `create` runs the models on onnxruntime-web. */
export class TrainingSession extends Base {
  static create(options: TrainingSessionCreateOptions, sessionOptions?: InferenceSession.SessionOptions): Promise<TrainingSession>;
}
