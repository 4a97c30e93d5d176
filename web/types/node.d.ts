// Types of onnxtrain-web/node (src/node.js): TrainingSession.create runs on onnxruntime-node.
import type { InferenceSession } from 'onnxruntime-common';
import * as ort from 'onnxruntime-node';

import { CheckpointState, TrainingSession as Base, type TrainingSessionCreateOptions } from './index.js';

export { CheckpointError, CheckpointState, DEFAULT_LEARNING_RATE } from './index.js';
export type * from './index.js';
export { ort };

/** Write the state's checkpoint to `path` atomically (a temporary file beside it, flushed, renamed). */
export function saveCheckpoint(state: CheckpointState, path: string, options?: { includeOptimizerState?: boolean }): Promise<void>;

/** A TrainingSession whose `create` runs the models on onnxruntime-node. */
export class TrainingSession extends Base {
  static create(options: TrainingSessionCreateOptions, sessionOptions?: InferenceSession.SessionOptions): Promise<TrainingSession>;
}
