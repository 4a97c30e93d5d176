/**
 * Read what the API takes as "a path, a URL or the bytes": a model or a checkpoint.
 * @module
 */

/**
 * `bytes` as a plain `Uint8Array` over the same memory: a Node `Buffer` (or another subclass) is a `Uint8Array`
 * whose `slice()` is a view into its pooled memory, whose `.buffer` starts elsewhere, where `Uint8Array`'s copies.
 * @param {Uint8Array} bytes
 * @returns {Uint8Array}
 */
export function plainBytes(bytes) {
  return bytes.constructor === Uint8Array ? bytes : new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/**
 * The bytes of `source`: a `Uint8Array` or `ArrayBuffer` as they are; a string or `URL` is read from the file
 * system in Node.js (`file:` URLs too) and fetched in a browser. Errors name `what` and where it was looked for.
 * @param {string | URL | Uint8Array | ArrayBuffer} source
 * @param {string} what `the training model`, `the checkpoint`, ...
 * @returns {Promise<Uint8Array>}
 */
export async function readSource(source, what) {
  if (source instanceof Uint8Array) return plainBytes(source);
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  if (typeof source !== 'string' && !(source instanceof URL)) {
    throw new TypeError(`${what} must be a path or URL (string) or its bytes (Uint8Array), not ${source === undefined ? 'undefined' : typeof source}`);
  }
  const text = String(source);
  const inNode = typeof process !== 'undefined' && Boolean(process.versions?.node);
  if (inNode && !/^(https?|data|blob):/.test(text)) {
    const { readFile } = await import('node:fs/promises');
    try {
      return new Uint8Array(await readFile(source instanceof URL ? source : text));
    } catch (error) {
      throw new Error(`could not read ${what} from ${text}: ${/** @type {Error} */ (error).message}`);
    }
  }
  let response;
  try {
    response = await fetch(text);
  } catch (error) {
    throw new Error(`could not fetch ${what} from ${text}: ${/** @type {Error} */ (error).message}`);
  }
  if (!response.ok) throw new Error(`could not fetch ${what} from ${text}: HTTP ${response.status} ${response.statusText}`);
  return new Uint8Array(await response.arrayBuffer());
}
