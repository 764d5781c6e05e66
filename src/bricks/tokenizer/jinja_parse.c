// Jinja2 subset interpreter, its front: the lexer cuts the template into text
// and tag tokens, applying whitespace control as Jinja2's lexer does with
// trim_blocks and lstrip_blocks; a recursive-descent parser builds a syntax
// tree with Jinja2's precedence (jinja2/parser.py). Also the arena and the
// error jump the evaluator (jinja.c) shares. Overview: jinja.c.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/tokenizer/jinja_impl.h"
#include "core/fail.h"

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
_Noreturn void jj_fail(J *j, nm_status st, int32_t pos, const char *fmt, ...) {
    j->st = st;
    if (j->err && j->err_size) {
        char at[64];
        where(j, pos, at, sizeof at);
        va_list ap;
        va_start(ap, fmt);
        nm_vfail(st, j->err, j->err_size, at, fmt, ap);
        va_end(ap);
    }
    longjmp(j->jb, 1);
}

void *jj_alloc(J *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    chunk *c = j->top;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (cap > j->lim.max_mem || j->mem + cap + sizeof(chunk) > j->lim.max_mem)
            jj_fail(j, NM_ERR_RANGE, -1, "the template needs more than %zu bytes of memory", j->lim.max_mem);
        c = malloc(sizeof(chunk) + cap);
        if (!c) jj_fail(j, NM_ERR_NOMEM, -1, "out of memory");
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
void *jj_alloc_n(J *j, size_t n, size_t sz) {
    if (sz && n > j->lim.max_mem / sz)
        jj_fail(j, NM_ERR_RANGE, -1, "the template needs more than %zu bytes of memory", j->lim.max_mem);
    return jj_alloc(j, (n && sz) ? n * sz : 1);
}

void jj_sb_put(J *j, sb *b, const char *s, size_t n) {
    if (n > b->cap - b->n) {
        if (n > j->lim.max_mem) jj_fail(j, NM_ERR_RANGE, -1, "a string past %zu bytes", j->lim.max_mem);
        size_t cap = 2 * (b->n + n) < 64 ? 64 : 2 * (b->n + n);
        char *q = jj_alloc(j, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jj_put_utf8(J *j, sb *b, uint32_t cp) {
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
    jj_sb_put(j, b, u, n);
}

// ---- lexer -------------------------------------------------------------------------------

static tok *push_tok(J *j, uint8_t t, size_t pos) {
    if (j->ntok == j->captok) {
        if (j->captok > (1 << 28)) jj_fail(j, NM_ERR_RANGE, (int32_t)pos, "too many tokens");
        int32_t cap = j->captok ? 2 * j->captok : 256;
        tok *q = jj_alloc_n(j, (size_t)cap, sizeof *q);
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
        if (i >= j->n) jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "unterminated string");
        char c = s[i];
        if (c == q) break;
        if (c != '\\') {
            jj_sb_put(j, &b, &c, 1);
            i++;
            continue;
        }
        if (i + 1 >= j->n) jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "unterminated string");
        char e = s[i + 1];
        const char *simple = strchr("\\'\"abfnrtv\n", e);
        if (e && simple) {
            static const char from[] = "\\'\"abfnrtv", to[] = "\\'\"\a\b\f\n\r\t\v";
            if (e != '\n') jj_sb_put(j, &b, &to[strchr(from, e) - from], 1); // \<newline>: a line continuation
            i += 2;
        } else if (e >= '0' && e <= '7') {
            uint32_t v = 0;
            size_t k = i + 1;
            for (int d = 0; d < 3 && k < j->n && s[k] >= '0' && s[k] <= '7'; d++, k++) v = v * 8 + (uint32_t)(s[k] - '0');
            jj_put_utf8(j, &b, v);
            i = k;
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int w = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int d = 0; d < w; d++) {
                int h = i + 2 + (size_t)d < j->n ? hexval(s[i + 2 + d]) : -1;
                if (h < 0) jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)i, "a truncated \\%c escape", e);
                v = v * 16 + (uint32_t)h;
            }
            jj_put_utf8(j, &b, v);
            i += 2 + (size_t)w;
        } else { // unknown escapes stay as written
            jj_sb_put(j, &b, s + i, 2);
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
        if (p >= n) jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)t, "unterminated '%s'", kind == '{' ? "{{" : "{%");
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
                        jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "an integer too large");
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
                    jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)p, "unexpected character '%c' in a tag",
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

void jj_lex(J *j) {
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
            if (e + 1 >= n) jj_fail(j, NM_ERR_UNSUPPORTED, (int32_t)t, "unterminated comment '{#'");
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

static node *mk(J *j, uint8_t k, int32_t pos) {
    node *x = jj_alloc(j, sizeof *x);
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
    jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "expected %s, found %s", wanted, tok_desc(j, t, b, sizeof b));
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

int jj_find_name(const char *const *list, js s) {
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
            jj_sb_put(j, &b, cur(j)->s.p, cur(j)->s.n);
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
            else if (!parts[0]) jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "an empty subscript");
            else y->b = parts[0];
            x = y;
        } else if (t_op(t, "(")) {
            node *y = mk(j, E_CALL, t->pos);
            y->a = x;
            if (x->k == E_NAME && jj_find_name(FUNCS, x->s) < 0)
                jj_fail(j, NM_ERR_UNSUPPORTED, x->pos, "unknown function '%.*s'", (int)x->s.n, x->s.p);
            if (x->k != E_NAME && x->k != E_ATTR)
                jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "only functions and methods can be called");
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
            if (jj_find_name(FILTERS, y->s) < 0)
                jj_fail(j, NM_ERR_UNSUPPORTED, y->pos, "unknown filter '%.*s'", (int)y->s.n, y->s.p);
            y->a = x;
            if (t_op(cur(j), "(")) y->b = parse_args(j);
            x = y;
        } else if (t_name(t, "is")) {
            j->p++;
            node *y = mk(j, E_TEST, t->pos);
            if (t_name(cur(j), "not")) y->neg = true, j->p++;
            y->pos = cur(j)->pos;
            y->s = expect_name(j);
            if (jj_find_name(TESTS, y->s) < 0)
                jj_fail(j, NM_ERR_UNSUPPORTED, y->pos, "unknown test '%.*s'", (int)y->s.n, y->s.p);
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
    if (cmp_op(j) >= 0) jj_fail(j, NM_ERR_UNSUPPORTED, cur(j)->pos, "chained comparisons are not supported");
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
            cur_if->b = jj_parse_body(j, ends, &w, bpos, "if");
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
                cur_if->c = jj_parse_body(j, endif, &w, bpos, "if");
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
        if (t_name(cur(j), "recursive"))
            jj_fail(j, NM_ERR_UNSUPPORTED, cur(j)->pos, "recursive loops are not supported");
        expect_bend(j);
        static const char *const ends[] = {"else", "endfor", NULL};
        int w;
        j->loops++;
        x->b = jj_parse_body(j, ends, &w, bpos, "for");
        j->loops--;
        j->p++;
        expect_bend(j);
        if (w == 0) {
            static const char *const endfor[] = {"endfor", NULL};
            x->c = jj_parse_body(j, endfor, &w, bpos, "for");
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
            jj_fail(j, NM_ERR_UNSUPPORTED, cur(j)->pos, "'set' of several names is not supported");
        }
        x->a = tg;
        if (cur(j)->t == T_BEND) { // {% set x %}...{% endset %}
            if (tg->k != E_NAME) jj_fail(j, NM_ERR_UNSUPPORTED, tg->pos, "a block set of an attribute");
            j->p++;
            static const char *const ends[] = {"endset", NULL};
            int w;
            x->c = jj_parse_body(j, ends, &w, bpos, "set");
            j->p++;
        } else {
            expect_op(j, "=");
            x->b = parse_expr(j);
        }
        expect_bend(j);
    } else if (js_eq(nm, "break") || js_eq(nm, "continue")) {
        if (!j->loops) jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "'%.*s' outside a loop", (int)nm.n, nm.p);
        x = mk(j, js_eq(nm, "break") ? S_BREAK : S_CONTINUE, t->pos);
        expect_bend(j);
    } else if (js_eq(nm, "generation")) { // transformers' marker of the assistant's text: renders its body
        x = mk(j, S_BLOCK, t->pos);
        expect_bend(j);
        static const char *const ends[] = {"endgeneration", NULL};
        int w;
        x->b = jj_parse_body(j, ends, &w, bpos, "generation");
        j->p++;
        expect_bend(j);
    } else {
        static const char *const jinja[] = {"macro", "call", "filter", "include", "import", "from", "extends",
                                            "block", "raw", "with", "autoescape", "do", NULL};
        if (jj_find_name(jinja, nm) >= 0)
            jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "the statement '%.*s' is not supported", (int)nm.n, nm.p);
        jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "unknown statement '%.*s'", (int)(nm.n > 40 ? 40 : nm.n), nm.p);
    }
    return x;
}

node *jj_parse_body(J *j, const char *const *ends, int *which, int32_t open_pos, const char *open) {
    enter(j, cur(j)->pos);
    node *head = NULL, **tail = &head;
    for (;;) {
        tok *t = cur(j);
        node *x;
        if (t->t == T_EOF) {
            if (ends && ends[0])
                jj_fail(j, NM_ERR_UNSUPPORTED, open_pos, "{%% %s %%} is never closed (no {%% end%s %%})", open, open);
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
                int w = jj_find_name(ends, nm->s);
                if (w >= 0) {
                    *which = w;
                    leave(j);
                    return head;
                }
            }
            static const char *const closers[] = {"elif", "else", "endif", "endfor", "endset", "endgeneration",
                                                  NULL};
            if (nm->t == T_NAME && jj_find_name(closers, nm->s) >= 0)
                jj_fail(j, NM_ERR_UNSUPPORTED, nm->pos, "unexpected '%.*s'", (int)nm->s.n, nm->s.p);
            x = parse_stmt(j, t->pos);
        } else {
            char b[64];
            jj_fail(j, NM_ERR_UNSUPPORTED, t->pos, "unexpected %s", tok_desc(j, t, b, sizeof b));
        }
        *tail = x;
        tail = &x->next;
    }
    leave(j);
    return head;
}
