// The built-in bricks' implementations (nm_brick_i, include/nanomind.h) and
// the helpers they share with the handle (brick.c).
#ifndef NM_BRICK_IMPL_H
#define NM_BRICK_IMPL_H

#include "backend/backend.h"
#include "nanomind.h"

extern const nm_brick_i nm_brick_llm_i;    // bricks/llm/brick.c
extern const nm_brick_i nm_brick_vision_i; // bricks/vision/vision.c
extern const nm_brick_i nm_brick_stt_i;    // bricks/stt/brick_stt.c
extern const nm_brick_i nm_brick_tts_i;    // bricks/tts/brick_tts.c

// The state of b when `impl` runs it, else NULL: each kind's own calls
// (nm_brick_llm_model, nm_brick_stt_info, ...) live beside its implementation.
void *nm_brick_state_of(const nm_brick *b, const nm_brick_i *impl);

// Ends a request whose output is not written yet: an empty slot of `kind`
// with NM_BRICK_ERROR (and `extra` flags) carrying `request`. For the
// implementations' failure paths.
nm_status nm_brick_put_error(nm_tabm *out, uint32_t producer, int64_t timeout_ns, uint32_t kind, uint64_t request,
                             uint64_t extra);
// The estimates' one step: a matmul of weight w over `rows` rows (2 FLOPs a
// weight and row, under w's type) whose weight is streamed `passes` times
// (added to weight_bytes_read). Returns the weight's bytes; nothing for an
// absent weight.
double nm_cost_matmul(nm_brick_cost *e, const nm_tensor *w, double rows, double passes);
// Reads and releases the rest of a request whose slot `user` flags say more follow.
nm_status nm_brick_drain_request(nm_tabm *in, uint64_t user, int64_t timeout_ns, uint64_t *n_slots);

#endif
