// The Jinja interpreter's insides, shared by its parser (jinja_parse.c: the
// lexer, the syntax tree) and its evaluator (jinja.c): the values, the
// arena, the error jump, the tokens and nodes. Not an interface: only the two
// files include it.
#ifndef NM_JINJA_IMPL_H
#define NM_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bricks/tokenizer/jinja.h"

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

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

// Ends the render with st: err gets "line L, column C: " (pos >= 0) and the message.
_Noreturn void jj_fail(J *j, nm_status st, int32_t pos, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
// n bytes of the arena (16-aligned), or the render fails (the memory cap).
void *jj_alloc(J *j, size_t n);
// n elements of size sz, the product checked.
void *jj_alloc_n(J *j, size_t n, size_t sz);
// Appends n bytes to b (its memory from the arena).
void jj_sb_put(J *j, sb *b, const char *s, size_t n);
// Appends code point cp as UTF-8 (a surrogate or one past U+10FFFF as U+FFFD).
void jj_put_utf8(J *j, sb *b, uint32_t cp);
// The template (j->src, j->n) into tokens (j->toks, j->ntok), whitespace control applied.
void jj_lex(J *j);
// Statements up to one of `ends` (NULL: the end of the template); *which: the end found.
node *jj_parse_body(J *j, const char *const *ends, int *which, int32_t open_pos, const char *open);
// The index of s in the NULL-terminated list, or -1.
int jj_find_name(const char *const *list, js s);

static inline void enter(J *j, int32_t pos) {
    if (++j->depth > j->lim.max_depth)
        jj_fail(j, NM_ERR_RANGE, pos, "the template nests deeper than %d", (int)j->lim.max_depth);
}
static inline void leave(J *j) { j->depth--; }
static inline js sb_js(sb *b) { return (js){b->p ? b->p : "", b->n}; }
static inline bool js_eq(js a, const char *b) { return a.n == strlen(b) && !memcmp(a.p, b, a.n); }
static inline bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
static inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

#endif
