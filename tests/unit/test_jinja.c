// The Jinja2 subset interpreter (src/bricks/tokenizer/jinja.c).
//
// - jinja2_oracle: every case of tests/data/jinja/expected.json (written by
//   tools/jinja_expect.py with Jinja2 3.1, set up as transformers'
//   apply_chat_template): the chat templates of SmolLM2 and Gemma 3 (as the
//   models ship them), Llama 3 and one after Qwen2.5, over conversations with
//   and without a system turn, multi-turn, unicode, empty contents, content
//   parts, add_generation_prompt on and off, byte for byte; and a small
//   template for each part of the subset. Where Jinja2 refuses, we must too.
// - the copies in tests/data/jinja are the models' own templates (read from
//   the GGUF when it is in the cache);
// - the built-in formatters (chat.c) agree with the Jinja rendering of their
//   family on every string-content conversation;
// - errors: each kind gives its status and a message naming the construct and
//   its line and column; a runaway loop, deep nesting and a large output stop
//   at their limits, quickly.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/tokenizer/chat.h"
#include "bricks/tokenizer/jinja.h"
#include "gguf/gguf.h"
#include "nmtest.h"

#define DATA "tests/data/jinja/"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)k + 1);
    if (b && fread(b, 1, (size_t)k, f) != (size_t)k) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[k] = 0, *n = (size_t)k;
    return b;
}

static cJSON *load_cases(void) {
    size_t n;
    char *t = slurp(DATA "expected.json", &n);
    if (!t) return NULL;
    cJSON *j = cJSON_Parse(t);
    free(t);
    return j;
}

// The template source of a case: a file of tests/data/jinja or inline (malloc'd).
static char *case_source(const cJSON *c, size_t *n) {
    const cJSON *file = cJSON_GetObjectItem(c, "template"), *src = cJSON_GetObjectItem(c, "source");
    if (cJSON_IsString(file)) {
        char path[256];
        snprintf(path, sizeof path, DATA "%s", file->valuestring);
        return slurp(path, n);
    }
    if (!cJSON_IsString(src)) return NULL;
    *n = strlen(src->valuestring);
    return strdup(src->valuestring);
}

static nm_status render(const char *src, size_t n, const cJSON *ctx, char **out, size_t *on, char *err, size_t es) {
    return nm_jinja_render(src, n, ctx, NULL, out, on, err, es);
}

NM_TEST(jinja2_oracle) {
    cJSON *all = load_cases();
    NM_CHECK(all != NULL);
    if (!all) return;
    int n_cases = 0, n_out = 0, n_err = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(all, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        size_t n = 0;
        char *src = case_source(c, &n);
        NM_CHECK(src != NULL);
        if (!src) continue;
        const cJSON *want = cJSON_GetObjectItem(c, "output");
        char *out = NULL, err[512];
        size_t on = 0;
        nm_status st = render(src, n, cJSON_GetObjectItem(c, "context"), &out, &on, err, sizeof err);
        n_cases++;
        if (cJSON_IsString(want)) {
            n_out++;
            bool same = st == NM_OK && on == strlen(want->valuestring) && !memcmp(out, want->valuestring, on);
            if (!same) {
                fprintf(stderr, "  %s: status %d (%s)\n    got:  [%s]\n    want: [%s]\n", name, st, err,
                        out ? out : "", want->valuestring);
                NM_CHECK(same);
            }
        } else {
            n_err++;
            if (st == NM_OK) {
                fprintf(stderr, "  %s: Jinja2 refused (%s), we rendered [%s]\n", name,
                        cJSON_GetObjectItem(c, "error")->valuestring, out);
                NM_CHECK(st != NM_OK);
            }
            NM_CHECK(err[0] != 0);
        }
        free(out);
        free(src);
    }
    fprintf(stderr, "  %d cases: %d renderings, %d refusals\n", n_cases, n_out, n_err);
    NM_CHECK(n_out >= 60 && n_err >= 10);
    cJSON_Delete(all);
}

// The copies in tests/data/jinja are the templates the models carry.
static void same_as_model(int *nmtest_failed, const char *model, const char *copy) {
    char path[512], err[256];
    if (!nmtest_model_path(model, path, sizeof path)) {
        fprintf(stderr, "  skip: %s is not in the model cache\n", model);
        return;
    }
    nm_gguf *g = NULL;
    NM_CHECK(nm_gguf_open(path, &g, err, sizeof err) == NM_OK);
    if (!g) return;
    nm_str t;
    NM_CHECK(nm_gguf_get_str(g, "tokenizer.chat_template", &t));
    size_t n = 0;
    char *c = slurp(copy, &n);
    NM_CHECK(c && (size_t)t.len == n && !memcmp(t.ptr, c, n));
    free(c);
    nm_gguf_close(g);
}

NM_TEST(templates_are_the_models) {
    same_as_model(nmtest_failed, "SmolLM2-135M-Instruct.Q4_1.gguf", DATA "smollm2.jinja");
    // gemma-3-270m (the base model) carries no template: gemma3.jinja is
    // google/gemma-3-4b-it's tokenizer_config.json chat_template.
}

// The built-in formatter of each family agrees with its Jinja template on
// every conversation of string contents that the template accepts.
NM_TEST(builtin_formatters_agree) {
    cJSON *all = load_cases();
    NM_CHECK(all != NULL);
    if (!all) return;
    int compared = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(all, "cases")) {
        const cJSON *file = cJSON_GetObjectItem(c, "template"), *want = cJSON_GetObjectItem(c, "output");
        if (!cJSON_IsString(file) || !cJSON_IsString(want)) continue;
        nm_chat_tmpl t = !strcmp(file->valuestring, "smollm2.jinja")  ? NM_CHAT_CHATML
                         : !strcmp(file->valuestring, "gemma3.jinja") ? NM_CHAT_GEMMA
                         : !strcmp(file->valuestring, "llama3.jinja") ? NM_CHAT_LLAMA3
                                                                      : NM_CHAT_UNKNOWN;
        if (t == NM_CHAT_UNKNOWN) continue;
        const cJSON *ctx = cJSON_GetObjectItem(c, "context"), *msgs = cJSON_GetObjectItem(ctx, "messages"), *m;
        nm_chat_msg mv[16];
        size_t n = 0;
        bool strings = true;
        cJSON_ArrayForEach(m, msgs) {
            const cJSON *content = cJSON_GetObjectItem(m, "content");
            if (!cJSON_IsString(content) || n == 16) strings = false;
            else mv[n++] = (nm_chat_msg){cJSON_GetObjectItem(m, "role")->valuestring, content->valuestring};
        }
        if (!strings) continue;
        size_t sn = 0;
        char path[256], sys[512];
        snprintf(path, sizeof path, DATA "%s", file->valuestring);
        char *src = slurp(path, &sn);
        const char *dflt = t == NM_CHAT_CHATML && src && nm_chat_default_system(src, sn, sys, sizeof sys) > 0 ? sys : NULL;
        const char *bos = cJSON_GetObjectItem(ctx, "bos_token")->valuestring;
        bool gen = cJSON_IsTrue(cJSON_GetObjectItem(ctx, "add_generation_prompt"));
        char buf[4096];
        int32_t k = nm_chat_apply(t, dflt, mv, n, gen, bos, buf, sizeof buf);
        bool same = k >= 0 && (size_t)k == strlen(want->valuestring) && !memcmp(buf, want->valuestring, (size_t)k);
        if (!same) {
            fprintf(stderr, "  %s:\n    built-in: [%s]\n    jinja:    [%s]\n", cJSON_GetObjectItem(c, "name")->valuestring,
                    k >= 0 ? buf : "(error)", want->valuestring);
            NM_CHECK(same);
        }
        compared++;
        free(src);
    }
    fprintf(stderr, "  %d conversations compared\n", compared);
    NM_CHECK(compared >= 30);
    cJSON_Delete(all);
}

// ---- errors ------------------------------------------------------------------------------

static nm_status run_src(const char *src, const nm_jinja_limits *lim, char *err, size_t es, char **out) {
    cJSON *ctx = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}");
    size_t on;
    char *o = NULL;
    nm_status st = nm_jinja_render(src, strlen(src), ctx, lim, &o, &on, err, es);
    cJSON_Delete(ctx);
    if (out) *out = o;
    else free(o);
    return st;
}

static void expect_error(int *nmtest_failed, const char *src, nm_status want, const char *msg) {
    char err[512] = "";
    char *out = NULL;
    nm_status st = run_src(src, NULL, err, sizeof err, &out);
    bool ok = st == want && strstr(err, msg) && out == NULL;
    if (!ok) fprintf(stderr, "  [%s]: status %d (want %d), err [%s] (want [%s])\n", src, st, want, err, msg);
    NM_CHECK(ok);
    free(out);
}

NM_TEST(errors_name_the_construct_and_place) {
    expect_error(nmtest_failed, "ab\n  {{ messages", NM_ERR_UNSUPPORTED, "line 2, column 3: unterminated '{{'");
    expect_error(nmtest_failed, "{% if true %}x", NM_ERR_UNSUPPORTED, "line 1, column 1: {% if %} is never closed");
    expect_error(nmtest_failed, "x\n{# open", NM_ERR_UNSUPPORTED, "line 2, column 1: unterminated comment");
    expect_error(nmtest_failed, "{{ 'x' | frobnicate }}", NM_ERR_UNSUPPORTED, "column 10: unknown filter 'frobnicate'");
    expect_error(nmtest_failed, "{{ 1 is frob }}", NM_ERR_UNSUPPORTED, "unknown test 'frob'");
    expect_error(nmtest_failed, "{{ frob(1) }}", NM_ERR_UNSUPPORTED, "unknown function 'frob'");
    expect_error(nmtest_failed, "{{ 'x'.zfill(3) }}", NM_ERR_UNSUPPORTED, "unknown method 'zfill'");
    expect_error(nmtest_failed, "\n{% macro f() %}{% endmacro %}", NM_ERR_UNSUPPORTED,
                 "line 2, column 4: the statement 'macro' is not supported");
    expect_error(nmtest_failed, "{% frob %}", NM_ERR_UNSUPPORTED, "unknown statement 'frob'");
    expect_error(nmtest_failed, "{% endfor %}", NM_ERR_UNSUPPORTED, "unexpected 'endfor'");
    expect_error(nmtest_failed, "{% break %}", NM_ERR_UNSUPPORTED, "'break' outside a loop");
    expect_error(nmtest_failed, "{{ 1 < 2 < 3 }}", NM_ERR_UNSUPPORTED, "chained comparisons");
    expect_error(nmtest_failed, "{{ 'abc }}", NM_ERR_UNSUPPORTED, "unterminated string");
    expect_error(nmtest_failed, "{{ a ; b }}", NM_ERR_UNSUPPORTED, "unexpected character ';'");
    expect_error(nmtest_failed, "{{ raise_exception('roles must alternate') }}", NM_ERR_TEMPLATE,
                 "the template raised an error: roles must alternate");
    expect_error(nmtest_failed, "{{ 'a' + 1 }}", NM_ERR_TEMPLATE, "unsupported operand type(s) for +: 'str' and 'int'");
    expect_error(nmtest_failed, "{{ tools.name }}", NM_ERR_TEMPLATE, "'tools' is undefined");
}

NM_TEST(limits_stop_runaways) {
    char err[512];
    clock_t t0 = clock();
    // 10^10 iterations: stops at the step limit
    NM_CHECK(run_src("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, err,
                     sizeof err, NULL) == NM_ERR_RANGE);
    NM_CHECK(strstr(err, "runaway loop") != NULL);
    NM_CHECK((double)(clock() - t0) / CLOCKS_PER_SEC < 10.0);
    // a range past the memory limit is refused before it is built
    NM_CHECK(run_src("{% for i in range(100000000000) %}{% endfor %}", NULL, err, sizeof err, NULL) == NM_ERR_RANGE);
    // nesting: parentheses, blocks, and values built in a loop
    char deep[4096];
    size_t k = 0;
    for (int i = 0; i < 500; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 500; i++) deep[k++] = ')';
    deep[k] = 0;
    char tmpl[4200];
    snprintf(tmpl, sizeof tmpl, "{{ %s }}", deep);
    NM_CHECK(run_src(tmpl, NULL, err, sizeof err, NULL) == NM_ERR_RANGE && strstr(err, "nests deeper"));
    k = 0;
    for (int i = 0; i < 200; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
    NM_CHECK(run_src(deep, NULL, err, sizeof err, NULL) == NM_ERR_RANGE && strstr(err, "nests deeper"));
    NM_CHECK(run_src("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x }}",
                     NULL, err, sizeof err, NULL) == NM_ERR_RANGE);
    // output and memory caps
    nm_jinja_limits lim = nm_jinja_default_limits();
    lim.max_out = 1000;
    NM_CHECK(run_src("{% for i in range(200) %}0123456789{% endfor %}", &lim, err, sizeof err, NULL) == NM_ERR_RANGE &&
             strstr(err, "output"));
    lim = nm_jinja_default_limits();
    lim.max_mem = 1 << 20;
    NM_CHECK(run_src("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     &lim, err, sizeof err, NULL) == NM_ERR_RANGE);
    // within the limits the same shapes render
    char *out = NULL;
    NM_CHECK(run_src("{% for i in range(300) %}{% for j in range(300) %}{% endfor %}{% endfor %}ok", NULL, err,
                     sizeof err, &out) == NM_OK && out && !strcmp(out, "ok"));
    free(out);
}

NM_TEST(bad_arguments) {
    char *out = (char *)1, err[64];
    NM_CHECK(nm_jinja_render("x", 1, NULL, NULL, NULL, NULL, err, sizeof err) == NM_ERR_INVALID_ARG);
    cJSON *arr = cJSON_CreateArray();
    NM_CHECK(nm_jinja_render("x", 1, arr, NULL, &out, NULL, err, sizeof err) == NM_ERR_INVALID_ARG && out == NULL);
    cJSON_Delete(arr);
    // no context, no error buffer
    NM_CHECK(nm_jinja_render("a{{ x }}b", 9, NULL, NULL, &out, NULL, NULL, 0) == NM_OK && !strcmp(out, "ab"));
    free(out);
    NM_CHECK(nm_jinja_render("{{", 2, NULL, NULL, &out, NULL, NULL, 0) == NM_ERR_UNSUPPORTED && out == NULL);
}

NM_TEST_MAIN()
