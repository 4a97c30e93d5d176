// Compiled by `npm run typecheck` only (never run): the published types describe how the API is used.
import { CheckpointState, TrainingSession, ort } from 'onnxtrain-web/node';
import { TrainingSession as Base } from 'onnxtrain-web';

export async function example(bytes: Uint8Array): Promise<number> {
  const state: CheckpointState = CheckpointState.fromBuffer(bytes);
  const session: TrainingSession = await TrainingSession.create({ checkpointState: state, trainModel: 'training_model.onnx' });
  const other: Base = await Base.createWith(ort, { checkpointState: bytes, trainModel: bytes }, { executionProviders: ['cpu'] });
  const out = await session.runTrainStep({ x: new ort.Tensor('float32', new Float32Array(4), [1, 4]) });
  await session.runOptimizerStep();
  await session.lazyResetGrad();
  const parameters: ort.Tensor = await session.getContiguousParameters(true);
  await other.loadParametersBuffer(parameters, true);
  const saved: Uint8Array = session.checkpointState.toBuffer({ includeOptimizerState: true });
  void saved;
  return Number(out[session.trainingOutputNames[0]].data[0]) + (await session.getParametersSize());
}
