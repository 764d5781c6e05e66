#include "bricks/llm/think.h"

#include <string.h>

// States: the answer's start (held: whitespace and what may begin <think>), in the reasoning (held:
// whitespace that may trail it and what may begin </think>), after </think> (its whitespace dropped), content.
enum { START, REASON, AFTER, CONTENT };

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static bool space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// A run of output gathered within one feed (one callback a run, not a byte).
typedef struct run {
    nm_think_fn out;
    void *user;
    bool reasoning;
    char b[NM_THINK_RUN_MAX];
    size_t n;
} run;

static void flush(run *r) {
    if (r->n) r->out(r->user, r->reasoning, r->b, r->n);
    r->n = 0;
}

static void put(run *r, bool reasoning, const char *p, size_t n) {
    if (r->reasoning != reasoning) flush(r), r->reasoning = reasoning;
    for (size_t i = 0; i < n; i++) {
        if (r->n == sizeof r->b) flush(r);
        r->b[r->n++] = p[i];
    }
}

// The longest k < strlen(tag) with h[n - k .. n) a beginning of tag.
static size_t partial(const char *h, size_t n, const char *tag) {
    const size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(h + n - k, tag, k)) return k;
    return 0;
}

void nm_think_init(nm_think *t) {
    memset(t, 0, sizeof *t);
    t->state = START;
}

static void byte(nm_think *t, run *r, char c) {
    if (t->state == CONTENT) {
        put(r, false, &c, 1);
    } else if (t->state == AFTER) {
        if (!space(c)) t->state = CONTENT, put(r, false, &c, 1);
    } else if (t->state == START) {
        t->held[t->n_held++] = c;
        size_t i = 0;
        while (i < t->n_held && space(t->held[i])) i++;
        const size_t rest = t->n_held - i;
        if (rest == strlen(OPEN) && !memcmp(t->held + i, OPEN, rest)) {
            t->n_held = 0, t->state = REASON;
        } else if (memcmp(t->held + i, OPEN, rest) || t->n_held == sizeof t->held) { // (not its beginning)
            put(r, false, t->held, t->n_held);
            t->n_held = 0, t->state = CONTENT;
        }
    } else { // REASON: held is whitespace (which may trail the reasoning), then what may begin </think>
        if (!t->begun && !t->n_held && space(c)) return; // (its leading whitespace)
        t->held[t->n_held++] = c;
        const size_t cl = strlen(CLOSE);
        if (t->n_held >= cl && !memcmp(t->held + t->n_held - cl, CLOSE, cl)) { // (the whitespace before it goes too)
            t->n_held = 0, t->state = AFTER;
            return;
        }
        const size_t k = partial(t->held, t->n_held, CLOSE);
        size_t ws = t->n_held - k; // the body's trailing whitespace starts at ws
        while (ws > 0 && space(t->held[ws - 1])) ws--;
        if (t->n_held == sizeof t->held && ws == 0) ws = t->n_held - k; // (a long run of whitespace: it goes)
        if (ws > 0) {
            put(r, true, t->held, ws);
            t->begun = true;
            memmove(t->held, t->held + ws, t->n_held - ws);
            t->n_held -= ws;
        }
    }
}

void nm_think_feed(nm_think *t, const char *p, size_t n, bool end, nm_think_fn out, void *user) {
    run r = {.out = out, .user = user};
    for (size_t i = 0; i < n; i++) byte(t, &r, p[i]);
    if (end && t->n_held) {
        if (t->state == START) {
            put(&r, false, t->held, t->n_held);
        } else if (t->state == REASON) { // never closed: what may have begun </think> is reasoning, whitespace not
            size_t ws = t->n_held;
            while (ws > 0 && space(t->held[ws - 1])) ws--;
            if (ws > 0) put(&r, true, t->held, ws);
        }
        t->n_held = 0;
    }
    flush(&r);
}
