/**
 * Read the few fields of an ONNX `ModelProto` that onnxruntime's JavaScript API does not expose: the IR
 * version, the opset imports, `metadata_props`, and the label checks of onnxtrain's classification losses
 * (the `doc_string` of each check's node). A minimal protobuf scan of the model's bytes.
 * @module
 */

/**
 * What one label check checks (`onnxtrain.losses.label_check.LabelCheck`, as its node's `doc_string` holds it).
 * @typedef {Object} LabelCheck
 * @property {string} loss
 * @property {string} labels the user input it checks
 * @property {number | null} classes `C`, where fixed
 * @property {number | null} ignoreIndex the label that counts for nothing, if any
 */

/**
 * @typedef {Object} ModelHeader
 * @property {number | null} irVersion
 * @property {Map<string, number>} opsets domain (`''` for ai.onnx) -> version
 * @property {Map<string, string>} metadata `metadata_props`
 * @property {LabelCheck[]} labelChecks the graph's label checks
 */

const UTF8 = new TextDecoder();
/** What starts a label check's description in its node's `doc_string` (`onnxtrain.losses.label_check.MARKER`). */
const LABEL_CHECK_MARKER = 'onnxtrain.label_check:';

/**
 * The IR version, opsets and metadata of a serialized ONNX model; `null` when the bytes are not a protobuf.
 * @param {Uint8Array} bytes
 * @returns {ModelHeader | null}
 */
export function readModelHeader(bytes) {
  try {
    /** @type {ModelHeader} */
    const header = { irVersion: null, opsets: new Map(), metadata: new Map(), labelChecks: [] };
    for (const [field, value] of fields(bytes)) {
      if (field === 1 && typeof value === 'number') header.irVersion = value;
      else if (field === 8 && value instanceof Uint8Array) {
        let domain = '';
        let version = 0;
        for (const [f, v] of fields(value)) {
          if (f === 1 && v instanceof Uint8Array) domain = UTF8.decode(v);
          else if (f === 2 && typeof v === 'number') version = v;
        }
        header.opsets.set(domain === 'ai.onnx' ? '' : domain, version);
      } else if (field === 14 && value instanceof Uint8Array) {
        let key = '';
        let text = '';
        for (const [f, v] of fields(value)) {
          if (f === 1 && v instanceof Uint8Array) key = UTF8.decode(v);
          else if (f === 2 && v instanceof Uint8Array) text = UTF8.decode(v);
        }
        header.metadata.set(key, text);
      } else if (field === 7 && value instanceof Uint8Array) {
        header.labelChecks = labelChecks(value);
      }
    }
    return header;
  } catch {
    return null;
  }
}

/**
 * The label checks among a `GraphProto`'s nodes (field 1; a node's `doc_string` is its field 6).
 * @param {Uint8Array} graph
 * @returns {LabelCheck[]}
 */
function labelChecks(graph) {
  /** @type {LabelCheck[]} */
  const found = [];
  for (const [field, node] of fields(graph)) {
    if (field !== 1 || !(node instanceof Uint8Array)) continue;
    for (const [f, doc] of fields(node)) {
      if (f !== 6 || !(doc instanceof Uint8Array)) continue;
      const text = UTF8.decode(doc);
      const at = text.indexOf(LABEL_CHECK_MARKER);
      if (at < 0) continue;
      try {
        const check = JSON.parse(text.slice(at + LABEL_CHECK_MARKER.length));
        found.push({ loss: check.loss, labels: check.labels, classes: check.classes ?? null, ignoreIndex: check.ignore_index ?? null });
      } catch {
        // a doc_string that only looks like one: no check
      }
    }
  }
  return found;
}

/**
 * The fields of one protobuf message: `[field number, varint | bytes | null]` (fixed-width values as `null`).
 * @param {Uint8Array} bytes
 * @returns {Generator<[number, number | Uint8Array | null]>}
 */
function* fields(bytes) {
  let pos = 0;
  const varint = () => {
    let result = 0;
    let scale = 1;
    for (;;) {
      if (pos >= bytes.length) throw new RangeError('truncated varint');
      const byte = bytes[pos++];
      result += (byte & 0x7f) * scale;
      if (byte < 0x80) return result;
      scale *= 128;
      if (scale > 2 ** 70) throw new RangeError('varint too long');
    }
  };
  while (pos < bytes.length) {
    const key = varint();
    const field = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === 0) yield [field, varint()];
    else if (wire === 2) {
      const length = varint();
      if (pos + length > bytes.length) throw new RangeError('truncated field');
      yield [field, bytes.subarray(pos, pos + length)];
      pos += length;
    } else if (wire === 1 || wire === 5) {
      pos += wire === 1 ? 8 : 4;
      yield [field, null];
    } else throw new RangeError(`unsupported wire type ${wire}`);
  }
  if (pos !== bytes.length) throw new RangeError('truncated message');
}
