// TABM across processes: the parent creates a ring, passes its fd to a
// forked child over SCM_RIGHTS; the child attaches it and writes f32
// embeddings; the parent reads them in place and feeds them to the LLM
// (nm_decode_embd straight from the slot's payload) when the SmolLM2
// tokenizer is there to build a small random-weight model from. The ledger
// shows 0 bytes copied between the bricks.
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nmtest.h"
#include "genmodel.h"
#include "nanomind.h"

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

// A small random model with n_embd = N_EMBD, or NULL when the tokenizer
// source (SmolLM2) is absent.
static nm_model *small_model(char *path, size_t n) {
    char tok[1024];
    const char *dir = getenv("NM_MODEL_DIR"), *home = getenv("HOME");
    if (dir) snprintf(tok, sizeof tok, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else snprintf(tok, sizeof tok, "%s/.cache/nanomind/models/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    if (access(tok, R_OK) != 0) return NULL;
    snprintf(path, n, "/tmp/nm-tabm-xproc-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults();
    o.arch = "llama";
    o.tok_from = tok;
    o.out = path;
    o.layers = 2;
    o.embd = N_EMBD;
    o.heads = 4;
    o.kv_heads = 2;
    o.ff = 128;
    o.seed = 3;
    if (nm_genmodel_write(&o) != 0) return NULL;
    nm_model *m = NULL;
    if (nm_model_load(path, NULL, &m, NULL, 0) != NM_OK) return NULL;
    return m;
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

    nm_ledger *led = nm_ledger_create();
    int ep_child = nm_ledger_endpoint(led, "vision(child)"), ep_llm = nm_ledger_endpoint(led, "llm");
    (void)ep_child, (void)ep_llm;
    char mpath[256] = "";
    nm_model *m = small_model(mpath, sizeof mpath);
    nm_ctx *ctx = NULL, *ref = NULL;
    if (m) {
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 64;
        NM_CHECK(nm_ctx_create(m, &cp, &ctx, NULL, 0) == NM_OK && nm_ctx_create(m, &cp, &ref, NULL, 0) == NM_OK);
        NM_CHECK(nm_model_n_embd(m) == N_EMBD);
    } else {
        fprintf(stderr, "  (SmolLM2 tokenizer absent: ring and ledger checked, no decode)\n");
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
    NM_CHECK(nm_ledger_total(led) == 0);
    char line[256];
    nm_ledger_format(led, line, sizeof line);
    fprintf(stderr, "  %d slots decoded in place; %s", decoded, line);
    NM_CHECK(strstr(line, "ledger: 0 bytes copied between bricks") != NULL);
    nm_ctx_free(ctx);
    nm_ctx_free(ref);
    nm_model_free(m);
    if (mpath[0]) unlink(mpath);
    nm_ledger_free(led);
    nm_tabm_free(r);
    close(sv[0]);
}

NM_TEST_MAIN()
