/**
 * Decode the PNG screenshots Chromium takes (8-bit RGB or RGBA, not interlaced), to check them without a
 * dependency.
 * @module
 */

import { inflateSync } from 'node:zlib';

/**
 * The pixels of a PNG: `channels` bytes per pixel, row by row.
 * @param {Uint8Array} bytes
 * @returns {{ width: number, height: number, channels: number, pixels: Uint8Array }}
 */
export function decodePng(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0) !== 0x89504e47) throw new Error('not a PNG');
  let pos = 8;
  let width = 0;
  let height = 0;
  let channels = 0;
  /** @type {Uint8Array[]} */
  const data = [];
  while (pos < bytes.length) {
    const length = view.getUint32(pos);
    const type = String.fromCharCode(...bytes.subarray(pos + 4, pos + 8));
    const body = bytes.subarray(pos + 8, pos + 8 + length);
    if (type === 'IHDR') {
      width = view.getUint32(pos + 8);
      height = view.getUint32(pos + 12);
      const [depth, color, , , interlace] = body.subarray(8, 13);
      channels = { 2: 3, 6: 4 }[color] ?? 0;
      if (depth !== 8 || !channels || interlace) throw new Error(`unsupported PNG: depth ${depth}, color type ${color}, interlace ${interlace}`);
    } else if (type === 'IDAT') data.push(body);
    else if (type === 'IEND') break;
    pos += 12 + length;
  }
  const raw = inflateSync(Buffer.concat(data));
  const stride = width * channels;
  const pixels = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const out = pixels.subarray(y * stride, (y + 1) * stride);
    const up = y ? pixels.subarray((y - 1) * stride, y * stride) : new Uint8Array(stride);
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? out[i - channels] : 0;
      const b = up[i];
      const c = i >= channels ? up[i - channels] : 0;
      const predictor = [0, a, b, (a + b) >> 1, paeth(a, b, c)][filter];
      if (predictor === undefined) throw new Error(`PNG filter ${filter} is unknown`);
      out[i] = (line[i] + predictor) & 0xff;
    }
  }
  return { width, height, channels, pixels };
}

/**
 * @param {number} a
 * @param {number} b
 * @param {number} c
 */
function paeth(a, b, c) {
  const p = a + b - c;
  const pa = Math.abs(p - a);
  const pb = Math.abs(p - b);
  const pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/**
 * The variance of the pixels' grey levels and the share of pixels that are not near-white.
 * @param {{ channels: number, pixels: Uint8Array }} image
 */
export function inkStatistics({ channels, pixels }) {
  let sum = 0;
  let squares = 0;
  let ink = 0;
  const count = pixels.length / channels;
  for (let i = 0; i < pixels.length; i += channels) {
    const grey = (pixels[i] + pixels[i + 1] + pixels[i + 2]) / 3;
    sum += grey;
    squares += grey * grey;
    if (grey < 200) ink++;
  }
  const mean = sum / count;
  return { variance: squares / count - mean * mean, inkShare: ink / count };
}
