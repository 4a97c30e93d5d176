/**
 * onnxtrain-web: train onnxtrain's artifacts on stock onnxruntime, in the browser (onnxruntime-web) or in
 * Node.js (onnxruntime-node), with ONNX Runtime's web training API.
 *
 * This entry point binds no onnxruntime: `TrainingSession.createWith(ort, options, sessionOptions)` takes
 * the one you imported. `onnxtrain-web/web` and `onnxtrain-web/node` bind onnxruntime-web and
 * onnxruntime-node, and their `TrainingSession.create(options, sessionOptions)` is ONNX Runtime's.
 * @module
 */

export { CheckpointState } from './checkpoint/state.js';
export { CheckpointError } from './checkpoint/errors.js';
export { TrainingSession, DEFAULT_LEARNING_RATE } from './session/training-session.js';
