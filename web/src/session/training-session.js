/**
 * `TrainingSession`: ONNX Runtime's web training API (`onnxruntime-web/training`, names and semantics) over
 * onnxtrain's artifacts, run by stock onnxruntime (onnxruntime-web or onnxruntime-node), whichever the
 * caller gives.
 *
 * The runtime around the three models, as onnxtrain's Python runtime drives them (docs/runtime.md):
 * a train step feeds the user's inputs, every parameter, the gradient buffers and `lazy_reset_grad`
 * (true on the first train step after the session is made or after `lazyResetGrad()`, so successive train
 * steps add up their gradients); it keeps the accumulated gradients and the BatchNormalization running
 * statistics. An optimizer step feeds `learning_rate`, `step` (the state's step count + 1) and, per
 * trainable parameter, the parameter, its gradient and its moments; it writes the new values into the
 * checkpoint state. A step that fails leaves the state as it was.
 * @module
 */

import { CheckpointState, elementCount } from '../checkpoint/state.js';
import { byType } from '../checkpoint/dtypes.js';
import { readSource } from '../source.js';
import { checkFeeds } from './feeds.js';
import { evalIO, optimizerIO, trainingIO } from './model-io.js';
import { labelError } from './label-error.js';
import { readModelHeader } from './model-proto.js';
import * as N from './names.js';
import * as P from './parameters.js';

/** @typedef {import('onnxruntime-common').InferenceSession} InferenceSession */
/** @typedef {import('onnxruntime-common').InferenceSession.SessionOptions} SessionOptions */
/** @typedef {import('onnxruntime-common').InferenceSession.RunOptions} RunOptions */
/** @typedef {import('onnxruntime-common').Tensor} Tensor */
/** @typedef {import('../checkpoint/state.js').StateTensor} StateTensor */
/** @typedef {import('../checkpoint/state.js').TensorData} TensorData */
/** @typedef {import('./model-proto.js').LabelCheck} LabelCheck */

/**
 * What onnxtrain-web needs of an onnxruntime package: `import * as ort from 'onnxruntime-web'` (or `-node`).
 * @typedef {{ InferenceSession: typeof import('onnxruntime-common').InferenceSession, Tensor: typeof import('onnxruntime-common').Tensor }} Runtime
 */

/**
 * A path (Node.js), a URL (the browser) or the file's bytes.
 * @typedef {string | URL | Uint8Array | ArrayBuffer} URIorBuffer
 */

/**
 * ONNX Runtime's `TrainingSessionCreateOptions`; the checkpoint may also be a loaded {@link CheckpointState}.
 * @typedef {Object} TrainingSessionCreateOptions
 * @property {URIorBuffer | CheckpointState} checkpointState
 * @property {URIorBuffer} trainModel
 * @property {URIorBuffer} [evalModel]
 * @property {URIorBuffer} [optimizerModel]
 */

/** ONNX Runtime's default learning rate, until one is set or a checkpoint with optimizer state gives one. */
export const DEFAULT_LEARNING_RATE = 1e-3;

/**
 * Load one model into an onnxruntime session; errors say which model and why.
 * @param {Runtime} runtime
 * @param {URIorBuffer} source
 * @param {string} what
 * @param {SessionOptions | undefined} sessionOptions
 */
async function openModel(runtime, source, what, sessionOptions) {
  const bytes = await readSource(source, what);
  const header = readModelHeader(bytes);
  if (header === null || header.irVersion === null || header.irVersion < 1) {
    throw new Error(`${what} is not an ONNX model: its ${bytes.byteLength} bytes are not a ModelProto`);
  }
  try {
    const session = await runtime.InferenceSession.create(bytes.slice(), sessionOptions ?? {});
    return { session, header };
  } catch (error) {
    const opset = header.opsets.get('');
    throw new Error(
      `onnxruntime could not load ${what} (IR version ${header.irVersion}, ai.onnx opset ${opset ?? 'none'}): ` +
        `${/** @type {Error} */ (error).message}. See docs/web.md ("Versions") for the IR versions and opsets it loads`,
    );
  }
}

/** Trains onnxtrain's artifacts in the browser or in Node.js. Make one with `TrainingSession.create`. */
export class TrainingSession {
  /** @type {Runtime} */ #runtime;
  /** @type {CheckpointState} */ #state;
  /** @type {InferenceSession} */ #train;
  /** @type {InferenceSession | null} */ #eval;
  /** @type {InferenceSession | null} */ #optimizer;
  /** @type {import('./model-io.js').TrainingIO} */ #io;
  /** @type {import('./model-io.js').EvalIO | null} */ #evalIo;
  /** @type {import('./model-io.js').OptimizerIO | null} */ #optimizerIo;
  /** @type {Map<string, TensorData>} the accumulated gradient of each trainable parameter */
  #gradients = new Map();
  /** @type {'none' | 'reset' | 'ready'} none: before any train step; reset: after lazyResetGrad() */
  #gradientStatus = 'none';
  /** the next train step overwrites the gradient buffers */
  #resetPending = true;
  #learningRate = DEFAULT_LEARNING_RATE;
  #trainSteps = 0;
  #busy = false;
  #released = false;
  /** @type {Map<InferenceSession, LabelCheck[]>} the label checks in each session's model, for their errors */
  #labelChecks;

  /**
   * Not for callers: use `TrainingSession.create`.
   * @param {Runtime} runtime
   * @param {CheckpointState} state
   * @param {{ train: InferenceSession, eval: InferenceSession | null, optimizer: InferenceSession | null }} sessions
   * @param {Map<string, string>} optimizerMetadata
   * @param {Map<InferenceSession, LabelCheck[]>} [labelChecks] the label checks of each session's model
   */
  constructor(runtime, state, sessions, optimizerMetadata, labelChecks = new Map()) {
    this.#runtime = runtime;
    this.#labelChecks = labelChecks;
    this.#state = state;
    this.#train = sessions.train;
    this.#eval = sessions.eval;
    this.#optimizer = sessions.optimizer;
    this.#io = trainingIO(sessions.train.inputMetadata, sessions.train.outputNames, state);
    const trainingInputs = this.#io.inputs.map((i) => i.name);
    this.#evalIo = sessions.eval === null ? null : evalIO(sessions.eval.inputMetadata, sessions.eval.outputNames, state, trainingInputs);
    this.#optimizerIo =
      sessions.optimizer === null
        ? null
        : optimizerIO(sessions.optimizer.inputMetadata, sessions.optimizer.outputNames, this.#io.trainable, state, optimizerMetadata);
    if (state.optimizer !== null) {
      const expected = this.#optimizerIo?.numStates;
      for (const [name, moments] of state.optimizer.moments) {
        if (expected !== undefined && moments.length !== expected) {
          throw new Error(
            `the checkpoint's optimizer state has ${moments.length} moment(s) for '${name}', but the optimizer model keeps ${expected} ` +
              'per parameter: it was saved with another optimizer or other artifacts; load a checkpoint of these artifacts, or one without optimizer state',
          );
        }
      }
      this.#learningRate = state.optimizer.initialLearningRate;
    }
    this.#allocate();
  }

  /**
   * In the package's entry points (`onnxtrain-web/node`, `onnxtrain-web/web`), creates a session on their
   * onnxruntime; here it says so.
   * @param {TrainingSessionCreateOptions} _options
   * @param {SessionOptions} [_sessionOptions]
   * @returns {Promise<TrainingSession>}
   */
  static async create(_options, _sessionOptions) {
    throw new Error(
      "TrainingSession.create needs an onnxruntime: import { TrainingSession } from 'onnxtrain-web/node' (onnxruntime-node) " +
        "or 'onnxtrain-web/web' (onnxruntime-web), or call TrainingSession.createWith(ort, options, sessionOptions)",
    );
  }

  /**
   * Load the checkpoint and the models on `runtime` (an imported onnxruntime-web or onnxruntime-node).
   * `sessionOptions` (execution providers, threads, ...) apply to every model.
   * @template {TrainingSession} T
   * @this {new (...args: any[]) => T}
   * @param {Runtime} runtime
   * @param {TrainingSessionCreateOptions} options
   * @param {SessionOptions} [sessionOptions]
   * @returns {Promise<T>}
   */
  static async createWith(runtime, options, sessionOptions) {
    if (typeof runtime?.InferenceSession?.create !== 'function' || typeof runtime?.Tensor !== 'function') {
      throw new TypeError("createWith: give the onnxruntime package itself: import * as ort from 'onnxruntime-web' (or 'onnxruntime-node')");
    }
    if (typeof options !== 'object' || options === null) {
      throw new TypeError('TrainingSession.create: give { checkpointState, trainModel, evalModel?, optimizerModel? }');
    }
    if (/** @type {any} */ (runtime).env?.wasm?.proxy) {
      throw new Error(
        "TrainingSession.create: onnxruntime-web's proxy worker (env.wasm.proxy = true) transfers the tensors it is given, " +
          'which would take the state\'s arrays away from it; set env.wasm.proxy = false (run the training in a Worker of your own instead)',
      );
    }
    for (const key of /** @type {const} */ (['checkpointState', 'trainModel'])) {
      if (options[key] === undefined || options[key] === null) {
        const file = key === 'trainModel' ? 'training_model.onnx' : 'checkpoint';
        throw new TypeError(`TrainingSession.create: ${key} is missing; give ${file} of the artifacts as a path, URL or bytes`);
      }
    }
    const known = ['checkpointState', 'trainModel', 'evalModel', 'optimizerModel'];
    const unknown = Object.keys(options).filter((k) => !known.includes(k));
    if (unknown.length) throw new TypeError(`TrainingSession.create: unknown option(s) ${JSON.stringify(unknown)}; the options are ${known.join(', ')}`);
    const state =
      options.checkpointState instanceof CheckpointState ? options.checkpointState : await CheckpointState.loadCheckpoint(options.checkpointState);
    const train = await openModel(runtime, options.trainModel, 'the training model', sessionOptions);
    const evalModel = options.evalModel == null ? null : await openModel(runtime, options.evalModel, 'the eval model', sessionOptions);
    const optimizer =
      options.optimizerModel == null ? null : await openModel(runtime, options.optimizerModel, 'the optimizer model', sessionOptions);
    const sessions = { train: train.session, eval: evalModel?.session ?? null, optimizer: optimizer?.session ?? null };
    const checks = new Map([train, evalModel].filter((m) => m !== null).map((m) => [m.session, m.header.labelChecks]));
    try {
      return new this(runtime, state, sessions, optimizer?.header.metadata ?? new Map(), checks);
    } catch (error) {
      await Promise.all(Object.values(sessions).map((s) => s?.release()));
      throw error;
    }
  }

  // ------------------------------------------------------------------ names

  /** The training model's user inputs (parameters, buffers and the flag hidden). */
  get trainingInputNames() {
    return this.#io.inputs.map((i) => i.name);
  }

  /** The training model's user outputs: the loss, then the additional outputs. */
  get trainingOutputNames() {
    return [...this.#io.outputs];
  }

  /** The eval model's user inputs; empty without an eval model. */
  get evalInputNames() {
    return this.#evalIo?.inputs.map((i) => i.name) ?? [];
  }

  /** The eval model's outputs; empty without an eval model. */
  get evalOutputNames() {
    return [...(this.#evalIo?.outputs ?? [])];
  }

  /** Every parameter, in training-model order: the order of `getContiguousParameters`' buffer. */
  get parameterNames() {
    return [...this.#io.parameters];
  }

  /** The state this session trains: save it with `checkpointState.toBuffer({ includeOptimizerState: true })`. */
  get checkpointState() {
    return this.#state;
  }

  // ------------------------------------------------------------------ steps

  /**
   * One train step: forward and backward; the gradients are added to the accumulated ones, or replace them
   * on the first step after the session is made or after `lazyResetGrad()`.
   * @param {Record<string, Tensor>} feeds the training model's user inputs by name
   * @param {readonly string[] | Record<string, null> | RunOptions} [fetches] the outputs to return (default: all), or `options`
   * @param {RunOptions} [options]
   * @returns {Promise<Record<string, Tensor>>} the loss and the additional outputs, by name
   */
  async runTrainStep(feeds, fetches, options) {
    const [wanted, runOptions] = this.#fetches('runTrainStep', fetches, options, this.#io.outputs);
    this.#usable('runTrainStep', 'Cannot perform TrainStep with a nominal state. Please load the model parameters first.');
    const all = { ...checkFeeds(feeds, this.#io.inputs, 'runTrainStep', 'training model') };
    for (const name of this.#io.parameters) all[name] = this.#tensorOf(name);
    for (const name of this.#io.trainable) {
      const param = /** @type {StateTensor} */ (this.#state.trainable.get(name));
      all[N.bufferName(name)] = new this.#runtime.Tensor(param.type, /** @type {any} */ (this.#gradients.get(name)), param.dims);
    }
    all[N.LAZY_RESET_GRAD] = new this.#runtime.Tensor('bool', Uint8Array.of(this.#resetPending ? 1 : 0), [1]);
    const results = await this.#run(this.#train, all, runOptions, `train step ${this.#trainSteps + 1}`);
    /** @type {[string, TensorData][]} */
    const gradients = this.#io.trainable.map((name) => [name, this.#output(results, N.accumulatedName(name), name)]);
    const statistics = [...this.#io.statistics].map(([name, output]) => [name, this.#output(results, output, name)]);
    for (const [name, data] of gradients) this.#gradients.set(name, data);
    for (const [name, data] of statistics) this.#setParameter(/** @type {string} */ (name), /** @type {TensorData} */ (data));
    this.#resetPending = false;
    this.#gradientStatus = 'ready';
    this.#trainSteps += 1;
    return pick(results, wanted);
  }

  /**
   * One optimizer step with the accumulated gradients; the state's step count goes up by one. As in ONNX
   * Runtime it does not reset the gradients (call `lazyResetGrad()`); unlike it, a step without gradients
   * (before any train step, or right after `lazyResetGrad()`) throws instead of applying zero or stale ones.
   * @param {RunOptions} [options]
   * @returns {Promise<void>}
   */
  async runOptimizerStep(options) {
    this.#alive('runOptimizerStep');
    if (this.#optimizer === null || this.#optimizerIo === null) {
      throw new Error('runOptimizerStep: this session has no optimizer model; pass optimizerModel (optimizer_model.onnx) to TrainingSession.create');
    }
    this.#usable('runOptimizerStep', 'The optimizer state cannot be constructed. Please load the model parameters first.');
    if (this.#gradientStatus !== 'ready') {
      const when = this.#gradientStatus === 'reset' ? 'after lazyResetGrad()' : 'before any train step';
      throw new Error(`runOptimizerStep ${when}: there are no gradients to apply; run a train step (runTrainStep) first`);
    }
    const optimizer = /** @type {import('../checkpoint/state.js').OptimizerState} */ (this.#state.optimizer);
    const { Tensor } = this.#runtime;
    /** @type {Record<string, Tensor>} */
    const feeds = {
      [N.LEARNING_RATE]: new Tensor('float32', Float32Array.of(this.#learningRate), [1]),
      [N.STEP]: new Tensor('int64', BigInt64Array.of(BigInt(optimizer.step + 1)), [1]),
    };
    for (const name of this.#io.trainable) {
      const param = /** @type {StateTensor} */ (this.#state.trainable.get(name));
      feeds[name] = this.#tensorOf(name);
      feeds[N.gradName(name)] = new Tensor(param.type, /** @type {any} */ (this.#gradients.get(name)), param.dims);
      /** @type {StateTensor[]} */ (optimizer.moments.get(name)).forEach((m, i) => {
        feeds[N.momentName(name, i)] = new Tensor(m.type, /** @type {any} */ (m.data), m.dims);
      });
    }
    for (const name of this.#optimizerIo.shared) feeds[name] = this.#tensorOf(name); // the loss scaler's state
    const results = await this.#run(this.#optimizer, feeds, options, `optimizer step ${optimizer.step + 1}`);
    const updates = this.#io.trainable.map((name) => ({
      name,
      value: this.#output(results, N.updatedName(name), name),
      moments: /** @type {StateTensor[]} */ (optimizer.moments.get(name)).map((m, i) =>
        this.#output(results, N.updatedName(N.momentName(name, i)), name),
      ),
    }));
    const scaler = this.#optimizerIo.shared.map((name) => ({ name, value: this.#output(results, N.updatedName(name), name) }));
    for (const { name, value } of scaler) this.#setParameter(name, value);
    for (const { name, value, moments } of updates) {
      this.#setParameter(name, value);
      const old = /** @type {StateTensor[]} */ (optimizer.moments.get(name));
      optimizer.moments.set(
        name,
        old.map((m, i) => ({ ...m, data: moments[i] })),
      );
    }
    optimizer.step += 1;
  }

  /**
   * The next train step starts from zero gradients (ONNX Runtime's `LazyResetGrad`): nothing is computed now.
   * @returns {Promise<void>}
   */
  async lazyResetGrad() {
    this.#alive('lazyResetGrad');
    if (this.#busy) throw new Error('lazyResetGrad: a step of this session is still running; await it first');
    this.#resetPending = true;
    this.#gradientStatus = 'reset';
  }

  /**
   * One eval step: the eval model (inference-mode Dropout and BatchNormalization) on the current parameters.
   * @param {Record<string, Tensor>} feeds the eval model's user inputs by name
   * @param {readonly string[] | Record<string, null> | RunOptions} [fetches] the outputs to return (default: all), or `options`
   * @param {RunOptions} [options]
   * @returns {Promise<Record<string, Tensor>>}
   */
  async runEvalStep(feeds, fetches, options) {
    this.#alive('runEvalStep');
    if (this.#eval === null || this.#evalIo === null) {
      throw new Error('runEvalStep: this session has no eval model; pass evalModel (eval_model.onnx) to TrainingSession.create');
    }
    const [wanted, runOptions] = this.#fetches('runEvalStep', fetches, options, this.#evalIo.outputs);
    this.#usable('runEvalStep', 'Cannot perform EvalStep with a nominal state. Please load the model parameters first.');
    const all = { ...checkFeeds(feeds, this.#evalIo.inputs, 'runEvalStep', 'eval model') };
    for (const name of this.#evalIo.parameters) all[name] = this.#tensorOf(name);
    return pick(await this.#run(this.#eval, all, runOptions, 'eval step'), wanted);
  }

  // -------------------------------------------------------- learning rate

  /** The learning rate the next optimizer step uses. */
  getLearningRate() {
    this.#alive('getLearningRate');
    return this.#learningRate;
  }

  /**
   * Use `learningRate` from the next optimizer step on. It also becomes the initial learning rate a checkpoint
   * with optimizer state stores, so that a resumed run continues at it (as onnxtrain's Python runtime).
   * @param {number} learningRate
   */
  setLearningRate(learningRate) {
    this.#alive('setLearningRate');
    if (typeof learningRate !== 'number' || !Number.isFinite(learningRate) || learningRate < 0) {
      throw new RangeError(`setLearningRate: the learning rate must be a finite number >= 0, not ${String(learningRate)}`);
    }
    this.#learningRate = Math.fround(learningRate);
    if (this.#state.optimizer !== null) this.#state.optimizer.initialLearningRate = this.#learningRate;
  }

  // ---------------------------------------------------- parameter buffers

  /**
   * The number of elements of the (trainable) parameters.
   * @param {boolean} [trainableOnly]
   * @returns {Promise<number>}
   */
  async getParametersSize(trainableOnly = true) {
    this.#alive('getParametersSize');
    return P.parametersSize(P.selected(this.#state, this.#io.parameters, trainableOnly));
  }

  /**
   * The trainable parameters (or, with `false`, every one) copied into one float32 tensor, in training-model order.
   * @param {boolean} [trainableOnly]
   * @returns {Promise<Tensor>}
   */
  async getContiguousParameters(trainableOnly = true) {
    this.#alive('getContiguousParameters');
    const data = P.toBuffer(P.selected(this.#state, this.#io.parameters, trainableOnly));
    return new this.#runtime.Tensor('float32', data, [data.length]);
  }

  /**
   * Copy parameter values from one buffer (float32 values in training-model order, or their bytes as a
   * Uint8Array, as ONNX Runtime takes them) into the state; the size must match, else nothing is written.
   * Loading every parameter (`trainableOnly = false`) gives a nominal checkpoint its values.
   * @param {Uint8Array | Float32Array | Tensor} buffer
   * @param {boolean} [trainableOnly]
   * @returns {Promise<void>}
   */
  async loadParametersBuffer(buffer, trainableOnly = true) {
    this.#alive('loadParametersBuffer');
    if (this.#busy) throw new Error('loadParametersBuffer: a step of this session is still running; await it first');
    const values = P.fromBuffer(P.selected(this.#state, this.#io.parameters, trainableOnly), buffer);
    for (const [name, data] of values) this.#setParameter(name, data);
    this.#allocate();
  }

  // ----------------------------------------------------------------- end

  /** Release the onnxruntime sessions; the session cannot be used afterwards (the checkpoint state can). */
  async release() {
    if (this.#released) return;
    this.#released = true;
    await Promise.all([this.#train, this.#eval, this.#optimizer].map((s) => s?.release()));
  }

  // ------------------------------------------------------------- private

  /** Allocate the gradients and a new optimizer state, once the parameters hold values. */
  #allocate() {
    if (this.#state.isNominal) return;
    for (const name of this.#io.trainable) {
      if (this.#gradients.has(name)) continue;
      const param = /** @type {StateTensor} */ (this.#state.trainable.get(name));
      const type = /** @type {import('../checkpoint/dtypes.js').ElementType} */ (byType(param.type));
      this.#gradients.set(name, new type.array(new ArrayBuffer(type.size * elementCount(param.dims))));
    }
    if (this.#optimizerIo !== null && this.#state.optimizer === null) {
      const { initialValues } = this.#optimizerIo;
      const moments = new Map(
        this.#io.trainable.map((name) => {
          const param = /** @type {StateTensor} */ (this.#state.trainable.get(name));
          const type = /** @type {import('../checkpoint/dtypes.js').ElementType} */ (byType(param.type));
          const count = elementCount(param.dims);
          return [name, initialValues.map((v) => ({ type: param.type, dims: param.dims, data: filled(type, count, v) }))];
        }),
      );
      this.#state.optimizer = { step: 0, initialLearningRate: this.#learningRate, moments };
    }
  }

  /**
   * A tensor over a parameter's current values (no copy).
   * @param {string} name
   */
  #tensorOf(name) {
    const t = /** @type {StateTensor} */ (this.#state.trainable.get(name) ?? this.#state.frozen.get(name));
    return new this.#runtime.Tensor(t.type, /** @type {any} */ (t.data), t.dims);
  }

  /**
   * @param {string} name
   * @param {TensorData} data
   */
  #setParameter(name, data) {
    const group = this.#state.trainable.has(name) ? this.#state.trainable : this.#state.frozen;
    const t = /** @type {StateTensor} */ (group.get(name));
    group.set(name, { ...t, data });
    if (this.#state.isNominal && [...this.#state.trainable.values(), ...this.#state.frozen.values()].every((p) => p.data !== null)) {
      this.#state.isNominal = false;
    }
  }

  /**
   * A run's output that replaces `param`'s values (or its gradient, its moment): checked against the parameter.
   * @param {Record<string, Tensor>} results
   * @param {string} output
   * @param {string} param
   * @returns {TensorData}
   */
  #output(results, output, param) {
    const t = /** @type {StateTensor} */ (this.#state.trainable.get(param) ?? this.#state.frozen.get(param));
    const value = results[output];
    if (value === undefined || value.type !== t.type || value.size !== elementCount(t.dims)) {
      const got = value === undefined ? 'nothing' : `${value.type}[${value.dims.join(', ')}]`;
      throw new Error(`the model's output '${output}' is ${got}, but '${param}' is ${t.type}[${t.dims.join(', ')}]: the artifacts do not belong together`);
    }
    return /** @type {TensorData} */ (value.data);
  }

  /**
   * Run one onnxruntime session; one run at a time, and errors say which step failed.
   * @param {InferenceSession} session
   * @param {Record<string, Tensor>} feeds
   * @param {RunOptions | undefined} options
   * @param {string} what
   */
  async #run(session, feeds, options, what) {
    if (this.#busy) throw new Error(`${what}: another step of this session is still running; await it before starting the next`);
    this.#busy = true;
    try {
      return await session.run(feeds, options ?? {});
    } catch (error) {
      const message = /** @type {Error} */ (error).message;
      const explained = labelError(message, feeds, what, this.#labelChecks.get(session));
      throw new Error(explained ?? `${what} failed in onnxruntime (the state is as before it): ${message}`);
    } finally {
      this.#busy = false;
    }
  }

  /**
   * Split ORT's overloads `(feeds, options)` and `(feeds, fetches, options)`, fetches being a list of output
   * names or an object keyed by them (as onnxruntime's `FetchesType`); check the names.
   * @param {string} call
   * @param {readonly string[] | Record<string, unknown> | RunOptions | undefined} fetches
   * @param {RunOptions | undefined} options
   * @param {readonly string[]} outputs
   * @returns {[readonly string[], RunOptions | undefined]}
   */
  #fetches(call, fetches, options, outputs) {
    this.#alive(call);
    /** @type {readonly string[]} */
    let names;
    if (Array.isArray(fetches)) names = fetches;
    else if (fetches !== null && typeof fetches === 'object' && Object.keys(fetches).some((k) => outputs.includes(k))) {
      const given = /** @type {Record<string, unknown>} */ (fetches);
      if (Object.values(given).some((v) => v !== null && v !== undefined)) {
        throw new TypeError(`${call}: preallocated outputs are not supported; give the output names (or null values)`);
      }
      names = Object.keys(given);
    } else return [outputs, /** @type {RunOptions | undefined} */ (fetches) ?? options];
    const unknown = names.filter((name) => !outputs.includes(name));
    if (unknown.length) throw new RangeError(`${call}: no output(s) ${JSON.stringify(unknown)}; the outputs are ${JSON.stringify(outputs)}`);
    return [names, options];
  }

  /** @param {string} call */
  #alive(call) {
    if (this.#released) throw new Error(`${call}: this TrainingSession was released; create a new one`);
  }

  /**
   * @param {string} call
   * @param {string} nominalMessage ONNX Runtime's message for a nominal state
   */
  #usable(call, nominalMessage) {
    this.#alive(call);
    if (this.#state.isNominal) {
      const empty = [...this.#state.trainable, ...this.#state.frozen].filter(([, t]) => t.data === null).map(([n]) => n);
      throw new Error(`${nominalMessage} (${call}: ${JSON.stringify(empty)} hold no values; loadParametersBuffer(buffer, false) loads them)`);
    }
  }
}

/**
 * A typed array of `count` elements equal to `value`.
 * @param {import('../checkpoint/dtypes.js').ElementType} type
 * @param {number} count
 * @param {number} value
 * @returns {TensorData}
 */
function filled(type, count, value) {
  if (value !== 0 && type.type === 'float16') {
    throw new Error(`the optimizer's moments start at ${value}, which onnxtrain-web cannot write as float16; start from a checkpoint with optimizer state`);
  }
  const data = new type.array(new ArrayBuffer(type.size * count));
  if (value !== 0) /** @type {any} */ (data).fill(type.type.endsWith('64') && type.type.includes('int') ? BigInt(value) : value);
  return data;
}

/**
 * The named outputs of a run.
 * @param {Record<string, Tensor>} results
 * @param {readonly string[]} names
 * @returns {Record<string, Tensor>}
 */
function pick(results, names) {
  return Object.fromEntries(names.map((name) => [name, results[name]]));
}
