// Jinja2 subset interpreter (docs/jinja.md lists the subset): the evaluator
// and nm_jinja_render.
//
// Three passes over one arena: the lexer cuts the template into text and
// tag tokens and a recursive-descent parser builds a syntax tree
// (jinja_parse.c); the evaluator walks it (here). Every allocation comes
// from the arena (capped), except the output buffer (capped); an error
// anywhere longjmps back to nm_jinja_render, which frees both, so no path
// leaks. Recursion is bounded by max_depth (the parser's nesting and the
// depth of values), loops by max_steps.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/tokenizer/jinja_impl.h"

nm_jinja_limits nm_jinja_default_limits(void) {
    return (nm_jinja_limits){.max_src = 1u << 20, .max_mem = 64u << 20, .max_out = 16u << 20,
                             .max_steps = 5000000, .max_depth = 64};
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
        jj_fail(j, NM_ERR_RANGE, pos, "the template ran past %lld steps (a runaway loop?)",
                (long long)j->lim.max_steps);
}

static void sb_puts(J *j, sb *b, const char *s) { jj_sb_put(j, b, s, strlen(s)); }

static void out_put(J *j, const char *s, size_t n) {
    if (n > j->lim.max_out - j->on)
        jj_fail(j, NM_ERR_RANGE, -1, "the output passed %zu bytes", j->lim.max_out);
    if (j->on + n + 1 > j->ocap) {
        size_t cap = j->ocap ? j->ocap : 256;
        while (cap < j->on + n + 1) cap *= 2;
        char *q = realloc(j->out, cap);
        if (!q) jj_fail(j, NM_ERR_NOMEM, -1, "out of memory");
        j->out = q;
        j->ocap = cap;
    }
    memcpy(j->out + j->on, s, n);
    j->on += n;
}

static bool js_same(js a, js b) { return a.n == b.n && (a.n == 0 || !memcmp(a.p, b.p, a.n)); }
static js js_c(const char *s) { return (js){s, strlen(s)}; }

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
    jj_fail(j, NM_ERR_TEMPLATE, pos, "'%.*s' is undefined", (int)(v.u.s.n > 60 ? 60 : v.u.s.n), v.u.s.p);
}

static jv *dict_get(const jdict *d, js k) {
    for (int64_t i = 0; i < d->n; i++)
        if (js_same(d->k[i], k)) return &d->v[i];
    return NULL;
}

static jdict *dict_new(J *j, bool ns) {
    jdict *d = jj_alloc(j, sizeof *d);
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
        js *nk = jj_alloc_n(j, (size_t)cap, sizeof *nk);
        jv *nv = jj_alloc_n(j, (size_t)cap, sizeof *nv);
        if (d->n) memcpy(nk, d->k, (size_t)d->n * sizeof *nk), memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static jlist *list_new(J *j, int64_t n) {
    jlist *l = jj_alloc(j, sizeof *l);
    l->n = n;
    l->v = jj_alloc_n(j, (size_t)(n ? n : 1), sizeof(jv));
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
    jj_sb_put(j, b, &q, 1);
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
    jj_sb_put(j, b, &q, 1);
}

// Python's str() (repr: false) or repr() of a value.
static void write_val(J *j, sb *b, jv v, bool repr, int depth) {
    if (depth > j->lim.max_depth) jj_fail(j, NM_ERR_RANGE, -1, "a value nests deeper than %d", (int)j->lim.max_depth);
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
        else jj_sb_put(j, b, v.u.s.p, v.u.s.n);
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
    if (level > j->lim.max_depth) jj_fail(j, NM_ERR_RANGE, pos, "a value nests deeper than %d", (int)j->lim.max_depth);
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
    default: jj_fail(j, NM_ERR_TEMPLATE, pos, "Object of type %s is not JSON serializable", type_name(v));
    }
}

static bool veq(J *j, jv a, jv b, int depth) {
    if (depth > j->lim.max_depth) jj_fail(j, NM_ERR_RANGE, -1, "a value nests deeper than %d", (int)j->lim.max_depth);
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
    jj_fail(j, NM_ERR_TEMPLATE, pos, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a),
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
    default: jj_fail(j, NM_ERR_TEMPLATE, pos, "'%s' object is not iterable", type_name(v));
    }
}

static int64_t vlen(J *j, jv v, int32_t pos) {
    switch (v.t) {
    case V_UNDEF: return 0;
    case V_STR: return u8count(v.u.s);
    case V_LIST: return v.u.l->n;
    case V_DICT: return v.u.d->n;
    default: jj_fail(j, NM_ERR_TEMPLATE, pos, "object of type '%s' has no len()", type_name(v));
    }
}

// ---- attributes, items, slices -----------------------------------------------------------

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith",
                                          "upper", "lower", "replace", "title", "capitalize", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static jv method(J *j, jv self, js name) {
    jv *s = jj_alloc(j, sizeof *s);
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
        if (!o.u.d->ns && jj_find_name(DICT_METHODS, name) >= 0) return method(j, o, name);
        jv *v = dict_get(o.u.d, name);
        return v ? *v : v_undef(name);
    }
    case V_STR: return jj_find_name(STR_METHODS, name) >= 0 ? method(j, o, name) : v_undef(name);
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
    if (v.t != V_INT && v.t != V_BOOL) jj_fail(j, NM_ERR_TEMPLATE, pos, "slice indices must be integers");
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
    if (o.t != V_LIST && o.t != V_STR)
        jj_fail(j, NM_ERR_TEMPLATE, pos, "'%s' object is not subscriptable", type_name(o));
    const jlist *items = iter_items(j, o, pos);
    int64_t len = items->n, stp = 1;
    if (c.t != V_NONE && c.t != V_UNDEF) {
        if (c.t != V_INT && c.t != V_BOOL) jj_fail(j, NM_ERR_TEMPLATE, pos, "slice indices must be integers");
        stp = inum(c);
        if (stp == 0) jj_fail(j, NM_ERR_TEMPLATE, pos, "slice step cannot be zero");
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
    for (int64_t k = 0; k < n; k++) jj_sb_put(j, &s, items->v[start + k * stp].u.s.p, items->v[start + k * stp].u.s.n);
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
            if (ar->nk == MAX_ARGS) jj_fail(j, NM_ERR_UNSUPPORTED, pos, "more than %d keyword arguments", MAX_ARGS);
            ar->kn[ar->nk] = a->s;
            ar->kv[ar->nk++] = eval(j, a->a);
        } else {
            if (ar->n == MAX_ARGS) jj_fail(j, NM_ERR_UNSUPPORTED, pos, "more than %d arguments", MAX_ARGS);
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
    if (!v || v->t != V_STR) jj_fail(j, NM_ERR_TEMPLATE, pos, "%s: expected a string", what);
    return v->u.s;
}

static int64_t want_int(J *j, const jv *v, int32_t pos, const char *what) {
    if (!v || (v->t != V_INT && v->t != V_BOOL)) jj_fail(j, NM_ERR_TEMPLATE, pos, "%s: expected an integer", what);
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
    char *p = jj_alloc(j, s.n ? s.n : 1);
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
            jj_sb_put(j, &b, new_.p, new_.n);
            if (i == s.n) { i++; break; }
            size_t m = u8len(s.p + i, s.n - i);
            jj_sb_put(j, &b, s.p + i, m);
            i += m;
        }
        if (i < s.n) jj_sb_put(j, &b, s.p + i, s.n - i);
        return sb_js(&b);
    }
    while (i < s.n) {
        const char *f = (count < 0 || done < count) && s.n - i >= old.n ? memmem(s.p + i, s.n - i, old.p, old.n) : NULL;
        if (!f) break;
        jj_sb_put(j, &b, s.p + i, (size_t)(f - (s.p + i)));
        jj_sb_put(j, &b, new_.p, new_.n);
        i = (size_t)(f - s.p) + old.n;
        done++;
    }
    jj_sb_put(j, &b, s.p + i, s.n - i);
    return sb_js(&b);
}

static jv split(J *j, js s, const jv *sep, int64_t maxsplit, int32_t pos) {
    int64_t cap = 8, n = 0;
    jv *v = jj_alloc_n(j, (size_t)cap, sizeof *v);
    size_t i = 0;
    bool ws = !sep || sep->t == V_NONE;
    js d = ws ? (js){"", 0} : want_str(j, sep, pos, "split");
    if (!ws && d.n == 0) jj_fail(j, NM_ERR_TEMPLATE, pos, "split: empty separator");
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
            jv *q = jj_alloc_n(j, (size_t)cap * 2, sizeof *q);
            memcpy(q, v, (size_t)n * sizeof *q);
            v = q;
            cap *= 2;
        }
        v[n++] = v_str(piece);
        step(j, pos);
        if (last) break;
    }
    jlist *l = jj_alloc(j, sizeof *l);
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
    jj_fail(j, NM_ERR_UNSUPPORTED, pos, "unknown method '%.*s' of '%s'", (int)name.n, name.p, type_name(self));
}

static jv call_func(J *j, js name, const args *ar, int32_t pos) {
    if (js_eq(name, "raise_exception")) {
        js m = ar->n ? to_str(j, ar->v[0]) : js_c("");
        jj_fail(j, NM_ERR_TEMPLATE, pos, "the template raised an error: %.*s", (int)(m.n > 300 ? 300 : m.n), m.p);
    }
    if (js_eq(name, "namespace") || js_eq(name, "dict")) {
        jdict *d = dict_new(j, js_eq(name, "namespace"));
        if (ar->n) jj_fail(j, NM_ERR_UNSUPPORTED, pos, "%.*s() takes keyword arguments here", (int)name.n, name.p);
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
            jj_fail(j, NM_ERR_TEMPLATE, pos, "range() takes 1 to 3 arguments");
        }
        if (c == 0) jj_fail(j, NM_ERR_TEMPLATE, pos, "range() arg 3 must not be zero");
        int64_t n = 0;
        if (c > 0 && b > a) n = (int64_t)(((double)b - a + c - 1) / c);
        if (c < 0 && a > b) n = (int64_t)(((double)a - b - c - 1) / -c);
        if (n > (int64_t)(j->lim.max_mem / sizeof(jv)))
            jj_fail(j, NM_ERR_RANGE, pos, "range() of %lld items: past the memory limit", (long long)n);
        jlist *l = list_new(j, n);
        for (int64_t i = 0; i < n; i++) l->v[i] = v_int(a + i * c);
        return (jv){.t = V_LIST, .u.l = l};
    }
    if (js_eq(name, "strftime_now")) {
        js f = want_str(j, arg(ar, 0, NULL), pos, "strftime_now");
        char fmt[128], buf[256];
        if (f.n >= sizeof fmt) jj_fail(j, NM_ERR_TEMPLATE, pos, "strftime_now: a format too long");
        memcpy(fmt, f.p, f.n);
        fmt[f.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        char *p = jj_alloc(j, n ? n : 1);
        memcpy(p, buf, n);
        return v_str((js){p, n});
    }
    jj_fail(j, NM_ERR_UNSUPPORTED, pos, "unknown function '%.*s'", (int)name.n, name.p);
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
        if (v.t != V_DICT) jj_fail(j, NM_ERR_TEMPLATE, pos, "items: expected a mapping, got '%s'", type_name(v));
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
        for (int64_t i = 0; i < r->n; i++) jj_sb_put(j, &b, r->v[i].u.s.p, r->v[i].u.s.n);
        return v_str(sb_js(&b));
    }
    if (js_eq(name, "join")) {
        const jv *d = arg(ar, 0, "d");
        js sep = d ? to_str(j, *d) : js_c("");
        const jlist *l = iter_items(j, v, pos);
        sb b = {0};
        for (int64_t i = 0; i < l->n; i++) {
            if (i) jj_sb_put(j, &b, sep.p, sep.n);
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
        jj_fail(j, NM_ERR_TEMPLATE, pos, "bad operand type for abs(): '%s'", type_name(v));
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
    jj_fail(j, NM_ERR_UNSUPPORTED, pos, "unknown filter '%.*s'", (int)name.n, name.p);
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
    if (!o) jj_fail(j, NM_ERR_TEMPLATE, pos, "the test '%.*s' needs an argument", (int)name.n, name.p);
    if (js_eq(name, "divisibleby")) {
        int64_t d = want_int(j, o, pos, "divisibleby");
        if (d == 0) jj_fail(j, NM_ERR_TEMPLATE, pos, "divisibleby 0");
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
    jj_fail(j, NM_ERR_UNSUPPORTED, pos, "unknown test '%.*s'", (int)name.n, name.p);
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
    var *x = jj_alloc(j, sizeof *x);
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
        char *p = jj_alloc_n(j, a.u.s.n + b.u.s.n + 1, 1);
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
        if (k > 0 && s.n && (uint64_t)k > j->lim.max_out / s.n) jj_fail(j, NM_ERR_RANGE, pos, "a string too long");
        for (int64_t i = 0; i < k; i++) jj_sb_put(j, &r, s.p, s.n);
        return v_str(sb_js(&r));
    }
    if (!is_num(a) || !is_num(b))
        jj_fail(j, NM_ERR_TEMPLATE, pos, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a),
             type_name(b));
    bool ints = a.t != V_FLOAT && b.t != V_FLOAT;
    int64_t x = inum(a), y = inum(b), r;
    double f = num(a), g = num(b);
    switch (op) {
    case OP_ADD:
        if (!ints) return (jv){.t = V_FLOAT, .u.f = f + g};
        if (__builtin_add_overflow(x, y, &r)) jj_fail(j, NM_ERR_RANGE, pos, "integer overflow");
        return v_int(r);
    case OP_SUB:
        if (!ints) return (jv){.t = V_FLOAT, .u.f = f - g};
        if (__builtin_sub_overflow(x, y, &r)) jj_fail(j, NM_ERR_RANGE, pos, "integer overflow");
        return v_int(r);
    case OP_MUL:
        if (!ints) return (jv){.t = V_FLOAT, .u.f = f * g};
        if (__builtin_mul_overflow(x, y, &r)) jj_fail(j, NM_ERR_RANGE, pos, "integer overflow");
        return v_int(r);
    case OP_DIV:
        if (g == 0) jj_fail(j, NM_ERR_TEMPLATE, pos, "division by zero");
        return (jv){.t = V_FLOAT, .u.f = f / g};
    case OP_FDIV:
    case OP_MOD:
        if (g == 0) jj_fail(j, NM_ERR_TEMPLATE, pos, "integer division or modulo by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) jj_fail(j, NM_ERR_RANGE, pos, "integer overflow");
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
                if (__builtin_mul_overflow(acc, x, &acc)) jj_fail(j, NM_ERR_RANGE, pos, "integer overflow");
                if (acc == 0 || acc == 1) break;
                step(j, pos);
            }
            return v_int(acc);
        }
        return (jv){.t = V_FLOAT, .u.f = pow(f, g)};
    default: break;
    }
    jj_fail(j, NM_ERR_TEMPLATE, pos, "bad operator");
}

static bool contains(J *j, jv item, jv seq, int32_t pos) {
    switch (seq.t) {
    case V_STR:
        if (item.t != V_STR)
            jj_fail(j, NM_ERR_TEMPLATE, pos, "'in <string>' requires string as left operand, not %s", type_name(item));
        return item.u.s.n == 0 || (seq.u.s.n && memmem(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n));
    case V_DICT: return item.t == V_STR && dict_get(seq.u.d, item.u.s);
    case V_LIST:
        for (int64_t i = 0; i < seq.u.l->n; i++)
            if (veq(j, item, seq.u.l->v[i], 0)) return true;
        return false;
    case V_UNDEF: return false;
    default: jj_fail(j, NM_ERR_TEMPLATE, pos, "argument of type '%s' is not iterable", type_name(seq));
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
            char *p = jj_alloc_n(j, s.n + t.n + 1, 1);
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
            if (inum(a) == INT64_MIN) jj_fail(j, NM_ERR_RANGE, x->pos, "integer overflow");
            return v_int(-inum(a));
        }
        if (a.t == V_UNDEF) undefined_err(j, x->pos, a);
        jj_fail(j, NM_ERR_TEMPLATE, x->pos, "bad operand type for unary -: '%s'", type_name(a));
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
            if (k.t != V_STR) jj_fail(j, NM_ERR_UNSUPPORTED, e->pos, "dict keys other than strings are not supported");
            dict_set(j, d, k.u.s, eval(j, e->b));
        }
        return (jv){.t = V_DICT, .u.d = d};
    }
    default: break;
    }
    jj_fail(j, NM_ERR_UNSUPPORTED, x->pos, "cannot evaluate this expression");
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
        jj_fail(j, NM_ERR_TEMPLATE, x->pos, "cannot unpack a '%s' into %.*s, %.*s", type_name(item), (int)x->s.n, x->s.p,
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
    jloop *lp = jj_alloc(j, sizeof *lp);
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
                char *p = jj_alloc_n(j, j->on - on + 1, 1);
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
                    jj_fail(j, NM_ERR_TEMPLATE, x->pos, "cannot assign attribute on non-namespace object");
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
        default: jj_fail(j, NM_ERR_UNSUPPORTED, x->pos, "cannot run this statement");
        }
    }
    leave(j);
    return FLOW_NEXT;
}

// ---- the context -------------------------------------------------------------------------

static jv from_json(J *j, const cJSON *c, int depth) {
    if (depth > j->lim.max_depth)
        jj_fail(j, NM_ERR_RANGE, -1, "the context nests deeper than %d", (int)j->lim.max_depth);
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
    if (len > j->lim.max_src)
        jj_fail(j, NM_ERR_RANGE, -1, "a template of %zu bytes (at most %zu)", len, j->lim.max_src);
    // Jinja2 reads \r\n and \r as \n, and drops one newline at the end (keep_trailing_newline=False).
    char *s = jj_alloc(j, len + 1);
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
    jj_lex(j);
    j->p = 0;
    node *body = jj_parse_body(j, NULL, NULL, 0, "");
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
