import {Composition} from 'remotion';
import {Hello} from './Hello';

// 90 frames at 320x180 unless the job's props say otherwise ({"frames": 15474, "width": 1280,
// "height": 720}): the same composition serves the tests and an episode-sized bench.
export const Root = () => (
  <Composition
    id="Hello"
    component={Hello}
    durationInFrames={90}
    fps={30}
    width={320}
    height={180}
    defaultProps={{title: 'farm'}}
    calculateMetadata={({props}) => ({
      durationInFrames: props.frames ?? 90,
      width: props.width ?? 320,
      height: props.height ?? 180,
    })}
  />
);
