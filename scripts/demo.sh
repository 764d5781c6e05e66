#!/usr/bin/env bash
# `make demo`: the assistant's loop on the default models, in one process.
#   1. a spoken question: the Piper voice (`nanomind say --tts piper`, VITS on
#      our kernels, docs/piper.md) writes it to a WAV file;
#   2. `nanomind assistant` hears it (Whisper tiny.en), answers it (SmolLM2, a
#      chat turn) and speaks the answer (the Piper voice; espeak-ng stays the
#      fallback: --tts espeak-ng) into a second WAV file, each
#      model on its own lane: the first sentence is spoken while the rest of the
#      answer is decoded. --stats prints, per question, the seconds from its end
#      to its transcript, first token, first audio sample and last sample, and
#      the copy ledger.
#   3. an image question: a held-out synthetic scene (tools/train_vlm/scenes.py)
#      asked about through the trained test VLM (tests/data/vlm, docs/vlm.md) on
#      SmolLM2: `nanomind run --mmproj --image --chat`.
# Files go to $DEMO_DIR (default /tmp/nanomind-demo).
set -euo pipefail
B=${BUILD:-build}/nanomind
M=${MODELS:-$HOME/.cache/nanomind/models}
D=${DEMO_DIR:-/tmp/nanomind-demo}
mkdir -p "$D"
question="Why is the sky blue? Answer in two sentences."

echo "== 1. say (Piper): \"$question\" -> $D/question.wav"
"$B" say --tts piper --voice "$M/piper-en_US-joe-medium.gguf" "$question" -o "$D/question.wav" --stats
echo
echo "== 2. assistant: hear $D/question.wav, answer, speak -> $D/answer-001.wav"
"$B" assistant -m "$M/SmolLM2-135M-Instruct.Q4_1.gguf" --stt "$M/whisper-tiny.en.gguf" \
    --audio "$D/question.wav" --out "$D" --tts piper --voice "$M/piper-en_US-joe-medium.gguf" -n 120 --temp 0 --stats
echo
echo "the answer, spoken: $D/answer-001.wav"
echo
scene=$(python3 "$(dirname "$0")/../tools/train_vlm/scenes.py" --one "$D/scene.ppm" --seed 4242 --index 1)
echo "== 3. an image question about $D/scene.ppm ($scene)"
for q in "What colour is the shape?" "What shape is it?" "Where is the shape?"; do
    printf '%s  ' "$q"
    "$B" run -m "$M/SmolLM2-135M-Instruct.Q4_1.gguf" --mmproj "$(dirname "$0")/../tests/data/vlm/vlm-mmproj-q8_0.gguf" \
        --image "$D/scene.ppm" --chat -p "$q" --temp 0 -n 12 2>/dev/null
done
