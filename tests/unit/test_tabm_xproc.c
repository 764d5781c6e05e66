// TABM across processes: the parent creates a ring, passes its fd to a
// forked child over SCM_RIGHTS; the child attaches it and writes f32
// embeddings; the parent reads them in place and feeds them to the LLM
// (nm_decode_embd straight from the slot's payload) when the SmolLM2
// tokenizer is there to build a small random-weight model from. The decode
// from the slot must equal one from private memory: the child must not
// touch a slot the parent holds (nothing here copies, so no ledger is kept).
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nmtest.h"
#include "small_model.h"

#define N_EMBD 64
#define N_TOK 4
#define N_MSG 6

static float val(int msg, int t, int e) { return 0.01f * (float)((msg * 131 + t * 17 + e * 7) % 97) - 0.48f; }

static int child(int sock) {
    int fd = -1, efd = -1;
    if (nm_fd_recv(sock, &fd, NULL, 0, NULL) != NM_OK) return 2;
    if (nm_fd_recv(sock, &efd, NULL, 0, NULL) != NM_OK) return 2;
    nm_tabm *r = NULL;
    char err[256];
    if (nm_tabm_attach(fd, efd, &r, err, sizeof err) != NM_OK) {
        fprintf(stderr, "  child: %s\n", err);
        return 3;
    }
    close(fd);
    close(efd);
    for (int m = 0; m < N_MSG; m++) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_write(r, 42, 5ll * 1000000000, &s) != NM_OK) return 4;
        float *x = s.data; // (N_TOK, N_EMBD), written in place
        for (int t = 0; t < N_TOK; t++)
            for (int e = 0; e < N_EMBD; e++) x[t * N_EMBD + e] = val(m, t, e);
        s.meta->kind = NM_TABM_EMBD_F32;
        s.meta->ndim = 2;
        s.meta->shape[0] = N_TOK;
        s.meta->shape[1] = N_EMBD;
        s.meta->size = sizeof(float) * N_TOK * N_EMBD;
        s.meta->user = (uint64_t)m;
        if (nm_tabm_publish(r, &s) != NM_OK) return 5;
    }
    nm_tabm_free(r);
    return 0;
}

NM_TEST(tabm_xproc_embeddings_in_place) {
    int sv[2];
    NM_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(child(sv[1]));
    }
    close(sv[1]);
    nm_tabm *r = NULL;
    char err[256];
    NM_CHECK(nm_tabm_create(NULL, 2, sizeof(float) * N_TOK * N_EMBD, &r, err, sizeof err) == NM_OK);
    if (!r) return;
    int efd = nm_tabm_poll_fd(r);
    NM_CHECK(nm_fd_send(sv[0], nm_tabm_fd(r), NULL, 0) == NM_OK);
    NM_CHECK(nm_fd_send(sv[0], efd, NULL, 0) == NM_OK);

    char mpath[256];
    snprintf(mpath, sizeof mpath, "/tmp/nm-tabm-xproc-%d.gguf", (int)getpid());
    nm_model *m = NULL;
    const int mr = nmtest_small_model(mpath, N_EMBD, 3, &m);
    NM_CHECK(mr >= 0);
    nm_ctx *ctx = NULL, *ref = NULL;
    if (m) {
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 64;
        NM_CHECK(nm_ctx_create(m, &cp, &ctx, NULL, 0) == NM_OK && nm_ctx_create(m, &cp, &ref, NULL, 0) == NM_OK);
        NM_CHECK(nm_model_n_embd(m) == N_EMBD);
    } else {
        fprintf(stderr, "  (SmolLM2 tokenizer absent: ring checked, no decode)\n");
    }
    int bad = 0, pos = 0, decoded = 0;
    for (int k = 0; k < N_MSG; k++) {
        // Wait the way a brick lane would beside other fds: poll the eventfd.
        struct pollfd p = {.fd = efd, .events = POLLIN};
        nm_tabm_slot s;
        nm_status st;
        while ((st = nm_tabm_acquire_read(r, 0, &s)) == NM_ERR_AGAIN) {
            if (poll(&p, 1, 5000) != 1) break;
            uint64_t v;
            if (read(efd, &v, sizeof v) < 0) break;
        }
        NM_CHECK(st == NM_OK);
        if (st != NM_OK) break;
        NM_CHECK(s.meta->producer == 42 && s.meta->user == (uint64_t)k && s.meta->kind == NM_TABM_EMBD_F32);
        NM_CHECK(s.meta->shape[0] == N_TOK && s.meta->shape[1] == N_EMBD);
        const float *x = s.data;
        for (int t = 0; t < N_TOK; t++)
            for (int e = 0; e < N_EMBD; e++) bad += x[t * N_EMBD + e] != val(k, t, e);
        if (ctx && ref) {
            // The LLM brick reads the child's slot in place ...
            NM_CHECK(nm_decode_embd(ctx, x, N_TOK, pos, false) == NM_OK);
            // ... and agrees with a decode of the same values from private memory.
            float own[N_TOK * N_EMBD];
            for (int t = 0; t < N_TOK; t++)
                for (int e = 0; e < N_EMBD; e++) own[t * N_EMBD + e] = val(k, t, e);
            NM_CHECK(nm_decode_embd(ref, own, N_TOK, pos, false) == NM_OK);
            const float *a = nm_get_logits(ctx, -1), *b = nm_get_logits(ref, -1);
            NM_CHECK(a && b && !memcmp(a, b, sizeof(float) * (size_t)nm_model_n_vocab(m)));
            pos += N_TOK;
            decoded++;
        }
        NM_CHECK(nm_tabm_release(r, &s) == NM_OK);
    }
    NM_CHECK(bad == 0);
    int status = 0;
    waitpid(pid, &status, 0);
    NM_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    nm_tabm_stats st = nm_tabm_get_stats(r);
    NM_CHECK(st.published == N_MSG && st.released == N_MSG && st.occupancy == 0);
    fprintf(stderr, "  %d slots decoded in place\n", decoded);
    NM_CHECK(!m || decoded == N_MSG);
    nm_ctx_free(ctx);
    nm_ctx_free(ref);
    nm_model_free(m);
    unlink(mpath);
    nm_tabm_free(r);
    close(sv[0]);
    if (mr == 0) NM_SKIP_MISSING("SmolLM2 (the tokenizer source) is not in the model cache: the decode half did not run");
}

NM_TEST_MAIN()
