// Prompts with images, shared by `run` and `serve`: the vision brick of
// --mmproj.
#include <stdio.h>
#include <string.h>

#include "cli.h"

bool cli_vision_load(const cli_opts *o, const char *mmproj, const char *device, nm_brick *llm, nm_ledger *ledger,
                     nm_brick **vision) {
    nm_brick_params vp = nm_brick_default_params(NM_BRICK_VISION);
    vp.model = mmproj;
    vp.feeds = llm;
    vp.device = device ? device : o->device;
    vp.n_threads = o->n_threads;
    vp.cores = o->mmproj_cores;
    vp.ledger = ledger;
    char err[512];
    const nm_status st = nm_brick_load(NULL, &vp, vision, err, sizeof err);
    if (st == NM_OK) return true;
    if (st == NM_ERR_FORMAT && strstr(err, "belongs to another model"))
        fprintf(stderr, "error: '%s' does not fit '%s': %s\n", mmproj, o->model, err);
    else
        fprintf(stderr, "error: cannot load mmproj '%s': %s: %s\n", mmproj, nm_status_str(st), err);
    return false;
}
