/**
 * A bounds-checked view of a flatbuffer: tables, scalars, strings and vectors.
 *
 * Every read checks that what it touches lies inside the buffer and is aligned
 * as flatbuffers' verifier requires, and throws {@link CheckpointError}
 * otherwise; a budget caps the bytes decoded in total (twice the file), so
 * offsets that point many entries at the same data cannot multiply the work.
 * Layout (little-endian): a table starts with an int32 `soffset` to its vtable
 * (`vtable = table - soffset`); a vtable is `[size:u16, tableSize:u16,
 * fieldOffset:u16 ...]`; a reference field holds a uint32 offset relative to
 * its own position; a vector is `[length:u32, elements...]`; a string is a
 * byte vector followed by a NUL.
 * @module
 */

import { CheckpointError } from './errors.js';

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/** The bytes of one buffer and what has been decoded of it so far. */
export class Buffer {
  /** @param {Uint8Array} bytes */
  constructor(bytes) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.budget = 2 * bytes.byteLength + 4096;
  }

  /**
   * Count `size` more bytes decoded; throw when the file refers to more data than it holds.
   * @param {number} size
   * @param {string} what
   */
  spend(size, what) {
    this.budget -= size;
    if (this.budget < 0) {
      throw new CheckpointError(`${what}: the file refers to more data than it holds; entries share data, so the file is corrupt`);
    }
  }

  /**
   * @param {number} position
   * @param {number} size
   * @param {string} what
   */
  check(position, size, what) {
    if (position < 0 || position + size > this.bytes.byteLength) {
      throw new CheckpointError(
        `${what} at byte ${position} (+${size}) lies outside the ${this.bytes.byteLength}-byte file; the file is truncated or corrupt`,
      );
    }
  }

  /**
   * Where the uint32 offset at `position` points.
   * @param {number} position
   * @param {string} what
   */
  follow(position, what) {
    this.check(position, 4, what);
    const offset = this.view.getUint32(position, true);
    if (offset === 0 || offset >= 2 ** 31) throw new CheckpointError(`${what} has an invalid offset ${offset}`);
    this.check(position + offset, 4, what);
    return position + offset;
  }

  /**
   * `[start, length]` of the vector at `position` whose elements take `size` bytes.
   * @param {number} position
   * @param {number} size
   * @param {string} what
   * @returns {[number, number]}
   */
  vector(position, size, what) {
    aligned(position, 4, what);
    const length = this.view.getUint32(position, true);
    const start = position + 4;
    if (length > Math.floor((this.bytes.byteLength - start) / size)) {
      throw new CheckpointError(
        `${what} claims ${length} elements of ${size} bytes, more than the ${this.bytes.byteLength - start} bytes left`,
      );
    }
    this.spend(4 + length * size, what);
    return [start, length];
  }

  /**
   * The string at `position`.
   * @param {number} position
   * @param {string} what
   */
  string(position, what) {
    const [start, length] = this.vector(position, 1, what);
    if (start + length >= this.bytes.byteLength || this.bytes[start + length] !== 0) {
      throw new CheckpointError(`${what} is a string without its terminating NUL byte`);
    }
    try {
      return UTF8.decode(this.bytes.subarray(start, start + length));
    } catch {
      throw new CheckpointError(`${what} is not valid UTF-8`);
    }
  }
}

/** One table of a {@link Buffer}: its position and vtable, checked. */
export class Table {
  /**
   * @param {Buffer} buf
   * @param {number} position
   * @param {string} name what the table is, for the errors (`Checkpoint.module_state`)
   */
  constructor(buf, position, name) {
    buf.check(position, 4, name);
    aligned(position, 4, name);
    buf.spend(4, name);
    const vtable = position - buf.view.getInt32(position, true);
    buf.check(vtable, 4, `${name} vtable`);
    aligned(vtable, 2, `${name} vtable`);
    const vtableSize = buf.view.getUint16(vtable, true);
    const tableSize = buf.view.getUint16(vtable + 2, true);
    if (vtableSize < 4 || vtableSize % 2) throw new CheckpointError(`${name} vtable has an invalid size ${vtableSize}`);
    buf.check(vtable, vtableSize, `${name} vtable`);
    if (tableSize < 4) throw new CheckpointError(`${name} has an invalid size ${tableSize}`);
    buf.check(position, tableSize, name);
    this.buf = buf;
    this.position = position;
    this.vtable = vtable;
    this.vtableSize = vtableSize;
    this.tableSize = tableSize;
    this.name = name;
  }

  /**
   * The absolute position of field `slot` (`size` bytes), or `null` when absent.
   * @param {number} slot
   * @param {number} size
   * @param {string} what
   */
  field(slot, size, what) {
    const entry = 4 + 2 * slot;
    if (entry + 2 > this.vtableSize) return null;
    const offset = this.buf.view.getUint16(this.vtable + entry, true);
    if (offset === 0) return null;
    if (offset < 4 || offset + size > this.tableSize) throw new CheckpointError(`${this.name}.${what} lies outside its table`);
    const position = this.position + offset;
    aligned(position, size, `${this.name}.${what}`);
    return position;
  }

  /**
   * @param {number} slot
   * @param {string} what
   * @param {number} fallback
   */
  int32(slot, what, fallback) {
    const p = this.field(slot, 4, what);
    return p === null ? fallback : this.buf.view.getInt32(p, true);
  }

  /**
   * @param {number} slot
   * @param {string} what
   * @param {bigint} fallback
   */
  int64(slot, what, fallback) {
    const p = this.field(slot, 8, what);
    return p === null ? fallback : this.buf.view.getBigInt64(p, true);
  }

  /**
   * @param {number} slot
   * @param {string} what
   */
  float32(slot, what) {
    const p = this.field(slot, 4, what);
    return p === null ? 0 : this.buf.view.getFloat32(p, true);
  }

  /**
   * @param {number} slot
   * @param {string} what
   */
  bool(slot, what) {
    const p = this.field(slot, 1, what);
    return p === null ? false : this.buf.bytes[p] !== 0;
  }

  /**
   * Where a reference field points, or `null` when absent.
   * @param {number} slot
   * @param {string} what
   */
  target(slot, what) {
    const p = this.field(slot, 4, what);
    return p === null ? null : this.buf.follow(p, `${this.name}.${what}`);
  }

  /**
   * @param {number} slot
   * @param {string} what
   * @returns {Table | null}
   */
  table(slot, what) {
    const t = this.target(slot, what);
    return t === null ? null : new Table(this.buf, t, `${this.name}.${what}`);
  }

  /**
   * @param {number} slot
   * @param {string} what
   * @returns {string | null}
   */
  string(slot, what) {
    const t = this.target(slot, what);
    return t === null ? null : this.buf.string(t, `${this.name}.${what}`);
  }

  /**
   * `[start, length]` of a vector of scalars of `size` bytes, or `null` when absent.
   * @param {number} slot
   * @param {number} size
   * @param {string} what
   * @returns {[number, number] | null}
   */
  vector(slot, size, what) {
    const t = this.target(slot, what);
    return t === null ? null : this.buf.vector(t, size, `${this.name}.${what}`);
  }

  /**
   * A vector of tables, or `null` when absent.
   * @param {number} slot
   * @param {string} what
   * @returns {Table[] | null}
   */
  tables(slot, what) {
    const found = this.vector(slot, 4, what);
    if (found === null) return null;
    const [start, length] = found;
    const tables = [];
    for (let i = 0; i < length; i++) {
      const where = `${this.name}.${what}[${i}]`;
      tables.push(new Table(this.buf, this.buf.follow(start + 4 * i, where), where));
    }
    return tables;
  }
}

/**
 * The root table of a buffer with a file identifier.
 * @param {Uint8Array} bytes
 * @param {string} identifier
 * @param {string} name
 */
export function root(bytes, identifier, name) {
  if (bytes.byteLength < 8) {
    throw new CheckpointError(`the file has ${bytes.byteLength} bytes, too few for a flatbuffer (at least 8)`);
  }
  const found = String.fromCharCode(...bytes.subarray(4, 8));
  if (found !== identifier) {
    throw new CheckpointError(
      `file identifier ${JSON.stringify(found)} is not ${JSON.stringify(identifier)}: this is not an ONNX Runtime training checkpoint`,
    );
  }
  const buf = new Buffer(bytes);
  return new Table(buf, buf.follow(0, 'root'), name);
}

/**
 * @param {number} position
 * @param {number} alignment
 * @param {string} what
 */
function aligned(position, alignment, what) {
  if (position % alignment) throw new CheckpointError(`${what} at byte ${position} is not aligned to ${alignment} bytes`);
}
