#!/bin/sh
# public/tone.wav: 3 s of a 1 s chirp (300 -> 3000 Hz, repeating), 8 kHz mono s16 (48 KB).
# A chirp, not a pure tone: cross-correlation against it has one peak, not one per period.
set -e
cd "$(dirname "$0")"
ffmpeg -hide_banner -loglevel error -y -f lavfi \
  -i "aevalsrc=exprs='0.5*sin(2*PI*(300*mod(t\,1)+1350*mod(t\,1)*mod(t\,1)))':s=8000:d=3" \
  -c:a pcm_s16le -map_metadata -1 -fflags +bitexact public/tone.wav
