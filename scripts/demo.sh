#!/usr/bin/env bash
# `make demo`: the assistant's loop on the default models, every brick in turn.
#   1. a spoken question: the TTS brick (espeak-ng) writes it to a WAV file;
#   2. speech to text: Whisper tiny.en transcribes it;
#   3. the language model (SmolLM2) answers the transcript in a chat turn;
#   4. text to speech: the answer is spoken into a second WAV file.
# Each step prints its --stats (timings, the copy ledger). Files go to $DEMO_DIR
# (default /tmp/nanomind-demo).
set -euo pipefail
B=${BUILD:-build}/nanomind
M=${MODELS:-$HOME/.cache/nanomind/models}
D=${DEMO_DIR:-/tmp/nanomind-demo}
mkdir -p "$D"
question="Why is the sky blue? Answer in two sentences."

echo "== 1. say: \"$question\" -> $D/question.wav"
"$B" say "$question" -o "$D/question.wav" --stats
echo
echo "== 2. transcribe $D/question.wav"
"$B" transcribe -m "$M/whisper-tiny.en.gguf" "$D/question.wav" -t 2 --stats > "$D/question.txt"
echo "heard: $(tr -s ' \n' ' ' < "$D/question.txt")"
echo
echo "== 3. run: SmolLM2 answers"
"$B" run -m "$M/SmolLM2-135M-Instruct.Q4_1.gguf" --chat --temp 0 -n 120 --stats -f "$D/question.txt" \
    | tee "$D/answer.txt"
echo
echo "== 4. say the answer -> $D/answer.wav"
"$B" say -f "$D/answer.txt" -o "$D/answer.wav" --stats
