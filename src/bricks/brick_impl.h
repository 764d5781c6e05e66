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

// The one epilogue of a request a built-in brick does not finish (failed:
// flags NM_BRICK_ERROR; cancelled: NM_BRICK_CANCELLED; with NM_BRICK_MORE
// where the request goes on downstream): what is left of it on `in` read
// and dropped (user: the flags of its slot read last; 0: nothing left), then
// an empty slot of `kind` carrying `request` and `flags` on `out` ending it
// there (cancelled: the request first marked cancelled on `out`), the slots
// counted in *st. Its text and its request counters are the caller's. The
// first failure of the two; the end slot is written also when the input is
// gone.
nm_status nm_brick_end_request(nm_tabm *in, uint64_t user, nm_tabm *out, uint32_t producer, int64_t timeout_ns,
                               uint32_t kind, uint64_t request, uint64_t flags, nm_brick_stats *st);
// A slot of `request` with flags `user` read from `in`: is its request cancelled
// (flagged upstream, or marked on the ring)?
bool nm_req_cancelled(nm_tabm *in, uint64_t user, uint64_t request);

// A request's PARAMS slot (include/nanomind.h, "Parameters of one request"):
// the JSON object, or NULL with the reason in err (who: the brick's name).
// Free with nm_req_free. The field readers return 1 (read into *v), 0
// (absent or null: keep the brick's value) or -1 (wrong type or out of
// range: err names the field).
typedef struct cJSON cJSON;
cJSON *nm_req_parse(const nm_tabm_slot *s, const char *who, char *err, size_t err_size);
void nm_req_free(cJSON *o);
int nm_req_number(const cJSON *o, const char *key, double lo, double hi, double *v, char *err, size_t err_size);
int nm_req_int(const cJSON *o, const char *key, double lo, double hi, int64_t *v, char *err, size_t err_size);
int nm_req_bool(const cJSON *o, const char *key, bool *v, char *err, size_t err_size);
int nm_req_string(const cJSON *o, const char *key, size_t max_len, const char **v, char *err, size_t err_size);
// A string or an array of at most max_n strings into v[0..*n) (borrowed from o).
int nm_req_strings(const cJSON *o, const char *key, int32_t max_n, size_t max_len, const char **v, int32_t *n,
                   char *err, size_t err_size);

// The estimates' one step: a matmul of weight w over `rows` rows (2 FLOPs a
// weight and row, under w's type) whose weight is streamed `passes` times
// (added to weight_bytes_read). Returns the weight's bytes; nothing for an
// absent weight.
double nm_cost_matmul(nm_brick_cost *e, const nm_tensor *w, double rows, double passes);
// Reads and releases the rest of a request whose slot `user` flags say more follow.
nm_status nm_brick_drain_request(nm_tabm *in, uint64_t user, int64_t timeout_ns, uint64_t *n_slots);

#endif
