// Jinja2 subset interpreter (docs/jinja.md lists the subset).
//
// Three passes over one arena: the lexer cuts the template into text and
// tag tokens, applying whitespace control as Jinja2's lexer does with
// trim_blocks and lstrip_blocks; a recursive-descent parser builds a syntax
// tree with Jinja2's precedence (jinja2/parser.py); the evaluator walks it.
// Every allocation comes from the arena (capped), except the output buffer
// (capped); an error anywhere longjmps back to nm_jinja_render, which frees
// both, so no path leaks. Recursion is bounded by max_depth (the parser's
// nesting and the depth of values), loops by max_steps.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/tokenizer/jinja.h"

nm_jinja_limits nm_jinja_default_limits(void) {
    return (nm_jinja_limits){.max_src = 1u << 20, .max_mem = 64u << 20, .max_out = 16u << 20,
                             .max_steps = 5000000, .max_depth = 64};
}

// ---- values ------------------------------------------------------------------------------

typedef struct js {
    const char *p;
    size_t n;
} js;

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_LOOP, V_METHOD };

typedef struct jv jv;
typedef struct jlist {
    int64_t n;
    jv *v;
} jlist;
typedef struct jdict {
    int64_t n, cap;
    js *k;
    jv *v;
    bool ns; // a namespace(): its attributes may be set
} jdict;
typedef struct jloop {
    int64_t i, n;
    const jlist *items;
} jloop;

struct jv {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        js s;           // V_STR; V_UNDEF: the name that was undefined; V_METHOD: the method
        const jlist *l; // V_LIST
        jdict *d;       // V_DICT
        jloop *loop;    // V_LOOP
    } u;
    const jv *self; // V_METHOD: the receiver
};

// ---- the interpreter's state -------------------------------------------------------------

typedef struct chunk {
    struct chunk *prev;
    size_t cap, used;
    max_align_t data[];
} chunk;

enum { T_EOF, T_TEXT, T_VBEG, T_VEND, T_BBEG, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

typedef struct tok {
    uint8_t t;
    int32_t pos; // byte offset in the (normalized) source
    js s;        // T_TEXT, T_NAME, T_STR (unescaped), T_OP
    int64_t i;
    double f;
} tok;

typedef struct node node;
typedef struct var {
    struct var *next;
    js name;
    jv v;
} var;
typedef struct frame {
    struct frame *up;
    var *vars;
} frame;

typedef struct J {
    jmp_buf jb;
    nm_status st;
    char *err;
    size_t err_size;
    nm_jinja_limits lim;
    chunk *top;
    size_t mem;
    const char *src; // normalized source
    size_t n;
    tok *toks;
    int32_t ntok, captok, p;
    int32_t depth, loops;
    int64_t steps;
    int64_t ns_writes; // namespace attributes set: values that outlive a loop
    char *out; // malloc'd output
    size_t on, ocap;
    frame *fr;
    jdict *globals;
} J;

static void where(J *j, int32_t pos, char *buf, size_t size) {
    buf[0] = 0;
    if (pos < 0 || !j->src) return;
    int line = 1, col = 1;
    for (int32_t i = 0; i < pos && (size_t)i < j->n; i++) {
        if (j->src[i] == '\n') line++, col = 1;
        else if (((unsigned char)j->src[i] & 0xC0) != 0x80) col++;
    }
    snprintf(buf, size, "line %d, column %d: ", line, col);
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static _Noreturn void fail(J *j, nm_status st, int32_t pos, const char *fmt, ...) {
    j->st = st;
    if (j->err && j->err_size) {
        char at[64];
        where(j, pos, at, sizeof at);
        char msg[384];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(j->err, j->err_size, "%s%s", at, msg);
    }
    longjmp(j->jb, 1);
}

static void *jalloc(J *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    chunk *c = j->top;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (cap > j->lim.max_mem || j->mem + cap + sizeof(chunk) > j->lim.max_mem)
            fail(j, NM_ERR_RANGE, -1, "the template needs more than %zu bytes of memory", j->lim.max_mem);
        c = malloc(sizeof(chunk) + cap);
        if (!c) fail(j, NM_ERR_NOMEM, -1, "out of memory");
        c->prev = j->top;
        c->cap = cap;
        c->used = 0;
        j->top = c;
        j->mem += cap + sizeof(chunk);
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

// n elements of size sz, the product checked.
static void *jalloc_n(J *j, size_t n, size_t sz) {
    if (sz && n > j->lim.max_mem / sz)
        fail(j, NM_ERR_RANGE, -1, "the template needs more than %zu bytes of memory", j->lim.max_mem);
    return jalloc(j, (n && sz) ? n * sz : 1);
}

typedef struct mark {
    chunk *c;
    size_t used;
} mark;
static mark jmark(J *j) { return (mark){j->top, j->top ? j->top->used : 0}; }
static void jrelease(J *j, mark m) {
    while (j->top != m.c) {
        chunk *c = j->top;
        j->top = c->prev;
        j->mem -= c->cap + sizeof(chunk);
        free(c);
    }
    if (j->top) j->top->used = m.used;
}

static void step(J *j, int32_t pos) {
    if (++j->steps > j->lim.max_steps)
        fail(j, NM_ERR_RANGE, pos, "the template ran past %lld steps (a runaway loop?)", (long long)j->lim.max_steps);
}

static void enter(J *j, int32_t pos) {
    if (++j->depth > j->lim.max_depth)
        fail(j, NM_ERR_RANGE, pos, "the template nests deeper than %d", (int)j->lim.max_depth);
}
static void leave(J *j) { j->depth--; }

// ---- string builder (in the arena) -------------------------------------------------------

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_put(J *j, sb *b, const char *s, size_t n) {
    if (n > b->cap - b->n) {
        if (n > j->lim.max_mem) fail(j, NM_ERR_RANGE, -1, "a string past %zu bytes", j->lim.max_mem);
        size_t cap = 2 * (b->n + n) < 64 ? 64 : 2 * (b->n + n);
        char *q = jalloc(j, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void sb_puts(J *j, sb *b, const char *s) { sb_put(j, b, s, strlen(s)); }
static js sb_js(sb *b) { return (js){b->p ? b->p : "", b->n}; }

static void out_put(J *j, const char *s, size_t n) {
    if (n > j->lim.max_out - j->on)
        fail(j, NM_ERR_RANGE, -1, "the output passed %zu bytes", j->lim.max_out);
    if (j->on + n + 1 > j->ocap) {
        size_t cap = j->ocap ? j->ocap : 256;
        while (cap < j->on + n + 1) cap *= 2;
        char *q = realloc(j->out, cap);
        if (!q) fail(j, NM_ERR_NOMEM, -1, "out of memory");
        j->out = q;
        j->ocap = cap;
    }
    memcpy(j->out + j->on, s, n);
    j->on += n;
}

static bool js_eq(js a, const char *b) { return a.n == strlen(b) && !memcmp(a.p, b, a.n); }
static bool js_same(js a, js b) { return a.n == b.n && (a.n == 0 || !memcmp(a.p, b.p, a.n)); }
static js js_c(const char *s) { return (js){s, strlen(s)}; }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static void put_utf8(J *j, sb *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; // a lone surrogate cannot be UTF-8
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63)), u[2] = (char)(0x80 | (cp & 63)), n = 3;
    else if (cp < 0x110000)
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63)),
        u[2] = (char)(0x80 | ((cp >> 6) & 63)), u[3] = (char)(0x80 | (cp & 63)), n = 4;
    else u[0] = (char)0xEF, u[1] = (char)0xBF, u[2] = (char)0xBD, n = 3;
    sb_put(j, b, u, n);
}

// Bytes of the UTF-8 sequence starting at p (1 for a stray byte).
static size_t u8len(const char *p, size_t left) {
    unsigned char c = (unsigned char)p[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n > left) return 1;
    for (size_t k = 1; k < n; k++)
        if (((unsigned char)p[k] & 0xC0) != 0x80) return 1;
    return n;
}
static int64_t u8count(js s) {
    int64_t n = 0;
    for (size_t i = 0; i < s.n; i += u8len(s.p + i, s.n - i)) n++;
    return n;
}

// ---- lexer -------------------------------------------------------------------------------

static tok *push_tok(J *j, uint8_t t, size_t pos) {
    if (j->ntok == j->captok) {
        if (j->captok > (1 << 28)) fail(j, NM_ERR_RANGE, (int32_t)pos, "too many tokens");
        int32_t cap = j->captok ? 2 * j->captok : 256;
        tok *q = jalloc_n(j, (size_t)cap, sizeof *q);
        if (j->ntok) memcpy(q, j->toks, (size_t)j->ntok * sizeof *q);
        j->toks = q;
        j->captok = cap;
    }
    tok *t0 = &j->toks[j->ntok++];
    memset(t0, 0, sizeof *t0);
    t0->t = t;
    t0->pos = (int32_t)pos;
    return t0;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// A string literal at s[p] (the quote): Python's escapes, as Jinja2 reads them.
static size_t lex_string(J *j, size_t p, tok *t) {
    const char *s = j->src;
    char q = s[p];
    size_t i = p + 1;
    sb b = {0};
    for (;;) {
        if (i >= j->n) fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "unterminated string");
        char c = s[i];
        if (c == q) break;
        if (c != '\\') {
            sb_put(j, &b, &c, 1);
            i++;
            continue;
        }
        if (i + 1 >= j->n) fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "unterminated string");
        char e = s[i + 1];
        const char *simple = strchr("\\'\"abfnrtv\n", e);
        if (e && simple) {
            static const char from[] = "\\'\"abfnrtv", to[] = "\\'\"\a\b\f\n\r\t\v";
            if (e != '\n') sb_put(j, &b, &to[strchr(from, e) - from], 1); // \<newline>: a line continuation
            i += 2;
        } else if (e >= '0' && e <= '7') {
            uint32_t v = 0;
            size_t k = i + 1;
            for (int d = 0; d < 3 && k < j->n && s[k] >= '0' && s[k] <= '7'; d++, k++) v = v * 8 + (uint32_t)(s[k] - '0');
            put_utf8(j, &b, v);
            i = k;
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int w = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int d = 0; d < w; d++) {
                int h = i + 2 + (size_t)d < j->n ? hexval(s[i + 2 + d]) : -1;
                if (h < 0) fail(j, NM_ERR_UNSUPPORTED, (int32_t)i, "a truncated \\%c escape", e);
                v = v * 16 + (uint32_t)h;
            }
            put_utf8(j, &b, v);
            i += 2 + (size_t)w;
        } else { // unknown escapes stay as written
            sb_put(j, &b, s + i, 2);
            i += 2;
        }
    }
    t->s = sb_js(&b);
    return i + 1;
}

static void lex_tag(J *j, size_t t, char kind, size_t *pos_out) {
    const char *s = j->src;
    size_t n = j->n, p = t + 2;
    if (p < n && (s[p] == '-' || s[p] == '+')) p++;
    push_tok(j, kind == '{' ? T_VBEG : T_BBEG, t);
    char endc = kind == '{' ? '}' : '%';
    int braces = 0; // a dict literal's '}' must not end a {{ tag
    for (;;) {
        while (p < n && is_space(s[p])) p++;
        if (p >= n) fail(j, NM_ERR_UNSUPPORTED, (int32_t)t, "unterminated '%s'", kind == '{' ? "{{" : "{%");
        bool mod = (s[p] == '-' || (s[p] == '+' && kind == '%')) && p + 2 < n && s[p + 1] == endc && s[p + 2] == '}';
        if (braces == 0 && (mod || (s[p] == endc && p + 1 < n && s[p + 1] == '}'))) {
            push_tok(j, kind == '{' ? T_VEND : T_BEND, p);
            size_t e = p + (mod ? 3 : 2);
            if (mod && s[p] == '-') {
                while (e < n && is_space(s[e])) e++;
            } else if (!mod && kind == '%' && e < n && s[e] == '\n') {
                e++; // trim_blocks
            }
            *pos_out = e;
            return;
        }
        char c = s[p];
        if (is_alpha(c)) {
            size_t e = p;
            while (e < n && (is_alpha(s[e]) || is_digit(s[e]))) e++;
            tok *k = push_tok(j, T_NAME, p);
            k->s = (js){s + p, e - p};
            p = e;
        } else if (is_digit(c)) {
            size_t e = p;
            bool fl = false;
            while (e < n && (is_digit(s[e]) || s[e] == '_')) e++;
            if (e + 1 < n && s[e] == '.' && is_digit(s[e + 1])) {
                fl = true;
                e++;
                while (e < n && (is_digit(s[e]) || s[e] == '_')) e++;
            }
            if (e < n && (s[e] == 'e' || s[e] == 'E')) {
                size_t k = e + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && is_digit(s[k])) {
                    fl = true;
                    e = k;
                    while (e < n && is_digit(s[e])) e++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t k = p; k < e && m + 1 < sizeof num; k++)
                if (s[k] != '_') num[m++] = s[k];
            num[m] = 0;
            tok *k = push_tok(j, fl ? T_FLOAT : T_INT, p);
            if (fl) {
                k->f = strtod(num, NULL);
            } else {
                unsigned long long v = 0;
                for (size_t d = 0; d < m; d++) {
                    if (v > (unsigned long long)(INT64_MAX - 9) / 10)
                        fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "an integer too large");
                    v = v * 10 + (unsigned)(num[d] - '0');
                }
                k->i = (int64_t)v;
            }
            p = e;
        } else if (c == '\'' || c == '"') {
            tok *k = push_tok(j, T_STR, p);
            p = lex_string(j, p, k);
        } else {
            static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
            size_t len = 0;
            for (size_t k = 0; k < sizeof two / sizeof two[0]; k++)
                if (p + 1 < n && s[p] == two[k][0] && s[p + 1] == two[k][1]) len = 2;
            if (!len) {
                if (!strchr("+-*/%~()[]{}.,:|=<>", c) || c == 0)
                    fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "unexpected character '%c' in a tag",
                         (c >= 32 && c < 127) ? c : '?');
                len = 1;
                if (c == '{') braces++;
                if (c == '}' && braces > 0) braces--;
            }
            tok *k = push_tok(j, T_OP, p);
            k->s = (js){s + p, len};
            p += len;
        }
    }
}

static void lex(J *j) {
    const char *s = j->src;
    size_t n = j->n, pos = 0;
    for (;;) {
        size_t t = pos;
        char kind = 0;
        for (; t + 1 < n; t++)
            if (s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) {
                kind = s[t + 1];
                break;
            }
        if (!kind) t = n;
        size_t te = t;
        char sign = kind && t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
        if (kind && sign == '-') {
            while (te > pos && is_space(s[te - 1])) te--;
        } else if (kind && kind != '{' && sign != '+') {
            // lstrip_blocks: spaces and tabs from the start of the line to a block or comment tag
            size_t l = te;
            while (l > pos && s[l - 1] != '\n') l--;
            bool ws = true;
            for (size_t k = l; k < te; k++)
                if (!is_space(s[k])) ws = false;
            if (ws && (l > pos || pos == 0 || s[pos - 1] == '\n')) te = l;
        }
        if (te > pos) push_tok(j, T_TEXT, pos)->s = (js){s + pos, te - pos};
        if (!kind) break;
        if (kind == '#') {
            size_t e = t + 2;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) fail(j, NM_ERR_UNSUPPORTED, (int32_t)t, "unterminated comment '{#'");
            char m = e > t + 2 ? s[e - 1] : 0;
            pos = e + 2;
            if (m == '-') {
                while (pos < n && is_space(s[pos])) pos++;
            } else if (m != '+' && pos < n && s[pos] == '\n') {
                pos++;
            }
            continue;
        }
        lex_tag(j, t, kind, &pos);
    }
    push_tok(j, T_EOF, n);
}

// ---- syntax tree -------------------------------------------------------------------------

enum {
    // expressions
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_KW, E_FILTER, E_TEST, E_BIN, E_NOT, E_NEG, E_AND, E_OR,
    E_COND, E_LIST, E_DICT, E_PAIR,
    // statements
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_BLOCK
};
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE,
       OP_IN, OP_NOTIN };

struct node {
    uint8_t k, op;
    bool neg;    // E_TEST: `is not`
    int32_t pos;
    js s, s2;    // names, text; S_FOR: the targets
    jv v;        // E_LIT
    node *a, *b, *c, *d;
    node *next;  // the next in a list (arguments, items, statements)
};

static node *mk(J *j, uint8_t k, int32_t pos) {
    node *x = jalloc(j, sizeof *x);
    memset(x, 0, sizeof *x);
    x->k = k;
    x->pos = pos;
    return x;
}

static tok *cur(J *j) { return &j->toks[j->p]; }
static tok *peek(J *j, int k) { return j->p + k < j->ntok ? &j->toks[j->p + k] : &j->toks[j->ntok - 1]; }
static bool t_op(const tok *t, const char *o) { return t->t == T_OP && js_eq(t->s, o); }
static bool t_name(const tok *t, const char *nm) { return t->t == T_NAME && js_eq(t->s, nm); }

static const char *tok_desc(J *j, const tok *t, char *buf, size_t size) {
    switch (t->t) {
    case T_EOF: return "the end of the template";
    case T_TEXT: return "text";
    case T_VBEG: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEG: return "'{%'";
    case T_BEND: return "'%}'";
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: break;
    }
    (void)j;
    snprintf(buf, size, "'%.*s'", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p);
    return buf;
}

static _Noreturn void unexpected(J *j, const char *wanted) {
    char b[64];
    tok *t = cur(j);
    fail(j, NM_ERR_UNSUPPORTED, t->pos, "expected %s, found %s", wanted, tok_desc(j, t, b, sizeof b));
}

static void expect_op(J *j, const char *o) {
    if (!t_op(cur(j), o)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", o);
        unexpected(j, w);
    }
    j->p++;
}

static js expect_name(J *j) {
    if (cur(j)->t != T_NAME) unexpected(j, "a name");
    return j->toks[j->p++].s;
}

static const char *const FILTERS[] = {"trim", "length", "count", "default", "d", "upper", "lower", "capitalize",
                                      "title", "tojson", "items", "safe", "string", "int", "float", "join",
                                      "first", "last", "list", "replace", "reverse", "abs", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                    "boolean", "true", "false", "mapping", "iterable", "sequence", "odd",
                                    "even", "divisibleby", "eq", "equalto", "ne", "lower", "upper", "in",
                                    "sameas", NULL};
static const char *const FUNCS[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", NULL};

static int find_name(const char *const *list, js s) {
    for (int i = 0; list[i]; i++)
        if (js_eq(s, list[i])) return i;
    return -1;
}

static node *parse_expr(J *j);
static node *parse_or(J *j);
static node *parse_unary(J *j, bool with_filter);

// (args) of a call, a filter or a test: positional, then name=value.
static node *parse_args(J *j) {
    expect_op(j, "(");
    node *head = NULL, **tail = &head;
    while (!t_op(cur(j), ")")) {
        node *a;
        if (cur(j)->t == T_NAME && t_op(peek(j, 1), "=")) {
            a = mk(j, E_KW, cur(j)->pos);
            a->s = cur(j)->s;
            j->p += 2;
            a->a = parse_expr(j);
        } else {
            a = parse_expr(j);
        }
        *tail = a;
        tail = &a->next;
        if (!t_op(cur(j), ",")) break;
        j->p++;
    }
    expect_op(j, ")");
    return head;
}

static node *parse_primary(J *j) {
    tok *t = cur(j);
    enter(j, t->pos);
    node *x;
    if (t->t == T_NAME) {
        j->p++;
        x = mk(j, E_LIT, t->pos);
        if (js_eq(t->s, "true") || js_eq(t->s, "True")) x->v = (jv){.t = V_BOOL, .u.b = true};
        else if (js_eq(t->s, "false") || js_eq(t->s, "False")) x->v = (jv){.t = V_BOOL, .u.b = false};
        else if (js_eq(t->s, "none") || js_eq(t->s, "None")) x->v = (jv){.t = V_NONE};
        else x->k = E_NAME, x->s = t->s;
    } else if (t->t == T_STR) {
        x = mk(j, E_LIT, t->pos);
        sb b = {0};
        while (cur(j)->t == T_STR) { // adjacent literals join, as in Python
            sb_put(j, &b, cur(j)->s.p, cur(j)->s.n);
            j->p++;
        }
        x->v = (jv){.t = V_STR, .u.s = sb_js(&b)};
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        j->p++;
        x = mk(j, E_LIT, t->pos);
        x->v = t->t == T_INT ? (jv){.t = V_INT, .u.i = t->i} : (jv){.t = V_FLOAT, .u.f = t->f};
    } else if (t_op(t, "(")) { // a parenthesized expression, or a tuple (a list here)
        j->p++;
        if (t_op(cur(j), ")")) {
            j->p++;
            x = mk(j, E_LIST, t->pos);
        } else {
            x = parse_expr(j);
            if (t_op(cur(j), ",")) {
                node *l = mk(j, E_LIST, t->pos), **tail = &l->a;
                *tail = x;
                tail = &x->next;
                while (t_op(cur(j), ",")) {
                    j->p++;
                    if (t_op(cur(j), ")")) break;
                    node *e = parse_expr(j);
                    *tail = e;
                    tail = &e->next;
                }
                x = l;
            }
            expect_op(j, ")");
        }
    } else if (t_op(t, "[")) {
        j->p++;
        x = mk(j, E_LIST, t->pos);
        node **tail = &x->a;
        while (!t_op(cur(j), "]")) {
            node *e = parse_expr(j);
            *tail = e;
            tail = &e->next;
            if (!t_op(cur(j), ",")) break;
            j->p++;
        }
        expect_op(j, "]");
    } else if (t_op(t, "{")) {
        j->p++;
        x = mk(j, E_DICT, t->pos);
        node **tail = &x->a;
        while (!t_op(cur(j), "}")) {
            node *pr = mk(j, E_PAIR, cur(j)->pos);
            pr->a = parse_expr(j);
            expect_op(j, ":");
            pr->b = parse_expr(j);
            *tail = pr;
            tail = &pr->next;
            if (!t_op(cur(j), ",")) break;
            j->p++;
        }
        expect_op(j, "}");
    } else {
        unexpected(j, "an expression");
    }
    leave(j);
    return x;
}

static node *parse_postfix(J *j, node *x) {
    for (;;) {
        tok *t = cur(j);
        if (t_op(t, ".")) {
            j->p++;
            if (cur(j)->t == T_INT) { // x.0 is x[0]
                node *k = mk(j, E_LIT, cur(j)->pos);
                k->v = (jv){.t = V_INT, .u.i = cur(j)->i};
                j->p++;
                node *y = mk(j, E_ITEM, t->pos);
                y->a = x, y->b = k, x = y;
            } else {
                node *y = mk(j, E_ATTR, t->pos);
                y->a = x;
                y->s = expect_name(j);
                x = y;
            }
        } else if (t_op(t, "[")) {
            j->p++;
            node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (!t_op(cur(j), ":") && !t_op(cur(j), "]")) parts[np] = parse_expr(j);
                if (t_op(cur(j), ":") && np < 2) {
                    slice = true;
                    j->p++;
                    np++;
                    continue;
                }
                break;
            }
            expect_op(j, "]");
            node *y = mk(j, slice ? E_SLICE : E_ITEM, t->pos);
            y->a = x;
            if (slice) y->b = parts[0], y->c = parts[1], y->d = parts[2];
            else if (!parts[0]) fail(j, NM_ERR_UNSUPPORTED, t->pos, "an empty subscript");
            else y->b = parts[0];
            x = y;
        } else if (t_op(t, "(")) {
            node *y = mk(j, E_CALL, t->pos);
            y->a = x;
            if (x->k == E_NAME && find_name(FUNCS, x->s) < 0)
                fail(j, NM_ERR_UNSUPPORTED, x->pos, "unknown function '%.*s'", (int)x->s.n, x->s.p);
            if (x->k != E_NAME && x->k != E_ATTR)
                fail(j, NM_ERR_UNSUPPORTED, t->pos, "only functions and methods can be called");
            y->b = parse_args(j);
            x = y;
        } else {
            return x;
        }
    }
}

static node *parse_filter_expr(J *j, node *x) {
    for (;;) {
        tok *t = cur(j);
        if (t_op(t, "|")) {
            j->p++;
            node *y = mk(j, E_FILTER, cur(j)->pos);
            y->s = expect_name(j);
            if (find_name(FILTERS, y->s) < 0)
                fail(j, NM_ERR_UNSUPPORTED, y->pos, "unknown filter '%.*s'", (int)y->s.n, y->s.p);
            y->a = x;
            if (t_op(cur(j), "(")) y->b = parse_args(j);
            x = y;
        } else if (t_name(t, "is")) {
            j->p++;
            node *y = mk(j, E_TEST, t->pos);
            if (t_name(cur(j), "not")) y->neg = true, j->p++;
            y->pos = cur(j)->pos;
            y->s = expect_name(j);
            if (find_name(TESTS, y->s) < 0)
                fail(j, NM_ERR_UNSUPPORTED, y->pos, "unknown test '%.*s'", (int)y->s.n, y->s.p);
            y->a = x;
            tok *n = cur(j);
            if (t_op(n, "(")) {
                y->b = parse_args(j);
            } else if ((n->t == T_NAME || n->t == T_STR || n->t == T_INT || n->t == T_FLOAT || t_op(n, "[") ||
                        t_op(n, "{")) &&
                       !t_name(n, "else") && !t_name(n, "or") && !t_name(n, "and") && !t_name(n, "is") &&
                       !t_name(n, "if") && !t_name(n, "in") && !t_name(n, "not")) {
                y->b = parse_postfix(j, parse_primary(j)); // `x is divisibleby 3`
            }
            x = y;
        } else {
            return x;
        }
    }
}

static node *parse_unary(J *j, bool with_filter) {
    tok *t = cur(j);
    enter(j, t->pos);
    node *x;
    if (t_op(t, "-") || t_op(t, "+")) {
        j->p++;
        node *a = parse_unary(j, false);
        if (t_op(t, "-")) {
            x = mk(j, E_NEG, t->pos);
            x->a = a;
        } else {
            x = a;
        }
    } else {
        x = parse_primary(j);
    }
    x = parse_postfix(j, x);
    if (with_filter) x = parse_filter_expr(j, x);
    leave(j);
    return x;
}

static node *bin(J *j, int op, int32_t pos, node *a, node *b) {
    node *x = mk(j, E_BIN, pos);
    x->op = (uint8_t)op;
    x->a = a, x->b = b;
    return x;
}

static node *parse_pow(J *j) {
    node *x = parse_unary(j, true);
    while (t_op(cur(j), "**")) {
        int32_t pos = cur(j)->pos;
        j->p++;
        x = bin(j, OP_POW, pos, x, parse_unary(j, true));
    }
    return x;
}

static node *parse_math2(J *j) {
    node *x = parse_pow(j);
    for (;;) {
        tok *t = cur(j);
        int op = t_op(t, "*") ? OP_MUL : t_op(t, "/") ? OP_DIV : t_op(t, "//") ? OP_FDIV : t_op(t, "%") ? OP_MOD : -1;
        if (op < 0) return x;
        j->p++;
        x = bin(j, op, t->pos, x, parse_pow(j));
    }
}

static node *parse_concat(J *j) {
    node *x = parse_math2(j);
    while (t_op(cur(j), "~")) {
        int32_t pos = cur(j)->pos;
        j->p++;
        x = bin(j, OP_CAT, pos, x, parse_math2(j));
    }
    return x;
}

static node *parse_math1(J *j) {
    node *x = parse_concat(j);
    for (;;) {
        tok *t = cur(j);
        int op = t_op(t, "+") ? OP_ADD : t_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return x;
        j->p++;
        x = bin(j, op, t->pos, x, parse_concat(j));
    }
}

static int cmp_op(J *j) {
    tok *t = cur(j);
    if (t_op(t, "==")) return OP_EQ;
    if (t_op(t, "!=")) return OP_NE;
    if (t_op(t, "<")) return OP_LT;
    if (t_op(t, ">")) return OP_GT;
    if (t_op(t, "<=")) return OP_LE;
    if (t_op(t, ">=")) return OP_GE;
    if (t_name(t, "in")) return OP_IN;
    if (t_name(t, "not") && t_name(peek(j, 1), "in")) return OP_NOTIN;
    return -1;
}

static node *parse_compare(J *j) {
    node *x = parse_math1(j);
    int op = cmp_op(j);
    if (op < 0) return x;
    int32_t pos = cur(j)->pos;
    j->p += op == OP_NOTIN ? 2 : 1;
    x = bin(j, op, pos, x, parse_math1(j));
    if (cmp_op(j) >= 0) fail(j, NM_ERR_UNSUPPORTED, cur(j)->pos, "chained comparisons are not supported");
    return x;
}

static node *parse_not(J *j) {
    tok *t = cur(j);
    if (t_name(t, "not")) {
        j->p++;
        enter(j, t->pos);
        node *x = mk(j, E_NOT, t->pos);
        x->a = parse_not(j);
        leave(j);
        return x;
    }
    return parse_compare(j);
}

static node *parse_and(J *j) {
    node *x = parse_not(j);
    while (t_name(cur(j), "and")) {
        node *y = mk(j, E_AND, cur(j)->pos);
        j->p++;
        y->a = x, y->b = parse_not(j), x = y;
    }
    return x;
}

static node *parse_or(J *j) {
    node *x = parse_and(j);
    while (t_name(cur(j), "or")) {
        node *y = mk(j, E_OR, cur(j)->pos);
        j->p++;
        y->a = x, y->b = parse_and(j), x = y;
    }
    return x;
}

// `a if cond else b` (else optional: undefined), Jinja2's parse_condexpr.
static node *parse_expr(J *j) {
    enter(j, cur(j)->pos);
    node *x = parse_or(j);
    while (t_name(cur(j), "if")) {
        node *y = mk(j, E_COND, cur(j)->pos);
        j->p++;
        y->a = x;
        y->b = parse_or(j);
        if (t_name(cur(j), "else")) {
            j->p++;
            y->c = parse_expr(j);
        }
        x = y;
    }
    leave(j);
    return x;
}

// ---- statements --------------------------------------------------------------------------

static void expect_bend(J *j) {
    if (cur(j)->t != T_BEND) unexpected(j, "'%}'");
    j->p++;
}

// Statements up to a {% NAME %} with NAME in ends (left at NAME; *which its
// index) or the end of the template (only where ends is empty).
static node *parse_body(J *j, const char *const *ends, int *which, int32_t open_pos, const char *open);

static node *parse_stmt(J *j, int32_t bpos) {
    tok *t = cur(j);
    js nm = expect_name(j);
    node *x;
    if (js_eq(nm, "if")) {
        x = mk(j, S_IF, t->pos);
        x->a = parse_expr(j);
        expect_bend(j);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        int w;
        node *cur_if = x;
        for (;;) {
            cur_if->b = parse_body(j, ends, &w, bpos, "if");
            j->p++;
            if (w == 0) { // elif: a nested if in the else branch
                node *y = mk(j, S_IF, cur(j)->pos);
                y->a = parse_expr(j);
                expect_bend(j);
                cur_if->c = y;
                cur_if = y;
                continue;
            }
            expect_bend(j);
            if (w == 1) {
                static const char *const endif[] = {"endif", NULL};
                cur_if->c = parse_body(j, endif, &w, bpos, "if");
                j->p++;
                expect_bend(j);
            }
            break;
        }
    } else if (js_eq(nm, "for")) {
        x = mk(j, S_FOR, t->pos);
        x->s = expect_name(j);
        if (t_op(cur(j), ",")) {
            j->p++;
            x->s2 = expect_name(j);
        }
        if (!t_name(cur(j), "in")) unexpected(j, "'in'");
        j->p++;
        x->a = parse_or(j);
        if (t_name(cur(j), "if")) { // a loop filter
            j->p++;
            x->d = parse_or(j);
        }
        if (t_name(cur(j), "recursive")) fail(j, NM_ERR_UNSUPPORTED, cur(j)->pos, "recursive loops are not supported");
        expect_bend(j);
        static const char *const ends[] = {"else", "endfor", NULL};
        int w;
        j->loops++;
        x->b = parse_body(j, ends, &w, bpos, "for");
        j->loops--;
        j->p++;
        expect_bend(j);
        if (w == 0) {
            static const char *const endfor[] = {"endfor", NULL};
            x->c = parse_body(j, endfor, &w, bpos, "for");
            j->p++;
            expect_bend(j);
        }
    } else if (js_eq(nm, "set")) {
        x = mk(j, S_SET, t->pos);
        node *tg = mk(j, E_NAME, cur(j)->pos);
        tg->s = expect_name(j);
        if (t_op(cur(j), ".")) {
            j->p++;
            node *y = mk(j, E_ATTR, cur(j)->pos);
            y->a = tg;
            y->s = expect_name(j);
            tg = y;
        } else if (t_op(cur(j), ",")) {
            fail(j, NM_ERR_UNSUPPORTED, cur(j)->pos, "'set' of several names is not supported");
        }
        x->a = tg;
        if (cur(j)->t == T_BEND) { // {% set x %}...{% endset %}
            if (tg->k != E_NAME) fail(j, NM_ERR_UNSUPPORTED, tg->pos, "a block set of an attribute");
            j->p++;
            static const char *const ends[] = {"endset", NULL};
            int w;
            x->c = parse_body(j, ends, &w, bpos, "set");
            j->p++;
        } else {
            expect_op(j, "=");
            x->b = parse_expr(j);
        }
        expect_bend(j);
    } else if (js_eq(nm, "break") || js_eq(nm, "continue")) {
        if (!j->loops) fail(j, NM_ERR_UNSUPPORTED, t->pos, "'%.*s' outside a loop", (int)nm.n, nm.p);
        x = mk(j, js_eq(nm, "break") ? S_BREAK : S_CONTINUE, t->pos);
        expect_bend(j);
    } else if (js_eq(nm, "generation")) { // transformers' marker of the assistant's text: renders its body
        x = mk(j, S_BLOCK, t->pos);
        expect_bend(j);
        static const char *const ends[] = {"endgeneration", NULL};
        int w;
        x->b = parse_body(j, ends, &w, bpos, "generation");
        j->p++;
        expect_bend(j);
    } else {
        static const char *const jinja[] = {"macro", "call", "filter", "include", "import", "from", "extends",
                                            "block", "raw", "with", "autoescape", "do", NULL};
        if (find_name(jinja, nm) >= 0)
            fail(j, NM_ERR_UNSUPPORTED, t->pos, "the statement '%.*s' is not supported", (int)nm.n, nm.p);
        fail(j, NM_ERR_UNSUPPORTED, t->pos, "unknown statement '%.*s'", (int)(nm.n > 40 ? 40 : nm.n), nm.p);
    }
    return x;
}

static node *parse_body(J *j, const char *const *ends, int *which, int32_t open_pos, const char *open) {
    enter(j, cur(j)->pos);
    node *head = NULL, **tail = &head;
    for (;;) {
        tok *t = cur(j);
        node *x;
        if (t->t == T_EOF) {
            if (ends && ends[0])
                fail(j, NM_ERR_UNSUPPORTED, open_pos, "{%% %s %%} is never closed (no {%% end%s %%})", open, open);
            break;
        }
        if (t->t == T_TEXT) {
            x = mk(j, S_TEXT, t->pos);
            x->s = t->s;
            j->p++;
        } else if (t->t == T_VBEG) {
            j->p++;
            x = mk(j, S_OUT, t->pos);
            x->a = parse_expr(j);
            if (cur(j)->t != T_VEND) unexpected(j, "'}}'");
            j->p++;
        } else if (t->t == T_BBEG) {
            j->p++;
            tok *nm = cur(j);
            if (nm->t == T_NAME && ends) {
                int w = find_name(ends, nm->s);
                if (w >= 0) {
                    *which = w;
                    leave(j);
                    return head;
                }
            }
            static const char *const closers[] = {"elif", "else", "endif", "endfor", "endset", "endgeneration",
                                                  NULL};
            if (nm->t == T_NAME && find_name(closers, nm->s) >= 0)
                fail(j, NM_ERR_UNSUPPORTED, nm->pos, "unexpected '%.*s'", (int)nm->s.n, nm->s.p);
            x = parse_stmt(j, t->pos);
        } else {
            char b[64];
            fail(j, NM_ERR_UNSUPPORTED, t->pos, "unexpected %s", tok_desc(j, t, b, sizeof b));
        }
        *tail = x;
        tail = &x->next;
    }
    leave(j);
    return head;
}

// ---- evaluation: values ------------------------------------------------------------------

static jv v_undef(js name) { return (jv){.t = V_UNDEF, .u.s = name}; }
static jv v_str(js s) { return (jv){.t = V_STR, .u.s = s}; }
static jv v_int(int64_t i) { return (jv){.t = V_INT, .u.i = i}; }
static jv v_bool(bool b) { return (jv){.t = V_BOOL, .u.b = b}; }

static const char *type_name(jv v) {
    static const char *const n[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                    "LoopContext", "method"};
    return v.t == V_DICT && v.u.d->ns ? "Namespace" : n[v.t];
}

static bool is_num(jv v) { return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT; }
static double num(jv v) { return v.t == V_FLOAT ? v.u.f : v.t == V_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t inum(jv v) { return v.t == V_INT ? v.u.i : v.t == V_BOOL ? v.u.b : (int64_t)v.u.f; }

static bool truthy(jv v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n > 0;
    case V_LIST: return v.u.l->n > 0;
    case V_DICT: return v.u.d->ns || v.u.d->n > 0;
    default: return true;
    }
}

static _Noreturn void undefined_err(J *j, int32_t pos, jv v) {
    fail(j, NM_ERR_TEMPLATE, pos, "'%.*s' is undefined", (int)(v.u.s.n > 60 ? 60 : v.u.s.n), v.u.s.p);
}

static jv *dict_get(const jdict *d, js k) {
    for (int64_t i = 0; i < d->n; i++)
        if (js_same(d->k[i], k)) return &d->v[i];
    return NULL;
}

static jdict *dict_new(J *j, bool ns) {
    jdict *d = jalloc(j, sizeof *d);
    memset(d, 0, sizeof *d);
    d->ns = ns;
    return d;
}

static void dict_set(J *j, jdict *d, js k, jv v) {
    jv *old = dict_get(d, k);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 8;
        js *nk = jalloc_n(j, (size_t)cap, sizeof *nk);
        jv *nv = jalloc_n(j, (size_t)cap, sizeof *nv);
        if (d->n) memcpy(nk, d->k, (size_t)d->n * sizeof *nk), memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static jlist *list_new(J *j, int64_t n) {
    jlist *l = jalloc(j, sizeof *l);
    l->n = n;
    l->v = jalloc_n(j, (size_t)(n ? n : 1), sizeof(jv));
    return l;
}

// Python's repr of a float: the shortest digits that read back, exponent form
// below 1e-4 and from 1e16.
static void fmt_float(double f, char *buf, size_t size) {
    if (isnan(f)) { snprintf(buf, size, "nan"); return; }
    if (isinf(f)) { snprintf(buf, size, f < 0 ? "-inf" : "inf"); return; }
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    if (p > 17) p = 17;
    // e: [-]d[.ddd]e[+-]XX
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int x = atoi(q + 1);
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (x < -4 || x >= 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    } else if (x < 0) {
        out[o++] = '0', out[o++] = '.';
        for (int i = 0; i < -x - 1; i++) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = digits[i];
    } else {
        for (int i = 0; i <= x; i++) out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > x + 1)
            for (int i = x + 1; i < nd; i++) out[o++] = digits[i];
        else
            out[o++] = '0';
    }
    out[o] = 0;
    snprintf(buf, size, "%s", out);
}

static void write_val(J *j, sb *b, jv v, bool repr, int depth);

static void write_repr_str(J *j, sb *b, js s) {
    char q = memchr(s.p, '\'', s.n) && !memchr(s.p, '"', s.n) ? '"' : '\'';
    sb_put(j, b, &q, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char e[8];
        if (c == '\\' || c == (unsigned char)q) e[0] = '\\', e[1] = (char)c, e[2] = 0;
        else if (c == '\n') strcpy(e, "\\n");
        else if (c == '\r') strcpy(e, "\\r");
        else if (c == '\t') strcpy(e, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\x%02x", c);
        else e[0] = (char)c, e[1] = 0;
        sb_puts(j, b, e);
    }
    sb_put(j, b, &q, 1);
}

// Python's str() (repr: false) or repr() of a value.
static void write_val(J *j, sb *b, jv v, bool repr, int depth) {
    if (depth > j->lim.max_depth) fail(j, NM_ERR_RANGE, -1, "a value nests deeper than %d", (int)j->lim.max_depth);
    step(j, -1);
    char t[48];
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: sb_puts(j, b, "None"); break;
    case V_BOOL: sb_puts(j, b, v.u.b ? "True" : "False"); break;
    case V_INT: snprintf(t, sizeof t, "%lld", (long long)v.u.i), sb_puts(j, b, t); break;
    case V_FLOAT: fmt_float(v.u.f, t, sizeof t), sb_puts(j, b, t); break;
    case V_STR:
        if (repr) write_repr_str(j, b, v.u.s);
        else sb_put(j, b, v.u.s.p, v.u.s.n);
        break;
    case V_LIST:
        sb_puts(j, b, "[");
        for (int64_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(j, b, ", ");
            write_val(j, b, v.u.l->v[i], true, depth + 1);
        }
        sb_puts(j, b, "]");
        break;
    case V_DICT:
        sb_puts(j, b, v.u.d->ns ? "<Namespace {" : "{");
        for (int64_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_puts(j, b, ", ");
            write_repr_str(j, b, v.u.d->k[i]);
            sb_puts(j, b, ": ");
            write_val(j, b, v.u.d->v[i], true, depth + 1);
        }
        sb_puts(j, b, v.u.d->ns ? "}>" : "}");
        break;
    case V_LOOP:
        snprintf(t, sizeof t, "<LoopContext %lld/%lld>", (long long)v.u.loop->i + 1, (long long)v.u.loop->n);
        sb_puts(j, b, t);
        break;
    default: sb_puts(j, b, "<built-in method>"); break;
    }
}

static js to_str(J *j, jv v) {
    if (v.t == V_STR) return v.u.s;
    sb b = {0};
    write_val(j, &b, v, false, 0);
    return sb_js(&b);
}

static void json_str(J *j, sb *b, js s) {
    sb_puts(j, b, "\"");
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char e[8];
        if (c == '"') strcpy(e, "\\\"");
        else if (c == '\\') strcpy(e, "\\\\");
        else if (c == '\n') strcpy(e, "\\n");
        else if (c == '\r') strcpy(e, "\\r");
        else if (c == '\t') strcpy(e, "\\t");
        else if (c == '\b') strcpy(e, "\\b");
        else if (c == '\f') strcpy(e, "\\f");
        else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c);
        else e[0] = (char)c, e[1] = 0;
        sb_puts(j, b, e);
    }
    sb_puts(j, b, "\"");
}

static void json_nl(J *j, sb *b, int indent, int level) {
    sb_puts(j, b, "\n");
    for (int i = 0; i < indent * level; i++) sb_puts(j, b, " ");
}

// json.dumps(v, ensure_ascii=False[, indent]) as transformers' tojson calls it.
static void write_json(J *j, sb *b, jv v, int indent, int level, int32_t pos) {
    if (level > j->lim.max_depth) fail(j, NM_ERR_RANGE, pos, "a value nests deeper than %d", (int)j->lim.max_depth);
    step(j, pos);
    char t[48];
    switch (v.t) {
    case V_NONE: sb_puts(j, b, "null"); break;
    case V_BOOL: sb_puts(j, b, v.u.b ? "true" : "false"); break;
    case V_INT: snprintf(t, sizeof t, "%lld", (long long)v.u.i), sb_puts(j, b, t); break;
    case V_FLOAT:
        if (isnan(v.u.f)) sb_puts(j, b, "NaN");
        else if (isinf(v.u.f)) sb_puts(j, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else fmt_float(v.u.f, t, sizeof t), sb_puts(j, b, t);
        break;
    case V_STR: json_str(j, b, v.u.s); break;
    case V_LIST:
    case V_DICT: {
        bool list = v.t == V_LIST;
        int64_t n = list ? v.u.l->n : v.u.d->n;
        sb_puts(j, b, list ? "[" : "{");
        for (int64_t i = 0; i < n; i++) {
            if (i) sb_puts(j, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_nl(j, b, indent, level + 1);
            if (!list) {
                json_str(j, b, v.u.d->k[i]);
                sb_puts(j, b, ": ");
            }
            write_json(j, b, list ? v.u.l->v[i] : v.u.d->v[i], indent, level + 1, pos);
        }
        if (n && indent >= 0) json_nl(j, b, indent, level);
        sb_puts(j, b, list ? "]" : "}");
        break;
    }
    default: fail(j, NM_ERR_TEMPLATE, pos, "Object of type %s is not JSON serializable", type_name(v));
    }
}

static bool veq(J *j, jv a, jv b, int depth) {
    if (depth > j->lim.max_depth) fail(j, NM_ERR_RANGE, -1, "a value nests deeper than %d", (int)j->lim.max_depth);
    step(j, -1); // a shared value compared with itself can be a tree exponentially larger than its memory
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return js_same(a.u.s, b.u.s);
    case V_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (int64_t i = 0; i < a.u.l->n; i++)
            if (!veq(j, a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case V_DICT:
        if (a.u.d == b.u.d) return true;
        if (a.u.d->ns || b.u.d->ns || a.u.d->n != b.u.d->n) return false;
        for (int64_t i = 0; i < a.u.d->n; i++) {
            jv *o = dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !veq(j, a.u.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case V_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

// a < b (-1), == (0), > (1) for numbers and strings; anything else fails.
static int vcmp(J *j, jv a, jv b, int32_t pos, const char *op) {
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return inum(a) < inum(b) ? -1 : inum(a) > inum(b);
        return num(a) < num(b) ? -1 : num(a) > num(b);
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == V_UNDEF) undefined_err(j, pos, a);
    if (b.t == V_UNDEF) undefined_err(j, pos, b);
    fail(j, NM_ERR_TEMPLATE, pos, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a),
         type_name(b));
}

// The items a for loop (or list, join ...) walks: a list's items, a dict's
// keys, a string's characters; undefined walks nothing.
static const jlist *iter_items(J *j, jv v, int32_t pos) {
    static const jlist empty = {0, NULL};
    switch (v.t) {
    case V_UNDEF: return &empty;
    case V_LIST: return v.u.l;
    case V_DICT: {
        jlist *l = list_new(j, v.u.d->n);
        for (int64_t i = 0; i < v.u.d->n; i++) l->v[i] = v_str(v.u.d->k[i]);
        return l;
    }
    case V_STR: {
        jlist *l = list_new(j, u8count(v.u.s));
        int64_t k = 0;
        for (size_t i = 0; i < v.u.s.n;) {
            size_t m = u8len(v.u.s.p + i, v.u.s.n - i);
            l->v[k++] = v_str((js){v.u.s.p + i, m});
            i += m;
        }
        return l;
    }
    default: fail(j, NM_ERR_TEMPLATE, pos, "'%s' object is not iterable", type_name(v));
    }
}

static int64_t vlen(J *j, jv v, int32_t pos) {
    switch (v.t) {
    case V_UNDEF: return 0;
    case V_STR: return u8count(v.u.s);
    case V_LIST: return v.u.l->n;
    case V_DICT: return v.u.d->n;
    default: fail(j, NM_ERR_TEMPLATE, pos, "object of type '%s' has no len()", type_name(v));
    }
}

// ---- attributes, items, slices -----------------------------------------------------------

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith",
                                          "upper", "lower", "replace", "title", "capitalize", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static jv method(J *j, jv self, js name) {
    jv *s = jalloc(j, sizeof *s);
    *s = self;
    return (jv){.t = V_METHOD, .u.s = name, .self = s};
}

static jv loop_attr(jloop *l, js name) {
    if (js_eq(name, "index0")) return v_int(l->i);
    if (js_eq(name, "index")) return v_int(l->i + 1);
    if (js_eq(name, "revindex0")) return v_int(l->n - l->i - 1);
    if (js_eq(name, "revindex")) return v_int(l->n - l->i);
    if (js_eq(name, "first")) return v_bool(l->i == 0);
    if (js_eq(name, "last")) return v_bool(l->i == l->n - 1);
    if (js_eq(name, "length")) return v_int(l->n);
    if (js_eq(name, "previtem")) return l->i > 0 ? l->items->v[l->i - 1] : v_undef(name);
    if (js_eq(name, "nextitem")) return l->i + 1 < l->n ? l->items->v[l->i + 1] : v_undef(name);
    return v_undef(name);
}

// obj.name: Jinja2 tries the Python attribute (a method), then the item.
static jv get_attr(J *j, jv o, js name, int32_t pos) {
    switch (o.t) {
    case V_UNDEF: undefined_err(j, pos, o);
    case V_DICT: {
        if (!o.u.d->ns && find_name(DICT_METHODS, name) >= 0) return method(j, o, name);
        jv *v = dict_get(o.u.d, name);
        return v ? *v : v_undef(name);
    }
    case V_STR: return find_name(STR_METHODS, name) >= 0 ? method(j, o, name) : v_undef(name);
    case V_LOOP: return loop_attr(o.u.loop, name);
    default: return v_undef(name);
    }
}

// obj[key]: Jinja2 tries the item, then the attribute.
static jv get_item(J *j, jv o, jv k, int32_t pos) {
    if (o.t == V_UNDEF) undefined_err(j, pos, o);
    if (o.t == V_DICT && k.t == V_STR) {
        jv *v = dict_get(o.u.d, k.u.s);
        if (v) return *v;
        return get_attr(j, o, k.u.s, pos);
    }
    if ((o.t == V_LIST || o.t == V_STR) && (k.t == V_INT || k.t == V_BOOL)) {
        int64_t i = inum(k);
        if (o.t == V_LIST) {
            if (i < 0) i += o.u.l->n;
            return i >= 0 && i < o.u.l->n ? o.u.l->v[i] : v_undef(js_c("item"));
        }
        const jlist *cs = iter_items(j, o, pos);
        if (i < 0) i += cs->n;
        return i >= 0 && i < cs->n ? cs->v[i] : v_undef(js_c("item"));
    }
    if (k.t == V_STR) return get_attr(j, o, k.u.s, pos);
    return v_undef(js_c("item"));
}

static int64_t slice_bound(J *j, jv v, int64_t len, int64_t dflt, int64_t lo, int64_t hi, int32_t pos) {
    if (v.t == V_NONE || v.t == V_UNDEF) return dflt;
    if (v.t != V_INT && v.t != V_BOOL) fail(j, NM_ERR_TEMPLATE, pos, "slice indices must be integers");
    int64_t i = inum(v);
    if (i < 0) {
        i += len;
        if (i < lo) i = lo;
    } else if (i > hi) {
        i = hi;
    }
    return i;
}

// Python's slice o[a:b:c] of a list or a string.
static jv get_slice(J *j, jv o, jv a, jv b, jv c, int32_t pos) {
    if (o.t == V_UNDEF) undefined_err(j, pos, o);
    if (o.t != V_LIST && o.t != V_STR) fail(j, NM_ERR_TEMPLATE, pos, "'%s' object is not subscriptable", type_name(o));
    const jlist *items = iter_items(j, o, pos);
    int64_t len = items->n, stp = 1;
    if (c.t != V_NONE && c.t != V_UNDEF) {
        if (c.t != V_INT && c.t != V_BOOL) fail(j, NM_ERR_TEMPLATE, pos, "slice indices must be integers");
        stp = inum(c);
        if (stp == 0) fail(j, NM_ERR_TEMPLATE, pos, "slice step cannot be zero");
    }
    int64_t lo = stp > 0 ? 0 : -1, hi = stp > 0 ? len : len - 1;
    int64_t start = slice_bound(j, a, len, stp > 0 ? lo : hi, lo, hi, pos);
    int64_t stop = slice_bound(j, b, len, stp > 0 ? hi : lo, lo, hi, pos);
    int64_t n = 0;
    if (stp > 0 && stop > start) n = (stop - start + stp - 1) / stp;
    if (stp < 0 && start > stop) n = (start - stop + (-stp) - 1) / (-stp);
    if (o.t == V_LIST) {
        jlist *l = list_new(j, n);
        for (int64_t k = 0; k < n; k++) l->v[k] = items->v[start + k * stp];
        return (jv){.t = V_LIST, .u.l = l};
    }
    sb s = {0};
    for (int64_t k = 0; k < n; k++) sb_put(j, &s, items->v[start + k * stp].u.s.p, items->v[start + k * stp].u.s.n);
    return v_str(sb_js(&s));
}

// ---- calls -------------------------------------------------------------------------------

#define MAX_ARGS 8
typedef struct args {
    int n, nk;
    jv v[MAX_ARGS];
    js kn[MAX_ARGS];
    jv kv[MAX_ARGS];
} args;

static jv eval(J *j, node *x);

static void eval_args(J *j, node *a, args *ar, int32_t pos) {
    memset(ar, 0, sizeof *ar);
    for (; a; a = a->next) {
        if (a->k == E_KW) {
            if (ar->nk == MAX_ARGS) fail(j, NM_ERR_UNSUPPORTED, pos, "more than %d keyword arguments", MAX_ARGS);
            ar->kn[ar->nk] = a->s;
            ar->kv[ar->nk++] = eval(j, a->a);
        } else {
            if (ar->n == MAX_ARGS) fail(j, NM_ERR_UNSUPPORTED, pos, "more than %d arguments", MAX_ARGS);
            ar->v[ar->n++] = eval(j, a);
        }
    }
}

// Argument i, or the keyword `kw`, or NULL.
static const jv *arg(const args *ar, int i, const char *kw) {
    if (i >= 0 && i < ar->n) return &ar->v[i];
    for (int k = 0; kw && k < ar->nk; k++)
        if (js_eq(ar->kn[k], kw)) return &ar->kv[k];
    return NULL;
}

static js want_str(J *j, const jv *v, int32_t pos, const char *what) {
    if (!v || v->t != V_STR) fail(j, NM_ERR_TEMPLATE, pos, "%s: expected a string", what);
    return v->u.s;
}

static int64_t want_int(J *j, const jv *v, int32_t pos, const char *what) {
    if (!v || (v->t != V_INT && v->t != V_BOOL)) fail(j, NM_ERR_TEMPLATE, pos, "%s: expected an integer", what);
    return inum(*v);
}

static bool in_set(char c, js chars, bool ws) {
    return ws ? is_space(c) : memchr(chars.p, c, chars.n) != NULL;
}

static js strip(js s, const jv *chars, bool left, bool right) {
    bool ws = !chars || chars->t != V_STR;
    js cs = ws ? (js){"", 0} : chars->u.s;
    size_t a = 0, b = s.n;
    while (left && a < b && in_set(s.p[a], cs, ws)) a++;
    while (right && b > a && in_set(s.p[b - 1], cs, ws)) b--;
    return (js){s.p + a, b - a};
}

static js change_case(J *j, js s, int mode) { // 0 lower, 1 upper, 2 capitalize, 3 title (ASCII letters)
    char *p = jalloc(j, s.n ? s.n : 1);
    bool start = true;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.p[i];
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && start);
        if (up && c >= 'a' && c <= 'z') c = (char)(c - 32);
        else if (!up && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        start = !is_alpha(c) || c == '_';
        p[i] = c;
    }
    return (js){p, s.n};
}

static js replace(J *j, js s, js old, js new_, int64_t count) {
    sb b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old.n == 0) { // Python inserts `new` around every character
        for (; i <= s.n && (count < 0 || done < count); done++) {
            sb_put(j, &b, new_.p, new_.n);
            if (i == s.n) { i++; break; }
            size_t m = u8len(s.p + i, s.n - i);
            sb_put(j, &b, s.p + i, m);
            i += m;
        }
        if (i < s.n) sb_put(j, &b, s.p + i, s.n - i);
        return sb_js(&b);
    }
    while (i < s.n) {
        const char *f = (count < 0 || done < count) && s.n - i >= old.n ? memmem(s.p + i, s.n - i, old.p, old.n) : NULL;
        if (!f) break;
        sb_put(j, &b, s.p + i, (size_t)(f - (s.p + i)));
        sb_put(j, &b, new_.p, new_.n);
        i = (size_t)(f - s.p) + old.n;
        done++;
    }
    sb_put(j, &b, s.p + i, s.n - i);
    return sb_js(&b);
}

static jv split(J *j, js s, const jv *sep, int64_t maxsplit, int32_t pos) {
    int64_t cap = 8, n = 0;
    jv *v = jalloc_n(j, (size_t)cap, sizeof *v);
    size_t i = 0;
    bool ws = !sep || sep->t == V_NONE;
    js d = ws ? (js){"", 0} : want_str(j, sep, pos, "split");
    if (!ws && d.n == 0) fail(j, NM_ERR_TEMPLATE, pos, "split: empty separator");
    for (;;) {
        js piece;
        bool last = false;
        if (ws) {
            while (i < s.n && is_space(s.p[i])) i++;
            if (i >= s.n) break;
            size_t e = i;
            if (maxsplit >= 0 && n >= maxsplit) {
                e = s.n;
                while (e > i && is_space(s.p[e - 1])) e--;
                last = true;
            } else {
                while (e < s.n && !is_space(s.p[e])) e++;
            }
            piece = (js){s.p + i, e - i};
            i = e;
        } else {
            const char *f = (maxsplit < 0 || n < maxsplit) && s.n - i >= d.n ? memmem(s.p + i, s.n - i, d.p, d.n) : NULL;
            if (!f) {
                piece = (js){s.p + i, s.n - i};
                last = true;
            } else {
                piece = (js){s.p + i, (size_t)(f - (s.p + i))};
                i = (size_t)(f - s.p) + d.n;
            }
        }
        if (n == cap) {
            jv *q = jalloc_n(j, (size_t)cap * 2, sizeof *q);
            memcpy(q, v, (size_t)n * sizeof *q);
            v = q;
            cap *= 2;
        }
        v[n++] = v_str(piece);
        step(j, pos);
        if (last) break;
    }
    jlist *l = jalloc(j, sizeof *l);
    l->n = n;
    l->v = v;
    return (jv){.t = V_LIST, .u.l = l};
}

static bool starts(js s, js p) { return s.n >= p.n && !memcmp(s.p, p.p, p.n); }
static bool ends_with(js s, js p) { return s.n >= p.n && !memcmp(s.p + s.n - p.n, p.p, p.n); }

static jv call_method(J *j, jv self, js name, const args *ar, int32_t pos) {
    if (self.t == V_STR) {
        js s = self.u.s;
        if (js_eq(name, "strip")) return v_str(strip(s, arg(ar, 0, "chars"), true, true));
        if (js_eq(name, "lstrip")) return v_str(strip(s, arg(ar, 0, "chars"), true, false));
        if (js_eq(name, "rstrip")) return v_str(strip(s, arg(ar, 0, "chars"), false, true));
        if (js_eq(name, "upper")) return v_str(change_case(j, s, 1));
        if (js_eq(name, "lower")) return v_str(change_case(j, s, 0));
        if (js_eq(name, "capitalize")) return v_str(change_case(j, s, 2));
        if (js_eq(name, "title")) return v_str(change_case(j, s, 3));
        if (js_eq(name, "startswith") || js_eq(name, "endswith")) {
            js p = want_str(j, arg(ar, 0, NULL), pos, "startswith/endswith");
            return v_bool(js_eq(name, "startswith") ? starts(s, p) : ends_with(s, p));
        }
        if (js_eq(name, "split")) {
            const jv *m = arg(ar, 1, "maxsplit");
            return split(j, s, arg(ar, 0, "sep"), m ? want_int(j, m, pos, "split") : -1, pos);
        }
        if (js_eq(name, "replace")) {
            const jv *c = arg(ar, 2, "count");
            return v_str(replace(j, s, want_str(j, arg(ar, 0, NULL), pos, "replace"),
                                 want_str(j, arg(ar, 1, NULL), pos, "replace"), c ? want_int(j, c, pos, "replace") : -1));
        }
    } else if (self.t == V_DICT) {
        jdict *d = self.u.d;
        if (js_eq(name, "get")) {
            jv *v = dict_get(d, want_str(j, arg(ar, 0, NULL), pos, "get"));
            const jv *dflt = arg(ar, 1, "default");
            return v ? *v : dflt ? *dflt : (jv){.t = V_NONE};
        }
        bool items = js_eq(name, "items"), keys = js_eq(name, "keys");
        jlist *l = list_new(j, d->n);
        for (int64_t i = 0; i < d->n; i++) {
            if (items) {
                jlist *pair = list_new(j, 2);
                pair->v[0] = v_str(d->k[i]);
                pair->v[1] = d->v[i];
                l->v[i] = (jv){.t = V_LIST, .u.l = pair};
            } else {
                l->v[i] = keys ? v_str(d->k[i]) : d->v[i];
            }
        }
        return (jv){.t = V_LIST, .u.l = l};
    }
    fail(j, NM_ERR_UNSUPPORTED, pos, "unknown method '%.*s' of '%s'", (int)name.n, name.p, type_name(self));
}

static jv call_func(J *j, js name, const args *ar, int32_t pos) {
    if (js_eq(name, "raise_exception")) {
        js m = ar->n ? to_str(j, ar->v[0]) : js_c("");
        fail(j, NM_ERR_TEMPLATE, pos, "the template raised an error: %.*s", (int)(m.n > 300 ? 300 : m.n), m.p);
    }
    if (js_eq(name, "namespace") || js_eq(name, "dict")) {
        jdict *d = dict_new(j, js_eq(name, "namespace"));
        if (ar->n) fail(j, NM_ERR_UNSUPPORTED, pos, "%.*s() takes keyword arguments here", (int)name.n, name.p);
        for (int k = 0; k < ar->nk; k++) dict_set(j, d, ar->kn[k], ar->kv[k]);
        return (jv){.t = V_DICT, .u.d = d};
    }
    if (js_eq(name, "range")) {
        int64_t a = 0, b, c = 1;
        if (ar->n == 1) b = want_int(j, &ar->v[0], pos, "range");
        else if (ar->n == 2 || ar->n == 3) {
            a = want_int(j, &ar->v[0], pos, "range");
            b = want_int(j, &ar->v[1], pos, "range");
            if (ar->n == 3) c = want_int(j, &ar->v[2], pos, "range");
        } else {
            fail(j, NM_ERR_TEMPLATE, pos, "range() takes 1 to 3 arguments");
        }
        if (c == 0) fail(j, NM_ERR_TEMPLATE, pos, "range() arg 3 must not be zero");
        int64_t n = 0;
        if (c > 0 && b > a) n = (int64_t)(((double)b - a + c - 1) / c);
        if (c < 0 && a > b) n = (int64_t)(((double)a - b - c - 1) / -c);
        if (n > (int64_t)(j->lim.max_mem / sizeof(jv)))
            fail(j, NM_ERR_RANGE, pos, "range() of %lld items: past the memory limit", (long long)n);
        jlist *l = list_new(j, n);
        for (int64_t i = 0; i < n; i++) l->v[i] = v_int(a + i * c);
        return (jv){.t = V_LIST, .u.l = l};
    }
    if (js_eq(name, "strftime_now")) {
        js f = want_str(j, arg(ar, 0, NULL), pos, "strftime_now");
        char fmt[128], buf[256];
        if (f.n >= sizeof fmt) fail(j, NM_ERR_TEMPLATE, pos, "strftime_now: a format too long");
        memcpy(fmt, f.p, f.n);
        fmt[f.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        char *p = jalloc(j, n ? n : 1);
        memcpy(p, buf, n);
        return v_str((js){p, n});
    }
    fail(j, NM_ERR_UNSUPPORTED, pos, "unknown function '%.*s'", (int)name.n, name.p);
}

// ---- filters and tests -------------------------------------------------------------------

static jv filter(J *j, js name, jv v, const args *ar, int32_t pos) {
    if (js_eq(name, "safe")) return v;
    if (js_eq(name, "default") || js_eq(name, "d")) {
        const jv *d = arg(ar, 0, "default_value"), *b = arg(ar, 1, "boolean");
        bool use = v.t == V_UNDEF || (b && truthy(*b) && !truthy(v));
        return use ? (d ? *d : v_str(js_c(""))) : v;
    }
    if (js_eq(name, "length") || js_eq(name, "count")) return v_int(vlen(j, v, pos));
    if (js_eq(name, "tojson")) {
        const jv *in = arg(ar, 0, "indent");
        sb b = {0};
        write_json(j, &b, v, in && in->t != V_NONE ? (int)want_int(j, in, pos, "tojson indent") : -1, 0, pos);
        return v_str(sb_js(&b));
    }
    if (js_eq(name, "items")) {
        if (v.t == V_UNDEF) return (jv){.t = V_LIST, .u.l = list_new(j, 0)};
        if (v.t != V_DICT) fail(j, NM_ERR_TEMPLATE, pos, "items: expected a mapping, got '%s'", type_name(v));
        return call_method(j, v, js_c("items"), ar, pos);
    }
    if (js_eq(name, "list")) {
        if (v.t == V_LIST) return v;
        return (jv){.t = V_LIST, .u.l = iter_items(j, v, pos)};
    }
    if (js_eq(name, "first") || js_eq(name, "last")) {
        const jlist *l = iter_items(j, v, pos);
        if (!l->n) return v_undef(name);
        return l->v[js_eq(name, "first") ? 0 : l->n - 1];
    }
    if (js_eq(name, "reverse")) {
        const jlist *l = iter_items(j, v, pos);
        jlist *r = list_new(j, l->n);
        for (int64_t i = 0; i < l->n; i++) r->v[i] = l->v[l->n - 1 - i];
        if (v.t != V_STR) return (jv){.t = V_LIST, .u.l = r};
        sb b = {0};
        for (int64_t i = 0; i < r->n; i++) sb_put(j, &b, r->v[i].u.s.p, r->v[i].u.s.n);
        return v_str(sb_js(&b));
    }
    if (js_eq(name, "join")) {
        const jv *d = arg(ar, 0, "d");
        js sep = d ? to_str(j, *d) : js_c("");
        const jlist *l = iter_items(j, v, pos);
        sb b = {0};
        for (int64_t i = 0; i < l->n; i++) {
            if (i) sb_put(j, &b, sep.p, sep.n);
            write_val(j, &b, l->v[i], false, 0);
        }
        return v_str(sb_js(&b));
    }
    if (js_eq(name, "int")) {
        if (v.t == V_INT) return v;
        if (v.t == V_BOOL || v.t == V_FLOAT) return v_int(inum(v));
        if (v.t == V_STR) {
            char t[32];
            js s = strip(v.u.s, NULL, true, true);
            if (s.n && s.n < sizeof t) {
                memcpy(t, s.p, s.n);
                t[s.n] = 0;
                char *e;
                long long x = strtoll(t, &e, 10);
                if (!*e) return v_int(x);
            }
        }
        const jv *d = arg(ar, 0, "default");
        return d ? *d : v_int(0);
    }
    if (js_eq(name, "float")) {
        if (is_num(v)) return (jv){.t = V_FLOAT, .u.f = num(v)};
        const jv *d = arg(ar, 0, "default");
        return d ? *d : (jv){.t = V_FLOAT, .u.f = 0};
    }
    if (js_eq(name, "abs")) {
        if (v.t == V_FLOAT) return (jv){.t = V_FLOAT, .u.f = fabs(v.u.f)};
        if (v.t == V_INT || v.t == V_BOOL) return v_int(inum(v) < 0 ? -inum(v) : inum(v));
        fail(j, NM_ERR_TEMPLATE, pos, "bad operand type for abs(): '%s'", type_name(v));
    }
    // the string filters
    js s = to_str(j, v);
    if (js_eq(name, "string")) return v_str(s);
    if (js_eq(name, "trim")) return v_str(strip(s, arg(ar, 0, "chars"), true, true));
    if (js_eq(name, "upper")) return v_str(change_case(j, s, 1));
    if (js_eq(name, "lower")) return v_str(change_case(j, s, 0));
    if (js_eq(name, "capitalize")) return v_str(change_case(j, s, 2));
    if (js_eq(name, "title")) return v_str(change_case(j, s, 3));
    if (js_eq(name, "replace")) {
        const jv *o = arg(ar, 0, "old"), *nw = arg(ar, 1, "new"), *c = arg(ar, 2, "count");
        return v_str(replace(j, s, o ? to_str(j, *o) : js_c(""), nw ? to_str(j, *nw) : js_c(""),
                             c ? want_int(j, c, pos, "replace") : -1));
    }
    fail(j, NM_ERR_UNSUPPORTED, pos, "unknown filter '%.*s'", (int)name.n, name.p);
}

static bool test(J *j, js name, jv v, const args *ar, int32_t pos) {
    if (js_eq(name, "defined")) return v.t != V_UNDEF;
    if (js_eq(name, "undefined")) return v.t == V_UNDEF;
    if (js_eq(name, "none")) return v.t == V_NONE;
    if (js_eq(name, "string")) return v.t == V_STR;
    if (js_eq(name, "number")) return is_num(v);
    if (js_eq(name, "integer")) return v.t == V_INT;
    if (js_eq(name, "float")) return v.t == V_FLOAT;
    if (js_eq(name, "boolean")) return v.t == V_BOOL;
    if (js_eq(name, "true")) return v.t == V_BOOL && v.u.b;
    if (js_eq(name, "false")) return v.t == V_BOOL && !v.u.b;
    if (js_eq(name, "mapping")) return v.t == V_DICT && !v.u.d->ns;
    if (js_eq(name, "iterable")) return v.t == V_UNDEF || v.t == V_STR || v.t == V_LIST || v.t == V_DICT;
    if (js_eq(name, "sequence")) return v.t == V_UNDEF || v.t == V_STR || v.t == V_LIST || v.t == V_DICT;
    if (js_eq(name, "lower") || js_eq(name, "upper")) {
        if (v.t != V_STR) return false;
        js s = v.u.s;
        bool cased = false;
        for (size_t i = 0; i < s.n; i++) {
            char c = s.p[i];
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) cased = true;
            if (js_eq(name, "lower") ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
        }
        return cased;
    }
    if (js_eq(name, "odd") || js_eq(name, "even")) {
        int64_t i = want_int(j, &v, pos, "odd/even");
        return ((i % 2 != 0) == js_eq(name, "odd"));
    }
    const jv *o = arg(ar, 0, NULL);
    if (!o) fail(j, NM_ERR_TEMPLATE, pos, "the test '%.*s' needs an argument", (int)name.n, name.p);
    if (js_eq(name, "divisibleby")) {
        int64_t d = want_int(j, o, pos, "divisibleby");
        if (d == 0) fail(j, NM_ERR_TEMPLATE, pos, "divisibleby 0");
        return want_int(j, &v, pos, "divisibleby") % d == 0;
    }
    if (js_eq(name, "eq") || js_eq(name, "equalto")) return veq(j, v, *o, 0);
    if (js_eq(name, "ne")) return !veq(j, v, *o, 0);
    if (js_eq(name, "sameas")) {
        if (v.t != o->t) return false;
        if (v.t == V_NONE || v.t == V_UNDEF) return true;
        if (v.t == V_BOOL) return v.u.b == o->u.b;
        return veq(j, v, *o, 0) && (v.t != V_LIST || v.u.l == o->u.l) && (v.t != V_DICT || v.u.d == o->u.d);
    }
    if (js_eq(name, "in")) {
        const jlist *l = iter_items(j, *o, pos);
        if (o->t == V_STR) return v.t == V_STR && (v.u.s.n == 0 || memmem(o->u.s.p, o->u.s.n, v.u.s.p, v.u.s.n));
        for (int64_t i = 0; i < l->n; i++)
            if (veq(j, v, l->v[i], 0)) return true;
        return false;
    }
    fail(j, NM_ERR_UNSUPPORTED, pos, "unknown test '%.*s'", (int)name.n, name.p);
}

// ---- evaluation: expressions -------------------------------------------------------------

static jv lookup(J *j, js name) {
    for (frame *f = j->fr; f; f = f->up)
        for (var *v = f->vars; v; v = v->next)
            if (js_same(v->name, name)) return v->v;
    jv *g = j->globals ? dict_get(j->globals, name) : NULL;
    return g ? *g : v_undef(name);
}

static void assign(J *j, js name, jv v) {
    for (var *x = j->fr->vars; x; x = x->next)
        if (js_same(x->name, name)) {
            x->v = v;
            return;
        }
    var *x = jalloc(j, sizeof *x);
    x->name = name;
    x->v = v;
    x->next = j->fr->vars;
    j->fr->vars = x;
}

static jv arith(J *j, int op, jv a, jv b, int32_t pos) {
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.t == V_UNDEF) undefined_err(j, pos, a);
    if (b.t == V_UNDEF) undefined_err(j, pos, b);
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        char *p = jalloc_n(j, a.u.s.n + b.u.s.n + 1, 1);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        return v_str((js){p, a.u.s.n + b.u.s.n});
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        jlist *l = list_new(j, a.u.l->n + b.u.l->n);
        for (int64_t i = 0; i < a.u.l->n; i++) l->v[i] = a.u.l->v[i];
        for (int64_t i = 0; i < b.u.l->n; i++) l->v[a.u.l->n + i] = b.u.l->v[i];
        return (jv){.t = V_LIST, .u.l = l};
    }
    if (op == OP_MUL && ((a.t == V_STR && (b.t == V_INT || b.t == V_BOOL)) || (b.t == V_STR && (a.t == V_INT || a.t == V_BOOL)))) {
        js s = a.t == V_STR ? a.u.s : b.u.s;
        int64_t k = a.t == V_STR ? inum(b) : inum(a);
        sb r = {0};
        if (k > 0 && s.n && (uint64_t)k > j->lim.max_out / s.n) fail(j, NM_ERR_RANGE, pos, "a string too long");
        for (int64_t i = 0; i < k; i++) sb_put(j, &r, s.p, s.n);
        return v_str(sb_js(&r));
    }
    if (!is_num(a) || !is_num(b))
        fail(j, NM_ERR_TEMPLATE, pos, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a),
             type_name(b));
    bool ints = a.t != V_FLOAT && b.t != V_FLOAT;
    int64_t x = inum(a), y = inum(b), r;
    double f = num(a), g = num(b);
    switch (op) {
    case OP_ADD:
        if (!ints) return (jv){.t = V_FLOAT, .u.f = f + g};
        if (__builtin_add_overflow(x, y, &r)) fail(j, NM_ERR_RANGE, pos, "integer overflow");
        return v_int(r);
    case OP_SUB:
        if (!ints) return (jv){.t = V_FLOAT, .u.f = f - g};
        if (__builtin_sub_overflow(x, y, &r)) fail(j, NM_ERR_RANGE, pos, "integer overflow");
        return v_int(r);
    case OP_MUL:
        if (!ints) return (jv){.t = V_FLOAT, .u.f = f * g};
        if (__builtin_mul_overflow(x, y, &r)) fail(j, NM_ERR_RANGE, pos, "integer overflow");
        return v_int(r);
    case OP_DIV:
        if (g == 0) fail(j, NM_ERR_TEMPLATE, pos, "division by zero");
        return (jv){.t = V_FLOAT, .u.f = f / g};
    case OP_FDIV:
    case OP_MOD:
        if (g == 0) fail(j, NM_ERR_TEMPLATE, pos, "integer division or modulo by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) fail(j, NM_ERR_RANGE, pos, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) q--, m += y; // Python floors
            return v_int(op == OP_FDIV ? q : m);
        }
        if (op == OP_FDIV) return (jv){.t = V_FLOAT, .u.f = floor(f / g)};
        {
            double m = fmod(f, g);
            if (m != 0 && ((m < 0) != (g < 0))) m += g;
            return (jv){.t = V_FLOAT, .u.f = m};
        }
    case OP_POW:
        if (ints && y >= 0) {
            int64_t acc = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(acc, x, &acc)) fail(j, NM_ERR_RANGE, pos, "integer overflow");
                if (acc == 0 || acc == 1) break;
                step(j, pos);
            }
            return v_int(acc);
        }
        return (jv){.t = V_FLOAT, .u.f = pow(f, g)};
    default: break;
    }
    fail(j, NM_ERR_TEMPLATE, pos, "bad operator");
}

static bool contains(J *j, jv item, jv seq, int32_t pos) {
    switch (seq.t) {
    case V_STR:
        if (item.t != V_STR)
            fail(j, NM_ERR_TEMPLATE, pos, "'in <string>' requires string as left operand, not %s", type_name(item));
        return item.u.s.n == 0 || (seq.u.s.n && memmem(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n));
    case V_DICT: return item.t == V_STR && dict_get(seq.u.d, item.u.s);
    case V_LIST:
        for (int64_t i = 0; i < seq.u.l->n; i++)
            if (veq(j, item, seq.u.l->v[i], 0)) return true;
        return false;
    case V_UNDEF: return false;
    default: fail(j, NM_ERR_TEMPLATE, pos, "argument of type '%s' is not iterable", type_name(seq));
    }
}

static jv eval(J *j, node *x) {
    step(j, x->pos);
    switch (x->k) {
    case E_LIT: return x->v;
    case E_NAME: return lookup(j, x->s);
    case E_ATTR: return get_attr(j, eval(j, x->a), x->s, x->pos);
    case E_ITEM: {
        jv o = eval(j, x->a);
        return get_item(j, o, eval(j, x->b), x->pos);
    }
    case E_SLICE: {
        jv o = eval(j, x->a), none = {.t = V_NONE};
        jv a = x->b ? eval(j, x->b) : none, b = x->c ? eval(j, x->c) : none, c = x->d ? eval(j, x->d) : none;
        return get_slice(j, o, a, b, c, x->pos);
    }
    case E_CALL: {
        args ar;
        if (x->a->k == E_NAME) {
            eval_args(j, x->b, &ar, x->pos);
            return call_func(j, x->a->s, &ar, x->pos);
        }
        jv self = eval(j, x->a->a);
        if (self.t == V_UNDEF) undefined_err(j, x->pos, self);
        eval_args(j, x->b, &ar, x->pos);
        return call_method(j, self, x->a->s, &ar, x->pos);
    }
    case E_FILTER: {
        jv v = eval(j, x->a);
        args ar;
        eval_args(j, x->b, &ar, x->pos);
        return filter(j, x->s, v, &ar, x->pos);
    }
    case E_TEST: {
        jv v = eval(j, x->a);
        args ar;
        eval_args(j, x->b, &ar, x->pos);
        return v_bool(test(j, x->s, v, &ar, x->pos) != x->neg);
    }
    case E_BIN: {
        jv a = eval(j, x->a), b = eval(j, x->b);
        switch (x->op) {
        case OP_EQ: return v_bool(veq(j, a, b, 0));
        case OP_NE: return v_bool(!veq(j, a, b, 0));
        case OP_LT: return v_bool(vcmp(j, a, b, x->pos, "<") < 0);
        case OP_GT: return v_bool(vcmp(j, a, b, x->pos, ">") > 0);
        case OP_LE: return v_bool(vcmp(j, a, b, x->pos, "<=") <= 0);
        case OP_GE: return v_bool(vcmp(j, a, b, x->pos, ">=") >= 0);
        case OP_IN: return v_bool(contains(j, a, b, x->pos));
        case OP_NOTIN: return v_bool(!contains(j, a, b, x->pos));
        case OP_CAT: {
            js s = to_str(j, a), t = to_str(j, b);
            char *p = jalloc_n(j, s.n + t.n + 1, 1);
            memcpy(p, s.p, s.n);
            memcpy(p + s.n, t.p, t.n);
            return v_str((js){p, s.n + t.n});
        }
        default: return arith(j, x->op, a, b, x->pos);
        }
    }
    case E_NOT: return v_bool(!truthy(eval(j, x->a)));
    case E_NEG: {
        jv a = eval(j, x->a);
        if (a.t == V_FLOAT) return (jv){.t = V_FLOAT, .u.f = -a.u.f};
        if (a.t == V_INT || a.t == V_BOOL) {
            if (inum(a) == INT64_MIN) fail(j, NM_ERR_RANGE, x->pos, "integer overflow");
            return v_int(-inum(a));
        }
        if (a.t == V_UNDEF) undefined_err(j, x->pos, a);
        fail(j, NM_ERR_TEMPLATE, x->pos, "bad operand type for unary -: '%s'", type_name(a));
    }
    case E_AND: { // Python's and/or give an operand, not a bool
        jv a = eval(j, x->a);
        return truthy(a) ? eval(j, x->b) : a;
    }
    case E_OR: {
        jv a = eval(j, x->a);
        return truthy(a) ? a : eval(j, x->b);
    }
    case E_COND:
        if (truthy(eval(j, x->b))) return eval(j, x->a);
        return x->c ? eval(j, x->c) : v_undef(js_c("else"));
    case E_LIST: {
        int64_t n = 0;
        for (node *e = x->a; e; e = e->next) n++;
        jlist *l = list_new(j, n);
        n = 0;
        for (node *e = x->a; e; e = e->next) l->v[n++] = eval(j, e);
        return (jv){.t = V_LIST, .u.l = l};
    }
    case E_DICT: {
        jdict *d = dict_new(j, false);
        for (node *e = x->a; e; e = e->next) {
            jv k = eval(j, e->a);
            if (k.t != V_STR) fail(j, NM_ERR_UNSUPPORTED, e->pos, "dict keys other than strings are not supported");
            dict_set(j, d, k.u.s, eval(j, e->b));
        }
        return (jv){.t = V_DICT, .u.d = d};
    }
    default: break;
    }
    fail(j, NM_ERR_UNSUPPORTED, x->pos, "cannot evaluate this expression");
}

// ---- evaluation: statements --------------------------------------------------------------

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static int exec_body(J *j, node *x);

static void bind_target(J *j, node *x, jv item) {
    if (!x->s2.n) {
        assign(j, x->s, item);
        return;
    }
    if (item.t != V_LIST || item.u.l->n != 2)
        fail(j, NM_ERR_TEMPLATE, x->pos, "cannot unpack a '%s' into %.*s, %.*s", type_name(item), (int)x->s.n, x->s.p,
             (int)x->s2.n, x->s2.p);
    assign(j, x->s, item.u.l->v[0]);
    assign(j, x->s2, item.u.l->v[1]);
}

static void exec_for(J *j, node *x) {
    // What the loop allocates is garbage after it unless a namespace kept some of it.
    mark m = jmark(j);
    int64_t ns_writes = j->ns_writes;
    const jlist *items = iter_items(j, eval(j, x->a), x->pos);
    frame f = {j->fr, NULL};
    j->fr = &f;
    if (x->d) { // the loop filter: the loop (and loop.length) sees what passes
        jlist *kept = list_new(j, items->n);
        int64_t n = 0;
        for (int64_t i = 0; i < items->n; i++) {
            bind_target(j, x, items->v[i]);
            if (truthy(eval(j, x->d))) kept->v[n++] = items->v[i];
        }
        kept->n = n;
        items = kept;
    }
    jloop *lp = jalloc(j, sizeof *lp);
    lp->n = items->n;
    lp->items = items;
    for (int64_t i = 0; i < items->n; i++) {
        step(j, x->pos);
        lp->i = i;
        bind_target(j, x, items->v[i]);
        assign(j, js_c("loop"), (jv){.t = V_LOOP, .u.loop = lp});
        if (exec_body(j, x->b) == FLOW_BREAK) break;
    }
    j->fr = f.up;
    bool empty = items->n == 0;
    if (j->ns_writes == ns_writes) jrelease(j, m);
    if (empty && x->c) exec_body(j, x->c);
}

static int exec_body(J *j, node *x) {
    enter(j, x ? x->pos : -1);
    for (; x; x = x->next) {
        step(j, x->pos);
        switch (x->k) {
        case S_TEXT: out_put(j, x->s.p, x->s.n); break;
        case S_OUT: {
            mark m = jmark(j);
            jv v = eval(j, x->a);
            if (v.t == V_STR) {
                out_put(j, v.u.s.p, v.u.s.n);
            } else {
                sb b = {0};
                write_val(j, &b, v, false, 0);
                out_put(j, b.p ? b.p : "", b.n);
            }
            jrelease(j, m); // what the expression built is garbage now
            break;
        }
        case S_IF: {
            int fl = exec_body(j, truthy(eval(j, x->a)) ? x->b : x->c);
            if (fl != FLOW_NEXT) {
                leave(j);
                return fl;
            }
            break;
        }
        case S_FOR: exec_for(j, x); break;
        case S_SET: {
            jv v;
            if (x->c) { // {% set x %}body{% endset %}
                size_t on = j->on;
                exec_body(j, x->c);
                char *p = jalloc_n(j, j->on - on + 1, 1);
                memcpy(p, j->out + on, j->on - on);
                v = v_str((js){p, j->on - on});
                j->on = on;
            } else {
                v = eval(j, x->b);
            }
            if (x->a->k == E_NAME) {
                assign(j, x->a->s, v);
            } else {
                jv ns = lookup(j, x->a->a->s);
                if (ns.t != V_DICT || !ns.u.d->ns)
                    fail(j, NM_ERR_TEMPLATE, x->pos, "cannot assign attribute on non-namespace object");
                dict_set(j, ns.u.d, x->a->s, v);
                j->ns_writes++;
            }
            break;
        }
        case S_BREAK: leave(j); return FLOW_BREAK;
        case S_CONTINUE: leave(j); return FLOW_CONTINUE;
        case S_BLOCK: {
            int fl = exec_body(j, x->b);
            if (fl != FLOW_NEXT) {
                leave(j);
                return fl;
            }
            break;
        }
        default: fail(j, NM_ERR_UNSUPPORTED, x->pos, "cannot run this statement");
        }
    }
    leave(j);
    return FLOW_NEXT;
}

// ---- the context -------------------------------------------------------------------------

static jv from_json(J *j, const cJSON *c, int depth) {
    if (depth > j->lim.max_depth) fail(j, NM_ERR_RANGE, -1, "the context nests deeper than %d", (int)j->lim.max_depth);
    if (cJSON_IsNull(c)) return (jv){.t = V_NONE};
    if (cJSON_IsBool(c)) return v_bool(cJSON_IsTrue(c));
    if (cJSON_IsNumber(c)) {
        double d = c->valuedouble;
        if (d == floor(d) && fabs(d) < 9.007199254740992e15) return v_int((int64_t)d);
        return (jv){.t = V_FLOAT, .u.f = d};
    }
    if (cJSON_IsString(c)) {
        const char *s = c->valuestring ? c->valuestring : "";
        return v_str((js){s, strlen(s)});
    }
    if (cJSON_IsArray(c)) {
        jlist *l = list_new(j, cJSON_GetArraySize(c));
        int64_t i = 0;
        for (const cJSON *e = c->child; e && i < l->n; e = e->next) l->v[i++] = from_json(j, e, depth + 1);
        return (jv){.t = V_LIST, .u.l = l};
    }
    if (cJSON_IsObject(c)) {
        jdict *d = dict_new(j, false);
        for (const cJSON *e = c->child; e; e = e->next) {
            const char *k = e->string ? e->string : "";
            dict_set(j, d, (js){k, strlen(k)}, from_json(j, e, depth + 1));
        }
        return (jv){.t = V_DICT, .u.d = d};
    }
    return (jv){.t = V_NONE};
}

// ---- entry -------------------------------------------------------------------------------

static void free_all(J *j) {
    while (j->top) {
        chunk *c = j->top;
        j->top = c->prev;
        free(c);
    }
    free(j->out);
}

nm_status nm_jinja_render(const char *src, size_t len, const cJSON *ctx, const nm_jinja_limits *lim, char **out,
                          size_t *out_len, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!out || (!src && len) || (ctx && !cJSON_IsObject(ctx))) {
        if (err && err_size) snprintf(err, err_size, "nm_jinja_render: bad arguments");
        return NM_ERR_INVALID_ARG;
    }
    J *j = calloc(1, sizeof *j);
    if (!j) return NM_ERR_NOMEM;
    j->err = err;
    j->err_size = err_size;
    j->lim = lim ? *lim : nm_jinja_default_limits();
    if (setjmp(j->jb)) {
        nm_status st = j->st;
        free_all(j);
        free(j);
        return st;
    }
    if (len > j->lim.max_src) fail(j, NM_ERR_RANGE, -1, "a template of %zu bytes (at most %zu)", len, j->lim.max_src);
    // Jinja2 reads \r\n and \r as \n, and drops one newline at the end (keep_trailing_newline=False).
    char *s = jalloc(j, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    j->src = s;
    j->n = n;
    lex(j);
    j->p = 0;
    node *body = parse_body(j, NULL, NULL, 0, "");
    j->globals = ctx ? from_json(j, ctx, 0).u.d : dict_new(j, false);
    frame root = {NULL, NULL};
    j->fr = &root;
    j->depth = 0;
    exec_body(j, body);
    out_put(j, "", 0);
    j->out[j->on] = 0;
    *out = j->out;
    if (out_len) *out_len = j->on;
    j->out = NULL;
    free_all(j);
    free(j);
    return NM_OK;
}
