// Prompts with images, shared by `run` and `serve`: the vision brick of
// --mmproj, and a prompt's parts (the text between media markers, the images
// at them) in the order and with the flags the LLM brick reads them in.
#include <stdio.h>
#include <string.h>

#include "cli.h"

nm_brick_params cli_vision_params(const cli_opts *o, const char *mmproj, const char *device, nm_brick *llm,
                                  nm_ledger *ledger) {
    nm_brick_params vp = nm_brick_default_params(NM_BRICK_VISION);
    vp.model = mmproj;
    vp.feeds = llm;
    vp.device = device ? device : o->device;
    vp.n_threads = o->n_threads;
    vp.cores = o->mmproj_cores;
    vp.ledger = ledger;
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

bool cli_vision_load(const cli_opts *o, const char *mmproj, const char *device, nm_brick *llm, nm_ledger *ledger,
                     nm_brick **vision) {
    const nm_brick_params vp = cli_vision_params(o, mmproj, device, llm, ledger);
    char err[512];
    const nm_status st = nm_brick_load(NULL, &vp, vision, err, sizeof err);
    if (st != NM_OK) cli_vision_error(o, mmproj, st, err);
    return st == NM_OK;
}

bool cli_prompt_send(const nm_model *m, const char *prompt, int n_images, bool bos, const cli_prompt_i *to,
                     void *ctx) {
    if (n_images == 0) return to->text(ctx, prompt, strlen(prompt), NM_LLM_IN_POS(0), bos);
    const size_t ml = strlen(MEDIA_MARKER);
    const char *p = prompt;
    bool first = true; // nothing sent yet: the next slot starts the prompt at position 0
    for (int k = 0; k <= n_images; k++) {
        const char *end = k < n_images ? strstr(p, MEDIA_MARKER) : p + strlen(p);
        const bool last = k == n_images;
        // nothing between two images or after the last, or an empty start without a BOS to send
        const bool skip = end == p && (k > 0 || nm_tokenize(m, "", 0, NULL, 0, bos, true) == 0);
        if (last && skip) break; // the prompt ends with an image: that image's last slot ended it
        if (!skip) {
            const uint64_t user = (first ? NM_LLM_IN_POS(0) : 0) | (last ? 0 : NM_BRICK_MORE);
            if (!to->text(ctx, p, (size_t)(end - p), user, bos && k == 0)) return false;
            first = false;
        }
        if (last) break;
        const bool more = end[ml] != '\0' || k + 1 < n_images; // text or images follow
        if (!to->image(ctx, k, (first ? NM_LLM_IN_POS(0) : 0) | (more ? NM_BRICK_MORE : 0))) return false;
        first = false;
        p = end + ml;
    }
    return true;
}
