/**
 * Read a checkpoint's bytes (ONNX Runtime's `ODTC` version 2) into its contents.
 *
 * What onnxtrain's Python reader accepts, with the same checks: identifier,
 * version, every offset and length, sizes against dims, element types,
 * negative dims, duplicate names, moments named `momentum0`, `momentum1`, ....
 * Tensors are copied out of the file, so the result does not hold on to it.
 * External data (`<checkpoint>.data`, written for checkpoints over 1.8 GB) is
 * refused: such a model does not train in a browser.
 * @module
 */

import { byCode, codeName } from './dtypes.js';
import { CheckpointError } from './errors.js';
import { root } from './flatbuffer.js';
import * as S from './schema.js';
import { plainBytes } from '../source.js';

/** @typedef {import('./flatbuffer.js').Table} Table */
/** @typedef {import('./state.js').StateTensor} StateTensor */
/** @typedef {import('./state.js').CheckpointContents} CheckpointContents */

const MOMENT_NAME = /^momentum(0|[1-9][0-9]*)$/;

/**
 * The contents of a checkpoint file; {@link CheckpointError} for anything that is not a valid checkpoint.
 * @param {Uint8Array} bytes
 * @returns {CheckpointContents}
 */
export function decode(bytes) {
  try {
    return checkpoint(plainBytes(bytes));
  } catch (error) {
    if (error instanceof CheckpointError) throw error;
    throw new CheckpointError(`invalid checkpoint: ${/** @type {Error} */ (error).message}`);
  }
}

/** @param {Uint8Array} bytes */
function checkpoint(bytes) {
  const table = root(bytes, S.FILE_IDENTIFIER, 'Checkpoint');
  const version = table.int32(S.Checkpoint.VERSION, 'version', 0);
  if (version !== S.VERSION) {
    throw new CheckpointError(`checkpoint version ${version} is not supported; only version ${S.VERSION} is`);
  }
  const module = table.table(S.Checkpoint.MODULE_STATE, 'module_state');
  let trainable = new Map();
  let frozen = new Map();
  let isNominal = false;
  if (module !== null) {
    isNominal = module.bool(S.ModuleState.IS_NOMINAL_STATE, 'is_nominal_state');
    if (module.bool(S.ModuleState.HAS_EXTERNAL_DATA, 'has_external_data')) {
      throw new CheckpointError(
        'the checkpoint keeps its tensors in an external <checkpoint>.data file, which onnxtrain-web does not read; ' +
          'save it from Python in one file (onnxtrain.checkpoint.save with a higher external_data_threshold)',
      );
    }
    trainable = tensors(module, S.ModuleState.REQUIRES_GRAD_PARAMS, 'requires_grad_params', isNominal);
    frozen = tensors(module, S.ModuleState.FROZEN_PARAMS, 'frozen_params', isNominal);
  }
  for (const name of trainable.keys()) {
    if (frozen.has(name)) throw new CheckpointError(`parameter '${name}' is both in requires_grad_params and frozen_params`);
  }
  return { trainable, frozen, optimizer: optimizer(table), properties: properties(table), isNominal };
}

/**
 * @param {Table} table
 * @param {number} slot
 * @param {string} what
 * @param {boolean} nominal
 */
function tensors(table, slot, what, nominal) {
  const found = table.tables(slot, what);
  if (found === null) throw new CheckpointError(`${table.name}.${what} is missing (ONNX Runtime requires it)`);
  return unique(
    found.map((t) => tensor(t, nominal)),
    `${table.name}.${what}`,
  );
}

/**
 * @param {Table} table
 * @param {boolean} nominal
 * @returns {[string, StateTensor]}
 */
function tensor(table, nominal) {
  const name = table.string(S.Tensor.NAME, 'name');
  if (name === null) throw new CheckpointError(`${table.name} has no name`);
  const where = `tensor '${name}' (${table.name})`;
  table.string(S.Tensor.DOC_STRING, 'doc_string');
  const dimsAt = table.vector(S.Tensor.DIMS, 8, 'dims');
  /** @type {number[]} */
  const dims = [];
  if (dimsAt !== null) {
    for (let i = 0; i < dimsAt[1]; i++) {
      const d = table.buf.view.getBigInt64(dimsAt[0] + 8 * i, true);
      if (d < 0n) throw new CheckpointError(`${where} has a negative dimension ${d}`);
      if (d > BigInt(Number.MAX_SAFE_INTEGER)) throw new CheckpointError(`${where} has a dimension ${d} too large to hold`);
      dims.push(Number(d));
    }
  }
  const code = table.int32(S.Tensor.DATA_TYPE, 'data_type', 0);
  const type = byCode(code);
  if (type === undefined) {
    throw new CheckpointError(
      `${where} is ${codeName(code)}, which onnxruntime's JavaScript tensors cannot hold; ` +
        'onnxtrain-web takes float, integer and bool tensors',
    );
  }
  const strings = table.vector(S.Tensor.STRING_DATA, 4, 'string_data');
  if (strings !== null && strings[1]) throw new CheckpointError(`${where} has string_data; a checkpoint holds numeric tensors only`);
  const raw = table.vector(S.Tensor.RAW_DATA, 1, 'raw_data');
  const offset = table.int64(S.Tensor.EXTERNAL_DATA_OFFSET, 'external_data_offset', -1n);
  if (offset < -1n) throw new CheckpointError(`${where} has an invalid external_data_offset ${offset}`);
  if (nominal) return [name, { type: type.type, dims, data: null }];
  const count = dims.reduce((a, b) => a * b, 1);
  const size = count * type.size;
  if (offset >= 0n) throw new CheckpointError(`${where} refers to external data, but module_state.has_external_data is false`);
  if (raw === null && size !== 0) throw new CheckpointError(`${where} has neither raw_data nor an external_data_offset`);
  const [start, length] = raw ?? [0, 0];
  if (length !== size) {
    throw new CheckpointError(`${where} has ${length} bytes of raw_data; ${type.type}[${dims.join(', ')}] needs ${size}`);
  }
  const copy = table.buf.bytes.slice(start, start + length); // a copy: the bytes are a plain Uint8Array (decode)
  if (code === 9 && copy.some((b) => b > 1)) throw new CheckpointError(`${where} is bool but holds bytes other than 0 and 1`);
  return [name, { type: type.type, dims, data: new type.array(copy.buffer, 0, count) }];
}

/** @param {Table} table */
function optimizer(table) {
  const groups = table.tables(S.Checkpoint.OPTIMIZER_GROUPS, 'optimizer_groups') ?? [];
  if (groups.length === 0) return null;
  if (groups.length > 1) {
    throw new CheckpointError(`the checkpoint has ${groups.length} optimizer groups; onnxtrain reads one (${S.GROUP_NAME})`);
  }
  const group = groups[0];
  const name = group.string(S.OptimizerGroup.GROUP_NAME, 'group_name');
  if (name !== S.GROUP_NAME) {
    throw new CheckpointError(`optimizer group ${JSON.stringify(name)} is not '${S.GROUP_NAME}', the one ONNX Runtime uses`);
  }
  const step = group.int64(S.OptimizerGroup.STEP, 'step', 0n);
  if (step < 0n || step > BigInt(Number.MAX_SAFE_INTEGER)) throw new CheckpointError(`optimizer step ${step} is out of range`);
  const initialLearningRate = group.float32(S.OptimizerGroup.INITIAL_LEARNING_RATE, 'initial_learning_rate');
  const states = group.tables(S.OptimizerGroup.OPTIMIZER_STATES, 'optimizer_states');
  if (states === null) throw new CheckpointError(`optimizer group ${S.GROUP_NAME} has no optimizer_states`);
  const moments = unique(states.map(parameterMoments), `optimizer group ${S.GROUP_NAME}`);
  return { step: Number(step), initialLearningRate, moments };
}

/**
 * @param {Table} table
 * @returns {[string, StateTensor[]]}
 */
function parameterMoments(table) {
  const name = table.string(S.ParameterOptimizerState.PARAM_NAME, 'param_name');
  if (name === null) throw new CheckpointError(`${table.name} has no param_name`);
  const found = table.tables(S.ParameterOptimizerState.MOMENTUMS, 'momentums');
  if (found === null) throw new CheckpointError(`the optimizer state of '${name}' has no momentums`);
  const byName = unique(
    found.map((t) => tensor(t, false)),
    `the optimizer state of '${name}'`,
  );
  /** @type {StateTensor[]} */
  const ordered = [];
  for (const [moment, value] of byName) {
    const match = MOMENT_NAME.exec(moment);
    if (match === null) {
      throw new CheckpointError(`the optimizer state of '${name}' has a tensor '${moment}'; expected momentum0, momentum1, ...`);
    }
    ordered[Number(match[1])] = value;
  }
  if (ordered.length !== byName.size) {
    throw new CheckpointError(`the moments of '${name}' are ${[...byName.keys()].sort()}; expected momentum0 .. momentum${byName.size - 1}`);
  }
  return [name, ordered];
}

/** @param {Table} table */
function properties(table) {
  const bag = table.table(S.Checkpoint.PROPERTY_BAG, 'property_bag');
  /** @type {[string, import('./state.js').PropertyValue][]} */
  const found = [];
  if (bag === null) return new Map(found);
  for (const prop of bag.tables(S.PropertyBag.INTS, 'ints') ?? []) found.push([propertyName(prop), prop.int64(S.Property.VALUE, 'value', 0n)]);
  for (const prop of bag.tables(S.PropertyBag.FLOATS, 'floats') ?? []) found.push([propertyName(prop), prop.float32(S.Property.VALUE, 'value')]);
  for (const prop of bag.tables(S.PropertyBag.STRINGS, 'strings') ?? []) {
    const name = propertyName(prop);
    const value = prop.string(S.Property.VALUE, 'value');
    if (value === null) throw new CheckpointError(`string property '${name}' has no value`);
    found.push([name, value]);
  }
  return unique(found, 'the property bag');
}

/** @param {Table} prop */
function propertyName(prop) {
  const name = prop.string(S.Property.NAME, 'name');
  if (name === null) throw new CheckpointError(`${prop.name} has no name`);
  return name;
}

/**
 * A Map of the entries; {@link CheckpointError} for a name given twice.
 * @template T
 * @param {[string, T][]} entries
 * @param {string} where
 * @returns {Map<string, T>}
 */
function unique(entries, where) {
  const out = new Map();
  for (const [name, value] of entries) {
    if (out.has(name)) throw new CheckpointError(`${where} has '${name}' twice`);
    out.set(name, value);
  }
  return out;
}
