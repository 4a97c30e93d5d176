/**
 * Node.js only: write a checkpoint to a file atomically (ONNX Runtime's `SaveCheckpoint`).
 * @module
 */

import { open, rename, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

/**
 * Write `state`'s checkpoint to `path`: into a temporary file beside it, flushed, then renamed over `path`,
 * so a crash leaves the old file or the new one, never half of one.
 * @param {import('./checkpoint/state.js').CheckpointState} state
 * @param {string} path
 * @param {{ includeOptimizerState?: boolean }} [options]
 * @returns {Promise<void>}
 */
export async function saveCheckpoint(state, path, options = {}) {
  const bytes = state.toBuffer(options);
  const temporary = join(dirname(path), `.${basename(path)}.${process.pid}.${Date.now()}.tmp`);
  const file = await open(temporary, 'wx');
  try {
    await file.writeFile(bytes);
    await file.sync();
    await file.close();
    await rename(temporary, path);
  } catch (error) {
    await file.close().catch(() => {});
    await rm(temporary, { force: true });
    throw error;
  }
}
