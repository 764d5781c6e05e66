// The vision brick: an mmproj encoder (clip.h) with its projector's image
// preprocessing (image.h) and prompt layout, feeding the LLM brick's input
// ring (nanomind.h, "LLM brick on TABM rings") by reference.
#ifndef NM_VISION_H
#define NM_VISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bricks/vision/clip.h"
#include "nanomind.h"

typedef struct nm_vision nm_vision;

// Loads the mmproj (see nm_clip_load) onto device (NULL: the CPU). n_threads <= 0: all cores.
nm_status nm_vision_load(const char *mmproj, const char *device, int32_t n_threads, nm_vision **out, char *err, size_t err_size);
void nm_vision_free(nm_vision *v);
const nm_clip_info *nm_vision_info(const nm_vision *v);
nm_clip *nm_vision_clip(nm_vision *v);
const char *nm_vision_last_error(const nm_vision *v); // "" if none

// NM_ERR_FORMAT with a message if the projector's output width is not the
// model's embedding width (an mmproj made for another LLM).
nm_status nm_vision_check_model(const nm_vision *v, const nm_model *m, char *err, size_t err_size);

// Bytes of one encoder output (the payload an input ring's slots must hold).
size_t nm_vision_slot_bytes(const nm_vision *v);

// Decodes and preprocesses the image file, then writes its prompt segment
// into `ring` as the LLM brick reads it: marker text as NM_TABM_TOKENS slots
// (SmolVLM's tile markers for idefics3; none for mlp) and each encoder input
// as an NM_TABM_EMBD_F32 slot that nm_clip_encode fills in place. Every slot
// carries NM_LLM_IN_MORE except the last, which carries it only if
// more_follows; first_flags (e.g. NM_LLM_IN_POS(0) when the image starts the
// prompt) is OR'd into the first slot's meta->user. *n_pos (may be NULL):
// context positions the segment takes.
// Image errors (corrupt, truncated, unsupported) are found before any slot is
// written. If writing fails half way, an empty slot ends the prompt so the
// LLM brick drops it rather than waiting.
nm_status nm_vision_put_image(nm_vision *v, const nm_model *m, const char *image_path, nm_tabm *ring,
                              uint32_t producer, int64_t timeout_ns, uint64_t first_flags, bool more_follows,
                              int32_t *n_pos);

typedef struct nm_vision_stats {
    int64_t n_images;   // images put into rings
    int64_t n_encoded;  // encoder runs (tiles and global images)
    double t_decode;    // seconds reading, decoding and preprocessing images
    double t_encode;    // seconds in the encoder
} nm_vision_stats;
nm_vision_stats nm_vision_get_stats(const nm_vision *v);

#endif
