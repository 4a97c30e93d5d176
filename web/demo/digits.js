/**
 * The demo's data: the digits file `make_assets.py` writes, as onnxruntime tensors.
 * @module
 */

/**
 * @typedef {Object} Digits
 * @property {Float32Array} pixels [count, 64]
 * @property {BigInt64Array} labels [count]
 * @property {{ count: number, train: number, features: number, classes: number, batchSize: number }} manifest
 */

/**
 * Fetch `digits.json` and `digits.bin` from `base`.
 * @param {string} base
 * @returns {Promise<Digits>}
 */
export async function loadDigits(base) {
  const manifest = await (await fetchOk(`${base}/digits.json`)).json();
  const bytes = await (await fetchOk(`${base}/digits.bin`)).arrayBuffer();
  const size = manifest.count * manifest.features;
  if (bytes.byteLength !== size * 4 + manifest.count) {
    throw new Error(`digits.bin has ${bytes.byteLength} bytes; digits.json describes ${size * 4 + manifest.count}: run make web-demo again`);
  }
  const pixels = new Float32Array(bytes, 0, size);
  const labels = BigInt64Array.from(new Uint8Array(bytes, size * 4, manifest.count), (v) => BigInt(v));
  return { pixels, labels, manifest };
}

/**
 * Rows [start, end) as the model's inputs `pixels` and `labels`.
 * @param {typeof import('onnxruntime-common').Tensor} Tensor
 * @param {Digits} digits
 * @param {number} start
 * @param {number} end
 */
export function rows(Tensor, digits, start, end) {
  const f = digits.manifest.features;
  return {
    pixels: new Tensor('float32', digits.pixels.slice(start * f, end * f), [end - start, f]),
    labels: new Tensor('int64', digits.labels.slice(start, end), [end - start]),
  };
}

/** @param {string} url */
async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}; generate the demo's files with make web-demo`);
  return response;
}
