// The vision brick of --mmproj, shared by `run`, `assistant` and `serve`: its
// parameters, and why it did not load.
#include <stdio.h>
#include <string.h>

#include "cli.h"

nm_brick_params cli_vision_params(const cli_opts *o, const char *mmproj, const char *device) {
    nm_brick_params vp = nm_brick_default_params(NM_BRICK_VISION);
    vp.model = mmproj;
    vp.device = device ? device : o->device;
    vp.n_threads = o->n_threads;
    vp.cores = o->mmproj_cores;
    vp.image_min_tokens = o->image_min_tokens;
    vp.image_max_tokens = o->image_max_tokens;
    return vp;
}

void cli_vision_error(const cli_opts *o, const char *mmproj, nm_status st, const char *err) {
    if (st == NM_ERR_FORMAT && strstr(err, "belongs to another model"))
        fprintf(stderr, "error: '%s' does not fit '%s': %s\n", mmproj, o->model, err);
    else
        cli_load_error(mmproj, st, err, CLI_WANT_MMPROJ);
}
