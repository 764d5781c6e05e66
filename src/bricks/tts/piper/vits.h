// Piper's VITS, run on our kernels: a voice converted by tools/convert_piper.py
// (a GGUF of arch "piper": the weights by PyTorch module name, the
// hyperparameters and the voice's config as piper.* keys; docs/piper.md),
// phoneme ids in, float samples out (tanh's range, at the voice's rate).
//
// The inference is VITS's `infer` as Piper exports it: the text encoder
// (phoneme embedding times sqrt(hidden); layers of multi-head self-attention
// with relative positions within a window, shared by the heads; post-norm;
// an FFN of two "same"-padded convolutions around a ReLU), the stochastic
// duration predictor run in reverse (its noise times noise_w through a flip,
// three spline coupling flows and the elementwise affine), durations
// exp(logw) * length_scale rounded up, the prior's mean and log-scale spread
// over the frames, z = m + noise * exp(logs) * noise_scale, the mean-only
// coupling flow in reverse (WaveNet layers), and HiFi-GAN. Activations are
// time-major (x[t * C + c]).
//
// Threading: a voice is read-only once loaded: any number of syntheses may
// run on it at once, each with its own nm_vits_ctx.
#ifndef NM_TTS_PIPER_VITS_H
#define NM_TTS_PIPER_VITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "nanomind.h"

typedef struct nm_vits nm_vits;

typedef struct nm_vits_info {
    int32_t sample_rate;
    float noise_scale, length_scale, noise_w; // the voice's defaults (its config)
    int32_t n_symbols;
    int32_t hop;                              // samples a frame (the upsampling rates' product)
    int32_t reach;                            // frames the decoder reads beyond a sample's own, at most (direct form)
    char espeak_voice[64];
    char name[128];
} nm_vits_info;

// Loads path (mmapped; the weights the kernels read in another order are
// repacked once). A file that is not a Piper GGUF, a key missing or out of
// range, a weight missing or of another shape: NM_ERR_FORMAT, err naming it.
nm_status nm_vits_load(const char *path, nm_vits **out, char *err, size_t err_size);
// The same from a GGUF in memory (borrowed: it must outlive the voice; its bytes are not changed).
nm_status nm_vits_load_memory(const void *buf, size_t size, nm_vits **out, char *err, size_t err_size);
void nm_vits_free(nm_vits *v); // NULL is a no-op
const nm_vits_info *nm_vits_get_info(const nm_vits *v);
// What `seconds` of speech cost (the planner's estimate, from the shapes alone): *flops (a multiply-add 2),
// of them *dec_flops HiFi-GAN's (the part a device runs), *weight_bytes the voice's weights. The text
// encoder's share assumes Piper's ~2.3 frames a phoneme id (the default voice's, at length_scale 1).
void nm_vits_cost(const nm_vits *v, double seconds, double *flops, double *dec_flops, uint64_t *weight_bytes);
// The ids of a phoneme (a UTF-8 string, one code point as Piper's maps have them, or
// its pad "_", start "^", end "$"): how many (0: none in the voice's map), up to cap into ids.
int32_t nm_vits_phoneme_ids(const nm_vits *v, const char *phoneme, size_t len, int32_t *ids, int32_t cap);

// A synthesis's threads (a pool of n_threads: <= 0, every core), scratch and device, kept between
// syntheses (grown to the longest so far), made for one voice. HiFi-GAN (most of the work) runs as one op
// list (NM_OP_CONV1D, NM_OP_CONV_T1D, NM_OP_ACT) on the backend of `device` ("cpu" or NULL, "opencl",
// "opencl:N", "opencl:auto"), which lays its weights out its own way here (where it keeps a copy, the
// file's pages of the originals are given back); the rest runs on the host's threads. One synthesis at a
// time uses it. NM_ERR_UNSUPPORTED: no such device here (err says why).
typedef struct nm_vits_ctx nm_vits_ctx;
nm_status nm_vits_ctx_create(const nm_vits *v, const char *device, int n_threads, nm_vits_ctx **out, char *err,
                             size_t err_size);
void nm_vits_ctx_free(nm_vits_ctx *c); // NULL is a no-op
int nm_vits_ctx_threads(const nm_vits_ctx *c);
const char *nm_vits_ctx_device(const nm_vits_ctx *c); // its backend's name ("cpu", "opencl")
// The frames its decoder reads beyond a sample's own (nm_vits_info.reach, or more where its backend's sums
// depend on a row's place: the CPU's Winograd tiles), what a streamed sentence's parts overlap by.
int32_t nm_vits_ctx_reach(const nm_vits_ctx *c);

// Where a context's syntheses spent their time, summed since it was made (seconds of wall time): the text
// encoder (with the prior's projection), the duration predictor (with the frames' prior samples), the
// coupling flow, HiFi-GAN (its op list on the backend, waited for); n: the syntheses. What an emit callback
// takes is in none of them.
typedef struct nm_vits_phases {
    double encoder_s, durations_s, flow_s, decoder_s;
    int64_t n;
} nm_vits_phases;
void nm_vits_ctx_phases(const nm_vits_ctx *c, nm_vits_phases *out); // zeroes where c is NULL

// The standard normal draws of a synthesis's noises for seed (nm_vits_scales.seed), as it takes them: counts[0]
// of them, then counts[1], ..., one after the other into out (a synthesis takes 2 a phoneme id, then the
// prior's inter channels a frame). The draws do not depend on the pool (NULL: one thread) or the counts'
// split. NM_ERR_NOMEM only.
nm_status nm_vits_normals(uint64_t seed, const int64_t *counts, int n_counts, float *out, nm_pool *pool);

typedef struct nm_vits_scales {
    float noise_scale, length_scale, noise_w;
    uint64_t seed; // the noises' generator (the same seed, scales and ids: the same samples)
} nm_vits_scales;

// Samples of phoneme ids ids[0..n) into *pcm (malloc'd; free() it), *n_pcm of them, on ctx (made for v;
// NULL: a one-thread CPU context for the call, HiFi-GAN's weights laid out anew each time: repeated
// syntheses want a context). The samples do not depend on the threads; on another
// device they are the CPU's within rounding (docs/piper.md states the bound).
// NM_ERR_INVALID_ARG: no ids, an id out of the voice's range, a scale out of range
// (length_scale 0.05..20, noise_scale and noise_w 0..5); NM_ERR_RANGE: more than
// 4096 ids or an utterance longer than 10 minutes.
nm_status nm_vits_synth(const nm_vits *v, nm_vits_ctx *ctx, const int32_t *ids, int32_t n, const nm_vits_scales *s,
                        float **pcm, int64_t *n_pcm, char *err, size_t err_size);
// As nm_vits_synth, the samples handed to emit as they are made (borrowed for the call; last: the
// utterance's end; a status emit returns stops the synthesis and is returned). first_frames > 0:
// where the utterance has more than first_frames and twice the decoder's reach more frames
// (nm_vits_info.reach, further on a CPU whose backend runs Winograd's tiles: nm_vits_ctx_reach), the
// decoder makes the first first_frames frames' samples first, each part with the frames
// it reaches beyond its inner edge, so the samples are the whole's, bit for bit.
typedef nm_status (*nm_vits_emit_fn)(void *user, const float *pcm, int64_t n, bool last);
nm_status nm_vits_synth_stream(const nm_vits *v, nm_vits_ctx *ctx, const int32_t *ids, int32_t n, const nm_vits_scales *s,
                               int32_t first_frames, nm_vits_emit_fn emit, void *user, char *err, size_t err_size);

#endif
