// Types of onnxtrain-web (src/index.js). The implementation is JavaScript with JSDoc; these are its public API.
import type { InferenceSession, Tensor } from 'onnxruntime-common';

/** The values of a tensor in the typed array of its element type. */
export type TensorData =
  | Float32Array
  | Float64Array
  | Int8Array
  | Uint8Array
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | BigInt64Array
  | BigUint64Array;

/** A tensor of a checkpoint: onnxruntime's element type, dims, values (`null` in a nominal state). */
export interface StateTensor {
  type: Tensor.Type;
  dims: readonly number[];
  data: TensorData | null;
}

/** ONNX Runtime's optimizer group `group0`: step count, initial learning rate, each parameter's moments. */
export interface OptimizerState {
  step: number;
  initialLearningRate: number;
  moments: Map<string, StateTensor[]>;
}

/** int64 properties are `bigint`, float32 properties `number`, string properties `string`. */
export type PropertyValue = bigint | number | string;

/** What a checkpoint holds. */
export interface CheckpointContents {
  trainable: Map<string, StateTensor>;
  frozen: Map<string, StateTensor>;
  optimizer: OptimizerState | null;
  properties: Map<string, PropertyValue>;
  isNominal: boolean;
}

/** A path (Node.js), a URL (the browser) or the file's bytes. */
export type URIorBuffer = string | URL | Uint8Array | ArrayBuffer;

/** A checkpoint that is not one, is damaged, or holds what onnxtrain-web cannot use. */
export class CheckpointError extends Error {
  constructor(message: string);
}

/** A checkpoint's state (ONNX Runtime's on-device training format), which a TrainingSession trains in place. */
export class CheckpointState implements CheckpointContents {
  constructor(contents?: Partial<CheckpointContents>);
  trainable: Map<string, StateTensor>;
  frozen: Map<string, StateTensor>;
  optimizer: OptimizerState | null;
  properties: Map<string, PropertyValue>;
  isNominal: boolean;
  /** The state in a checkpoint file's bytes; throws CheckpointError when they are not a valid checkpoint. */
  static fromBuffer(bytes: Uint8Array | ArrayBuffer): CheckpointState;
  /** Load a checkpoint from a path (Node.js), a URL (fetched in the browser) or its bytes. */
  static loadCheckpoint(source: URIorBuffer): Promise<CheckpointState>;
  /** The checkpoint file's bytes; the optimizer state only with `includeOptimizerState` (ONNX Runtime's default: without). */
  toBuffer(options?: { includeOptimizerState?: boolean }): Uint8Array;
  hasParameter(name: string): boolean;
  getParameter(name: string): StateTensor & { requiresGrad: boolean };
  updateParameter(name: string, data: TensorData): void;
}

/** ONNX Runtime's TrainingSessionCreateOptions; the checkpoint may also be a loaded CheckpointState. */
export interface TrainingSessionCreateOptions {
  checkpointState: URIorBuffer | CheckpointState;
  trainModel: URIorBuffer;
  evalModel?: URIorBuffer;
  optimizerModel?: URIorBuffer;
}

/** What onnxtrain-web needs of an onnxruntime package: `import * as ort from 'onnxruntime-web'` (or `-node`). */
export interface Runtime {
  InferenceSession: { create(buffer: Uint8Array, options?: InferenceSession.SessionOptions): Promise<InferenceSession> };
  Tensor: typeof Tensor;
}

/** ONNX Runtime's default learning rate (1e-3), until one is set or a checkpoint with optimizer state gives one. */
export const DEFAULT_LEARNING_RATE: number;

/** Trains onnxtrain's artifacts with ONNX Runtime's web training API. */
export class TrainingSession {
  /** Not for callers: use create or createWith. */
  constructor(...internal: unknown[]);
  /** Throws here: use `onnxtrain-web/web` or `onnxtrain-web/node`, whose `create` binds an onnxruntime, or `createWith`. */
  static create(options: TrainingSessionCreateOptions, sessionOptions?: InferenceSession.SessionOptions): Promise<TrainingSession>;
  /** Load the checkpoint and the models on `runtime`; `sessionOptions` apply to every model. */
  static createWith<T extends TrainingSession>(
    this: new (...args: any[]) => T,
    runtime: Runtime,
    options: TrainingSessionCreateOptions,
    sessionOptions?: InferenceSession.SessionOptions,
  ): Promise<T>;

  /** The training model's user inputs. */
  readonly trainingInputNames: readonly string[];
  /** The loss, then the additional outputs. */
  readonly trainingOutputNames: readonly string[];
  readonly evalInputNames: readonly string[];
  readonly evalOutputNames: readonly string[];
  /** Every parameter in training-model order: the layout of getContiguousParameters' buffer. */
  readonly parameterNames: readonly string[];
  /** The state this session trains. */
  readonly checkpointState: CheckpointState;

  /** Forward and backward; gradients added to the accumulated ones (replacing them after lazyResetGrad). */
  runTrainStep(feeds: Record<string, Tensor>, options?: InferenceSession.RunOptions): Promise<Record<string, Tensor>>;
  runTrainStep(
    feeds: Record<string, Tensor>,
    fetches: readonly string[] | Record<string, null>,
    options?: InferenceSession.RunOptions,
  ): Promise<Record<string, Tensor>>;
  /** Update the trainable parameters from the accumulated gradients; throws when there are none. */
  runOptimizerStep(options?: InferenceSession.RunOptions): Promise<void>;
  /** The next train step starts from zero gradients. */
  lazyResetGrad(): Promise<void>;
  runEvalStep(feeds: Record<string, Tensor>, options?: InferenceSession.RunOptions): Promise<Record<string, Tensor>>;
  runEvalStep(
    feeds: Record<string, Tensor>,
    fetches: readonly string[] | Record<string, null>,
    options?: InferenceSession.RunOptions,
  ): Promise<Record<string, Tensor>>;
  getLearningRate(): number;
  setLearningRate(learningRate: number): void;
  /** Elements of the (trainable, by default) parameters. */
  getParametersSize(trainableOnly?: boolean): Promise<number>;
  /** The trainable parameters (every one with `false`) as one float32 tensor, in training-model order. */
  getContiguousParameters(trainableOnly?: boolean): Promise<Tensor>;
  /** Load the (trainable, by default) parameters from one float32 buffer or its bytes. */
  loadParametersBuffer(buffer: Uint8Array | Float32Array | Tensor, trainableOnly?: boolean): Promise<void>;
  release(): Promise<void>;
}
