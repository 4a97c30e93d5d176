/**
 * The error a checkpoint that cannot be read (or written) raises.
 * @module
 */

/** A checkpoint that is not one, is damaged, or holds what onnxtrain-web cannot use; the message says which. */
export class CheckpointError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'CheckpointError';
  }
}
