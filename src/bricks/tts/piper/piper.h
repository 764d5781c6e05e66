// The Piper engine of the TTS brick (nm_tts_engine_i "piper"; docs/piper.md):
// a voice converted by tools/convert_piper.py, run by vits.c; its phonemes made
// as Piper makes them (nm_piper_phonemize).
#ifndef NM_TTS_PIPER_PIPER_H
#define NM_TTS_PIPER_PIPER_H

#include "bricks/tts/piper/vits.h"
#include "bricks/tts/tts.h"

extern const nm_tts_engine_i nm_tts_piper_engine;

// Text's phoneme ids, sentence by sentence, as Piper makes them: espeak-ng's IPA
// clause by clause in the voice's espeak voice (language switches "(en)" dropped),
// each clause followed by its terminator (and a blank after , : ;), decomposed
// (NFD) into code points, each code point's ids from the voice's map (one not in
// the map is skipped and counted), a sentence framed as ^ _ (phoneme _)* $.
// Sentence i is ids[start[i] .. start[i + 1]) (start has n + 1 entries).
typedef struct nm_piper_sentences {
    int32_t *ids, *start;
    int32_t n, n_missing;
    int64_t n_ids;
} nm_piper_sentences;

nm_status nm_piper_phonemize(const nm_vits *v, const char *espeak_data_dir, const char *text, nm_piper_sentences *out,
                             char *err, size_t err_size);
void nm_piper_sentences_free(nm_piper_sentences *s);

// UTF-8 s (n bytes) in Unicode's canonical decomposition (NFD: decomposed, marks in canonical
// order) into cps (cap code points); returns how many (more than cap: cps holds the first cap).
// A byte that does not begin a valid sequence is U+FFFD.
int64_t nm_nfd(const char *s, size_t n, uint32_t *cps, int64_t cap);

// The voice file a name means: a path (with '/' or ending .gguf) as it is; else NAME's
// "piper-NAME.gguf" or "NAME.gguf" in the model folder ($NM_MODEL_DIR, else
// ~/.cache/nanomind/models). NULL name: the default voice, en_US-joe-medium. False: none exists.
bool nm_piper_voice_path(const char *name, char *path, size_t size);

#endif
