/**
 * The live loss curve: every step's loss (thin) and each epoch's mean (thick) on a log scale, drawn on a canvas.
 * @module
 */

/**
 * Draw the losses so far.
 * @param {HTMLCanvasElement} canvas
 * @param {readonly number[]} losses one per step
 * @param {number} stepsPerEpoch
 */
export function drawLosses(canvas, losses, stepsPerEpoch) {
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext('2d'));
  const { width, height } = canvas;
  const pad = { left: 64, right: 12, top: 12, bottom: 34 };
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, width, height);
  ctx.strokeStyle = '#888';
  ctx.strokeRect(pad.left, pad.top, width - pad.left - pad.right, height - pad.top - pad.bottom);
  ctx.fillStyle = '#333';
  ctx.font = '12px sans-serif';
  ctx.fillText('step', width / 2, height - 6);
  ctx.save();
  ctx.translate(12, height / 2 + 24);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText('loss (log)', -24, 0);
  ctx.restore();
  if (losses.length < 2) return;
  const logs = losses.map((l) => Math.log10(Math.max(l, 1e-6)));
  const top = Math.ceil(Math.max(...logs) * 2) / 2;
  const bottom = Math.floor(Math.min(...logs) * 2) / 2;
  const x = (/** @type {number} */ i) => pad.left + ((width - pad.left - pad.right) * i) / (losses.length - 1);
  const y = (/** @type {number} */ v) => pad.top + ((height - pad.top - pad.bottom) * (top - v)) / Math.max(top - bottom, 1e-9);
  ctx.fillStyle = '#333';
  ctx.textAlign = 'right';
  for (let v = bottom; v <= top + 1e-9; v += 0.5) {
    ctx.fillText(String(Number((10 ** v).toPrecision(2))), pad.left - 4, y(v) + 4);
    ctx.strokeStyle = '#eee';
    ctx.beginPath();
    ctx.moveTo(pad.left, y(v));
    ctx.lineTo(width - pad.right, y(v));
    ctx.stroke();
  }
  ctx.fillText(String(losses.length), width - pad.right, height - 18);
  ctx.textAlign = 'left';
  ctx.fillText('0', pad.left, height - 18);
  line(ctx, logs.map((v, i) => [x(i), y(v)]), '#9ab', 1);
  /** @type {[number, number][]} */
  const means = [];
  for (let start = 0; start + stepsPerEpoch <= logs.length; start += stepsPerEpoch) {
    const epoch = losses.slice(start, start + stepsPerEpoch);
    means.push([x(start + stepsPerEpoch - 1), y(Math.log10(epoch.reduce((a, b) => a + b, 0) / epoch.length))]);
  }
  line(ctx, means, '#d04010', 3);
  legend(ctx, width - pad.right - 170, pad.top + 8);
}

/**
 * What the two lines are.
 * @param {CanvasRenderingContext2D} ctx
 * @param {number} x
 * @param {number} y
 */
function legend(ctx, x, y) {
  ctx.fillStyle = 'rgba(255, 255, 255, 0.85)';
  ctx.fillRect(x - 6, y - 4, 170, 40);
  line(ctx, [[x, y + 6], [x + 24, y + 6]], '#9ab', 1);
  line(ctx, [[x, y + 24], [x + 24, y + 24]], '#d04010', 3);
  ctx.fillStyle = '#333';
  ctx.textAlign = 'left';
  ctx.fillText('each step', x + 32, y + 10);
  ctx.fillText('mean of each epoch', x + 32, y + 28);
}

/**
 * @param {CanvasRenderingContext2D} ctx
 * @param {[number, number][]} points
 * @param {string} color
 * @param {number} width
 */
function line(ctx, points, color, width) {
  if (points.length < 2) return;
  ctx.strokeStyle = color;
  ctx.lineWidth = width;
  ctx.beginPath();
  points.forEach(([px, py], i) => (i ? ctx.lineTo(px, py) : ctx.moveTo(px, py)));
  ctx.stroke();
  ctx.lineWidth = 1;
}
