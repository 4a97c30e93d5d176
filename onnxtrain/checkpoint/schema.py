"""ONNX Runtime's training checkpoint schema: field slots in schema order.

From ``onnxruntime/core/flatbuffers/schema/ort_training_checkpoint.fbs`` and
``ort.fbs`` (namespace ``onnxruntime.fbs``), checked against the bindings that
``onnxruntime-training`` 1.19.2 ships (a field's vtable entry is at
``4 + 2 * slot``)::

    table Checkpoint  { version:int32; module_state:ModuleState;
                        optimizer_groups:[OptimizerGroup]; property_bag:PropertyBag; }
    table ModuleState { requires_grad_params:[Tensor]; frozen_params:[Tensor];
                        is_nominal_state:bool; has_external_data:bool; }
    table OptimizerGroup { group_name:string; step:int64; initial_learning_rate:float;
                           optimizer_states:[ParameterOptimizerState]; }
    table ParameterOptimizerState { param_name:string; momentums:[Tensor]; }
    table PropertyBag { ints:[IntProperty]; floats:[FloatProperty]; strings:[StringProperty]; }
    table IntProperty { name:string; value:int64; }      // FloatProperty: float,
                                                         // StringProperty: string
    table Tensor { name:string; doc_string:string; dims:[int64]; data_type:TensorDataType (int32);
                   raw_data:[uint8]; string_data:[string]; external_data_offset:int64 = -1; }

    root_type Checkpoint;  file_identifier "ODTC";
"""

from __future__ import annotations

FILE_IDENTIFIER = b"ODTC"
#: ``kCheckpointVersion``; ORT loads only this exact version.
VERSION = 2


class CheckpointSlots:
    VERSION = 0
    MODULE_STATE = 1
    OPTIMIZER_GROUPS = 2
    PROPERTY_BAG = 3
    COUNT = 4


class ModuleStateSlots:
    REQUIRES_GRAD_PARAMS = 0
    FROZEN_PARAMS = 1
    IS_NOMINAL_STATE = 2
    HAS_EXTERNAL_DATA = 3
    COUNT = 4


class OptimizerGroupSlots:
    GROUP_NAME = 0
    STEP = 1
    INITIAL_LEARNING_RATE = 2
    OPTIMIZER_STATES = 3
    COUNT = 4


class ParameterOptimizerStateSlots:
    PARAM_NAME = 0
    MOMENTUMS = 1
    COUNT = 2


class PropertyBagSlots:
    INTS = 0
    FLOATS = 1
    STRINGS = 2
    COUNT = 3


class PropertySlots:
    """IntProperty, FloatProperty and StringProperty share this layout."""

    NAME = 0
    VALUE = 1
    COUNT = 2


class TensorSlots:
    NAME = 0
    DOC_STRING = 1
    DIMS = 2
    DATA_TYPE = 3
    RAW_DATA = 4
    STRING_DATA = 5
    EXTERNAL_DATA_OFFSET = 6
    COUNT = 7
