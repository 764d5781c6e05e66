// Copy ledger: bytes and copies per (from, to), totals, the printed line,
// and counting from several threads at once.
#include <pthread.h>

#include "nmtest.h"
#include "nanomind.h"

NM_TEST(ledger_counts_per_pair) {
    nm_ledger *l = nm_ledger_create();
    NM_CHECK(l != NULL);
    int vis = nm_ledger_endpoint(l, "vision"), llm = nm_ledger_endpoint(l, "llm");
    int tts = nm_ledger_endpoint(l, "tts");
    NM_CHECK(vis == 0 && llm == 1 && tts == 2);
    NM_CHECK(nm_ledger_endpoint(l, "llm") == llm); // same name, same id
    NM_CHECK(nm_ledger_endpoint(l, "") == -1 && nm_ledger_endpoint(l, NULL) == -1);
    char a[100], b[100];
    for (int i = 0; i < 100; i++) a[i] = (char)i;
    nm_ledger_copy(l, vis, llm, b, a, 100);
    NM_CHECK(!memcmp(a, b, 100));
    nm_ledger_copy(l, vis, llm, b, a, 10);
    nm_ledger_copy(l, llm, tts, b, a, 7);
    NM_CHECK(nm_ledger_bytes(l, vis, llm) == 110 && nm_ledger_copies(l, vis, llm) == 2);
    NM_CHECK(nm_ledger_bytes(l, llm, vis) == 0);
    NM_CHECK(nm_ledger_bytes(l, -1, tts) == 7 && nm_ledger_bytes(l, llm, -1) == 7);
    NM_CHECK(nm_ledger_total(l) == 117 && nm_ledger_copies(l, -1, -1) == 3);
    char out[512];
    int32_t n = nm_ledger_format(l, out, sizeof out);
    NM_CHECK(n > 0 && (size_t)n == strlen(out));
    NM_CHECK(strstr(out, "ledger: 117 bytes copied between bricks (3 copies)") != NULL);
    NM_CHECK(strstr(out, "vision -> llm: 110 bytes (2 copies)") != NULL);
    NM_CHECK(strstr(out, "llm -> tts: 7 bytes") != NULL);
    char small[8];
    int32_t need = nm_ledger_format(l, small, sizeof small);
    NM_CHECK(need == -(n + 1));
    nm_ledger_reset(l);
    NM_CHECK(nm_ledger_total(l) == 0);
    n = nm_ledger_format(l, out, sizeof out);
    NM_CHECK(n > 0 && !strcmp(out, "ledger: 0 bytes copied between bricks (0 copies)\n"));
    nm_ledger_free(l);
}

NM_TEST(ledger_null_and_bad_ids) {
    char a[4] = "abc", b[4] = {0};
    nm_ledger_copy(NULL, 0, 1, b, a, 4); // a plain copy
    NM_CHECK(!strcmp(b, "abc"));
    nm_ledger *l = nm_ledger_create();
    nm_ledger_copy(l, -1, 99, b, a, 4); // bad ids: copied, not counted, no crash
    NM_CHECK(nm_ledger_total(l) == 0);
    NM_CHECK(nm_ledger_bytes(l, 99, 0) == 0);
    char name[16];
    for (int i = 0; i < NM_LEDGER_MAX_ENDPOINTS; i++) {
        snprintf(name, sizeof name, "e%d", i);
        NM_CHECK(nm_ledger_endpoint(l, name) == i);
    }
    NM_CHECK(nm_ledger_endpoint(l, "one-too-many") == -1);
    nm_ledger_free(l);
    nm_ledger_free(NULL);
    NM_CHECK(nm_ledger_total(NULL) == 0);
}

struct targ { nm_ledger *l; int from, to; };
static void *copier(void *p) {
    struct targ *t = p;
    char src[64] = {1}, dst[64];
    for (int i = 0; i < 100000; i++) nm_ledger_copy(t->l, t->from, t->to, dst, src, 1 + (size_t)(i & 63));
    return NULL;
}

NM_TEST(ledger_threads) {
    nm_ledger *l = nm_ledger_create();
    int a = nm_ledger_endpoint(l, "a"), b = nm_ledger_endpoint(l, "b");
    pthread_t th[4];
    struct targ args[4] = {{l, a, b}, {l, a, b}, {l, b, a}, {l, a, b}};
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, copier, &args[i]);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    uint64_t per = 0;
    for (int i = 0; i < 100000; i++) per += 1 + (uint64_t)(i & 63);
    NM_CHECK(nm_ledger_bytes(l, a, b) == 3 * per && nm_ledger_bytes(l, b, a) == per);
    NM_CHECK(nm_ledger_copies(l, -1, -1) == 400000);
    nm_ledger_free(l);
}

NM_TEST_MAIN()
