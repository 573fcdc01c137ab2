import {AbsoluteFill, Html5Audio, staticFile, useCurrentFrame} from 'remotion';

// The frame number changes every frame, so a lost or doubled frame shows; the tone is a chirp
// (public/tone.wav, made by make-tone.sh), so an audio offset has one correlation peak.
export const Hello = ({title}) => {
  const frame = useCurrentFrame();
  return (
    <AbsoluteFill
      style={{
        backgroundColor: `hsl(${(frame * 4) % 360}, 60%, 30%)`,
        color: 'white',
        fontFamily: 'monospace',
        justifyContent: 'center',
        alignItems: 'center',
      }}
    >
      <div style={{fontSize: 72}}>{frame}</div>
      <div style={{fontSize: 18}}>{title}</div>
      <Html5Audio src={staticFile('tone.wav')} />
    </AbsoluteFill>
  );
};
