// The planner (include/nanomind.h, "the planner"; docs/scheduler.md): every
// placement of a chain of bricks on the units, the decoder also split in two
// layer ranges on two units, scored by the roofline of each brick's estimate
// on each unit's profile. The search is exhaustive (up to
// NM_PLAN_MAX_PLACEMENTS placements; a phone's 4 units and 2 bricks are 708),
// so the plan is the best one the model knows, not a heuristic's guess, and it is
// deterministic: a placement replaces the best so far only when strictly
// better, and placements are visited in unit order, unsplit before split.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "quant/quant.h"

// What one brick costs on one unit for a fraction of its work (1: all of it;
// a split decoder's layer range: its share). Negative when it cannot run there.
typedef struct fit {
    double seconds, compute_s, memory_s;
    double prompt_s; // with a decode phase: the prompt's part of seconds (0: one phase)
    uint64_t mem;
    const char *why_not; // when it cannot
} fit;

// The roofline of one phase: the larger of its arithmetic (at the unit's
// speed for each weight type) and its bytes (weights at the unit's matvec
// speed for their type when decoding, else at the read bandwidth), plus a
// launch per pass. False (why_not set) where the unit cannot run it.
static bool roofline(const nm_unit_profile *u, const nm_brick_cost *c, bool decoding, double share, fit *f) {
    double compute = 0, weights_by_type = 0, memory = 0;
    for (int t = 0; t < NM_EST_TYPES; t++) {
        if (c->flops_by_type[t] <= 0) continue;
        const double gf = t == 0 ? u->gflops_f32 : u->gflops[t];
        if (gf <= 0) return f->why_not = "cannot run its weight type", false;
        compute += c->flops_by_type[t] / (gf * 1e9);
        // a token a pass: the weights of type t streamed are its multiply-adds (f32 also holds attention)
        if (decoding && t > 0 && u->matvec_gbps[t] > 0) {
            const double bytes = c->flops_by_type[t] / 2.0 * (double)nm_row_size((uint32_t)t, 256) / 256.0;
            memory += bytes / (u->matvec_gbps[t] * 1e9);
            weights_by_type += bytes;
        }
    }
    if (u->read_gbps <= 0) return f->why_not = "no bandwidth measured", false;
    const double rest = c->weight_bytes_read - weights_by_type;
    memory += ((rest > 0 ? rest : 0) + c->act_bytes) / (u->read_gbps * 1e9);
    compute *= share;
    memory *= share;
    f->compute_s += compute;
    f->memory_s += memory;
    f->seconds += (compute > memory ? compute : memory) + (double)c->n_passes * u->launch_us * 1e-6 +
                  c->n_ops * share * u->op_us * 1e-6;
    return true;
}

static fit cost_on(const nm_unit_profile *u, const nm_plan_brick *b, double share) {
    fit f = {.seconds = -1};
    if (u->kinds && !(u->kinds & (1u << b->kind))) return f.why_not = "does not take this kind of brick", f;
    if (!(b->units & NM_UNIT_BIT(u->unit))) return f.why_not = "the brick has no implementation for it", f;
    f.seconds = 0;
    const nm_brick_cost *c = &b->cost, *d = &b->decode;
    bool ok;
    if (d->n_passes > 0) { // the prompt (what the generation leaves of the whole), then the generation
        nm_brick_cost prompt = *c;
        prompt.flops -= d->flops;
        for (int t = 0; t < NM_EST_TYPES; t++) prompt.flops_by_type[t] -= d->flops_by_type[t];
        prompt.weight_bytes_read -= d->weight_bytes_read;
        prompt.act_bytes -= d->act_bytes;
        prompt.n_passes -= d->n_passes;
        prompt.n_ops -= d->n_ops;
        ok = roofline(u, &prompt, false, share, &f);
        f.prompt_s = f.seconds;
        ok = ok && roofline(u, d, true, share, &f);
    } else {
        ok = roofline(u, c, false, share, &f);
    }
    if (!ok) {
        f.seconds = -1;
        return f;
    }
    f.mem = (uint64_t)((double)c->peak_bytes * share);
    return f;
}

typedef struct search {
    const nm_unit_profile *units;
    int32_t n_units;
    const nm_plan_brick *bricks;
    int32_t n_bricks;
    nm_plan_goal goal;
    nm_plan cur, best;
    bool have_best;
} search;

// Scores the placement in s->cur and keeps it if better.
static void consider(search *s) {
    nm_plan *p = &s->cur;
    p->latency_s = 0;
    memset(p->busy_s, 0, sizeof p->busy_s);
    memset(p->mem, 0, sizeof p->mem);
    for (int32_t i = 0; i < p->n; i++) p->latency_s += p->steps[i].seconds;
    // busy time and memory per unit (a split decoder on both of its units)
    for (int32_t i = 0; i < p->n; i++) {
        const nm_plan_step *st = &p->steps[i];
        const nm_plan_brick *b = &s->bricks[i];
        if (st->unit2 < 0) {
            p->busy_s[st->unit] += st->seconds;
            p->mem[st->unit] += b->cost.peak_bytes;
        } else {
            const double share = (double)st->split / b->n_layer;
            const fit a = cost_on(&s->units[st->unit], b, share), c = cost_on(&s->units[st->unit2], b, 1 - share);
            p->busy_s[st->unit] += a.seconds;
            p->busy_s[st->unit2] += c.seconds;
            p->mem[st->unit] += a.mem;
            p->mem[st->unit2] += c.mem;
        }
    }
    p->period_s = 0;
    p->joules = 0;
    for (int32_t u = 0; u < s->n_units; u++) {
        if (s->units[u].mem_bytes && p->mem[u] > s->units[u].mem_bytes) return; // does not fit
        bool used = p->busy_s[u] > 0;
        if (p->busy_s[u] > p->period_s) p->period_s = p->busy_s[u];
        if (used) p->joules += p->busy_s[u] * s->units[u].active_w + (p->latency_s - p->busy_s[u]) * s->units[u].idle_w;
    }
    double k1, k2, b1, b2;
    switch (s->goal) {
    case NM_PLAN_THROUGHPUT: k1 = p->period_s, k2 = p->latency_s, b1 = s->best.period_s, b2 = s->best.latency_s; break;
    case NM_PLAN_ENERGY: k1 = p->joules, k2 = p->latency_s, b1 = s->best.joules, b2 = s->best.latency_s; break;
    default: k1 = p->latency_s, k2 = p->period_s, b1 = s->best.latency_s, b2 = s->best.period_s; break;
    }
    const double eps = 1e-9;
    const bool better = !s->have_best || k1 < b1 * (1 - eps) || (k1 <= b1 * (1 + eps) && k2 < b2 * (1 - eps));
    if (better) {
        s->best = *p;
        s->have_best = true;
    }
}

static void place(search *s, int32_t i) {
    if (i == s->n_bricks) {
        s->cur.n_considered++;
        consider(s);
        return;
    }
    const nm_plan_brick *b = &s->bricks[i];
    nm_plan_step *st = &s->cur.steps[i];
    for (int32_t u = 0; u < s->n_units; u++) { // the whole brick on one unit
        const fit f = cost_on(&s->units[u], b, 1.0);
        if (f.seconds < 0) continue;
        *st = (nm_plan_step){.unit = u, .unit2 = -1, .split = 0, .seconds = f.seconds};
        place(s, i + 1);
    }
    if (b->kind != NM_BRICK_LLM || b->n_layer < 2) return;
    for (int32_t u = 0; u < s->n_units; u++) // the first k layers on u, the rest on v
        for (int32_t v = 0; v < s->n_units; v++) {
            if (u == v) continue;
            for (int32_t k = 1; k < b->n_layer; k++) {
                const double share = (double)k / b->n_layer;
                const fit a = cost_on(&s->units[u], b, share), c = cost_on(&s->units[v], b, 1 - share);
                if (a.seconds < 0 || c.seconds < 0) break;
                *st = (nm_plan_step){.unit = u, .unit2 = v, .split = k, .seconds = a.seconds + c.seconds};
                place(s, i + 1);
            }
        }
}

// Why brick i sits where the plan puts it.
static void explain(search *s, int32_t i) {
    nm_plan_step *st = &s->best.steps[i];
    const nm_plan_brick *b = &s->bricks[i];
    const fit f = cost_on(&s->units[st->unit], b, st->unit2 < 0 ? 1.0 : (double)st->split / b->n_layer);
    int n = f.prompt_s > 0
                ? snprintf(st->why, sizeof st->why, "prompt %.1f ms, generation %.1f ms there (%.1f ms compute, %.1f ms "
                           "memory in all)", 1e3 * f.prompt_s, 1e3 * (f.seconds - f.prompt_s), 1e3 * f.compute_s,
                           1e3 * f.memory_s)
                : snprintf(st->why, sizeof st->why, "%s-bound there (%.1f ms compute, %.1f ms memory)",
                           f.compute_s > f.memory_s ? "compute" : "memory", 1e3 * f.compute_s, 1e3 * f.memory_s);
    // the best other unit for the whole brick, and what keeps it out
    int32_t alt = -1;
    double alt_s = 0;
    const char *none = NULL;
    for (int32_t u = 0; u < s->n_units; u++) {
        if (u == st->unit && st->unit2 < 0) continue;
        const fit g = cost_on(&s->units[u], b, 1.0);
        if (g.seconds < 0) {
            none = none ? none : g.why_not;
            continue;
        }
        if (alt < 0 || g.seconds < alt_s) alt = u, alt_s = g.seconds;
    }
    if (n < 0 || (size_t)n >= sizeof st->why) return;
    if (alt >= 0)
        snprintf(st->why + n, sizeof st->why - (size_t)n, "; alone on %s: %.1f ms", s->units[alt].name, 1e3 * alt_s);
    else
        snprintf(st->why + n, sizeof st->why - (size_t)n, "; the only unit for it (the others: %s)",
                 none ? none : "none");
}

nm_status nm_plan_make(const nm_unit_profile *units, int32_t n_units, const nm_plan_brick *bricks, int32_t n_bricks,
                       nm_plan_goal goal, nm_plan *out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "plan: no output");
    memset(out, 0, sizeof *out);
    if (!units || !bricks || n_units < 1 || n_units > NM_PLAN_MAX_UNITS || n_bricks < 1 || n_bricks > NM_PLAN_MAX_BRICKS)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "plan: 1..%d units and 1..%d bricks (got %d and %d)",
                       NM_PLAN_MAX_UNITS, NM_PLAN_MAX_BRICKS, n_units, n_bricks);
    if (goal < NM_PLAN_LATENCY || goal > NM_PLAN_ENERGY)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "plan: unknown goal %d", (int)goal);
    // a brick no unit takes is named before any search (memory alone: a decoder
    // too large for any one unit may still fit split over two)
    double placements = 1;
    for (int32_t i = 0; i < n_bricks; i++) {
        const char *why = NULL;
        bool any = false;
        const bool splits = bricks[i].kind == NM_BRICK_LLM && bricks[i].n_layer > 1;
        for (int32_t u = 0; u < n_units && !any; u++) {
            const fit f = cost_on(&units[u], &bricks[i], 1.0);
            any = f.seconds >= 0 && (splits || !units[u].mem_bytes || f.mem <= units[u].mem_bytes);
            if (!any && !why) why = f.seconds < 0 ? f.why_not : "does not fit its memory";
        }
        placements *= n_units + (splits ? (double)n_units * (n_units - 1) * (bricks[i].n_layer - 1) : 0);
        if (!any)
            return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "plan: no unit can run brick %d (%s): %s", (int)i,
                           bricks[i].name ? bricks[i].name : "?", why ? why : "?");
    }
    if (placements > NM_PLAN_MAX_PLACEMENTS)
        return nm_fail(NM_ERR_RANGE, err, err_size, "plan: %.3g placements to look at, more than %d: fewer units, "
                       "bricks or layers", placements, NM_PLAN_MAX_PLACEMENTS);
    search *s = calloc(1, sizeof *s);
    if (!s) return nm_fail(NM_ERR_NOMEM, err, err_size, "plan: out of memory");
    *s = (search){.units = units, .n_units = n_units, .bricks = bricks, .n_bricks = n_bricks, .goal = goal};
    s->cur.n = n_bricks;
    place(s, 0);
    if (!s->have_best) {
        free(s);
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "plan: the bricks do not fit the units' memory together");
    }
    s->best.n_considered = s->cur.n_considered;
    for (int32_t i = 0; i < n_bricks; i++) {
        nm_plan_step *st = &s->best.steps[i];
        explain(s, i);
        // energy of the step: its busy time at the active watts of its unit(s)
        const nm_plan_brick *b = &bricks[i];
        if (st->unit2 < 0) {
            st->joules = st->seconds * units[st->unit].active_w;
        } else {
            const double share = (double)st->split / b->n_layer;
            st->joules = cost_on(&units[st->unit], b, share).seconds * units[st->unit].active_w +
                         cost_on(&units[st->unit2], b, 1 - share).seconds * units[st->unit2].active_w;
        }
    }
    *out = s->best;
    free(s);
    return NM_OK;
}

int32_t nm_plan_format(const nm_plan *p, const nm_unit_profile *units, const nm_plan_brick *bricks, char *buf,
                       int32_t size) {
    char tmp[8192]; // 8 bricks of at most ~330 bytes and 8 units: it always fits
    size_t n = 0;
#define PUT(...) (n += (size_t)snprintf(tmp + (n < sizeof tmp ? n : sizeof tmp - 1), n < sizeof tmp ? sizeof tmp - n : 1, __VA_ARGS__))
    PUT("plan: %lld placements considered\n", (long long)p->n_considered);
    for (int32_t i = 0; i < p->n; i++) {
        const nm_plan_step *st = &p->steps[i];
        const char *name = bricks[i].name ? bricks[i].name : "brick";
        if (st->unit2 < 0)
            PUT("  %-8.24s on %-12s %9.2f ms  %s\n", name, units[st->unit].name, 1e3 * st->seconds, st->why);
        else
            PUT("  %-8.24s layers 0-%d on %s, %d-%d on %s: %.2f ms  %s\n", name, st->split - 1, units[st->unit].name,
                st->split, bricks[i].n_layer - 1, units[st->unit2].name, 1e3 * st->seconds, st->why);
    }
    PUT("latency %.2f ms a request, period %.2f ms (%.1f a second), ", 1e3 * p->latency_s, 1e3 * p->period_s,
        p->period_s > 0 ? 1.0 / p->period_s : 0.0);
    if (p->joules > 0) PUT("%.3f J a request\n", p->joules);
    else PUT("energy a request unknown (no unit's watts: nanomind profile where a meter sees them)\n");
    for (int32_t u = 0; u < NM_PLAN_MAX_UNITS; u++)
        if (p->busy_s[u] > 0)
            PUT("  %-12s busy %.2f ms, holds %.1f MiB\n", units[u].name, 1e3 * p->busy_s[u], p->mem[u] / 1048576.0);
#undef PUT
    if (n >= sizeof tmp) n = sizeof tmp - 1;
    if (!buf || size <= (int32_t)n) return -(int32_t)(n + 1);
    memcpy(buf, tmp, n + 1);
    return (int32_t)n;
}
