// The vision brick alone (its encoder and projector, no language model): one
// image file encoded, then the process's peak RSS. bench/power_cascade.sh
// compares the cascade's peak with each brick's own, and nanomind has no
// command that runs the encoder by itself. Public API only.
//   cc -O2 bench/vision_alone.c -Iinclude -Lbuild -lnanomind -o vision_alone
//   ./vision_alone MMPROJ.gguf IMAGE [THREADS]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "nanomind.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MMPROJ.gguf IMAGE [THREADS]\n", argv[0]);
        return 2;
    }
    char err[512];
    nm_brick_params p = nm_brick_default_params(NM_BRICK_VISION);
    p.model = argv[1];
    p.n_threads = argc > 3 ? atoi(argv[3]) : 0;
    nm_brick *b = NULL;
    nm_tabm *in = NULL, *out = NULL;
    if (nm_brick_load(NULL, &p, &b, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f || nm_tabm_create(NULL, 1, nm_brick_in_slot_bytes(b), &in, err, sizeof err) != NM_OK ||
        nm_tabm_create(NULL, 64, nm_brick_out_slot_bytes(b), &out, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", f ? err : argv[2]);
        return 1;
    }
    nm_tabm_slot s;
    nm_tabm_acquire_write(in, 0, -1, &s);
    size_t n = fread(s.data, 1, s.capacity, f);
    fclose(f);
    s.meta->kind = NM_TABM_IMAGE;
    s.meta->ndim = 1;
    s.meta->shape[0] = (int64_t)n;
    s.meta->size = n;
    s.meta->request = 1;
    nm_tabm_publish(in, &s);
    int rc = 0;
    for (;;) { // the image's encoder runs, read as they come (the brick writes one slot each)
        if (nm_brick_get_stats(b).n_requests == 0 && nm_brick_step(b, in, out) != NM_OK) {
            fprintf(stderr, "error: %s\n", nm_brick_last_error(b));
            rc = 1;
            break;
        }
        if (nm_tabm_acquire_read(out, 0, &s) != NM_OK) break;
        const uint64_t user = s.meta->user;
        nm_tabm_release(out, &s);
        if (user & NM_BRICK_ERROR) rc = 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("vision alone: %llu encoder runs, peak RSS %.1f MiB\n",
           (unsigned long long)nm_brick_get_stats(b).n_encoded, ru.ru_maxrss / 1024.0);
    nm_tabm_free(in);
    nm_tabm_free(out);
    nm_brick_free(b);
    return rc;
}
