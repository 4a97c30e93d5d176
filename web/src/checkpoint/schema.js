/**
 * ONNX Runtime's on-device training checkpoint schema (`onnxruntime.fbs`, file
 * identifier `ODTC`, version 2): the field slots of each table, in schema order.
 * A field's vtable entry is at `4 + 2 * slot`. The same slots as onnxtrain's
 * Python reader and writer (`onnxtrain/checkpoint/schema.py`).
 * @module
 */

/** The file identifier at bytes 4..8. */
export const FILE_IDENTIFIER = 'ODTC';
/** `kCheckpointVersion`: ONNX Runtime loads only this exact version. */
export const VERSION = 2;
/** The one optimizer group ONNX Runtime writes and reads. */
export const GROUP_NAME = 'group0';

/** `Checkpoint { version, module_state, optimizer_groups, property_bag }`. */
export const Checkpoint = Object.freeze({ VERSION: 0, MODULE_STATE: 1, OPTIMIZER_GROUPS: 2, PROPERTY_BAG: 3, COUNT: 4 });
/** `ModuleState { requires_grad_params, frozen_params, is_nominal_state, has_external_data }`. */
export const ModuleState = Object.freeze({
  REQUIRES_GRAD_PARAMS: 0,
  FROZEN_PARAMS: 1,
  IS_NOMINAL_STATE: 2,
  HAS_EXTERNAL_DATA: 3,
  COUNT: 4,
});
/** `OptimizerGroup { group_name, step, initial_learning_rate, optimizer_states }`. */
export const OptimizerGroup = Object.freeze({
  GROUP_NAME: 0,
  STEP: 1,
  INITIAL_LEARNING_RATE: 2,
  OPTIMIZER_STATES: 3,
  COUNT: 4,
});
/** `ParameterOptimizerState { param_name, momentums }`. */
export const ParameterOptimizerState = Object.freeze({ PARAM_NAME: 0, MOMENTUMS: 1, COUNT: 2 });
/** `PropertyBag { ints, floats, strings }`. */
export const PropertyBag = Object.freeze({ INTS: 0, FLOATS: 1, STRINGS: 2, COUNT: 3 });
/** `IntProperty`, `FloatProperty`, `StringProperty`: `{ name, value }`. */
export const Property = Object.freeze({ NAME: 0, VALUE: 1, COUNT: 2 });
/** `Tensor { name, doc_string, dims, data_type, raw_data, string_data, external_data_offset = -1 }`. */
export const Tensor = Object.freeze({
  NAME: 0,
  DOC_STRING: 1,
  DIMS: 2,
  DATA_TYPE: 3,
  RAW_DATA: 4,
  STRING_DATA: 5,
  EXTERNAL_DATA_OFFSET: 6,
  COUNT: 7,
});
