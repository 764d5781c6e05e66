// The battery policy (include/nanomind.h, "power"; docs/power.md): three
// states from the charge B, with hysteresis on the way up, and the rates every
// other part follows, each linear in alpha = (B - T_low) / (T_high - T_low).
#include <math.h>
#include <stdio.h>

#include "core/fail.h"

nm_power_params nm_power_default_params(void) {
    return (nm_power_params){
        .t_high = 60,
        .t_low = 20,
        .hysteresis = 2,
        .fps_max = 2,
        .fps_min = 0.25,
        .share_min = 0.25,
        .decode_tps = 0,
        .n_threads = 0,
    };
}

nm_status nm_power_params_check(const nm_power_params *p, char *err, size_t err_size) {
    if (!p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: params are NULL");
    if (!(p->t_low >= 0 && p->t_high <= 100 && p->t_low < p->t_high))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "power: thresholds need 0 <= t_low < t_high <= 100 %%, got t_low %g, t_high %g", p->t_low,
                       p->t_high);
    if (!(p->hysteresis >= 0 && p->hysteresis < p->t_high - p->t_low))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "power: hysteresis needs 0 <= h < t_high - t_low (%g), got %g", p->t_high - p->t_low,
                       p->hysteresis);
    if (!(p->fps_min >= 0 && p->fps_max >= p->fps_min && isfinite(p->fps_max)))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: frame rates need 0 <= fps_min <= fps_max, got %g, %g",
                       p->fps_min, p->fps_max);
    if (!(p->share_min >= 0 && p->share_min <= 1))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: share_min needs 0..1, got %g", p->share_min);
    if (!(p->decode_tps >= 0 && isfinite(p->decode_tps)))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: decode_tps needs >= 0, got %g", p->decode_tps);
    if (p->n_threads < 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: n_threads needs >= 0, got %d", p->n_threads);
    return NM_OK;
}

nm_status nm_power_policy_init(nm_power_policy *pol, const nm_power_params *p, char *err, size_t err_size) {
    if (!pol) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: policy is NULL");
    nm_power_params d = p ? *p : nm_power_default_params();
    nm_status st = nm_power_params_check(&d, err, err_size);
    if (st != NM_OK) return st;
    *pol = (nm_power_policy){.p = d, .state = NM_POWER_UNCONSTRAINED, .pct = NAN, .started = false};
    return NM_OK;
}

// The state for B from `from`: falling at the thresholds, rising only past
// threshold + h. From no state (the first reading) both ways use the thresholds.
static nm_power_state next_state(const nm_power_params *p, nm_power_state from, bool started, double b) {
    const double h = started ? p->hysteresis : 0;
    nm_power_state by_b = b >= p->t_high ? NM_POWER_UNCONSTRAINED : b >= p->t_low ? NM_POWER_PROPORTIONAL
                                                                                  : NM_POWER_CRITICAL;
    if (!started || by_b >= from) return by_b; // falling (or the same): at once
    // rising: each step up needs B past its threshold + h
    nm_power_state s = from;
    if (s == NM_POWER_CRITICAL && b >= p->t_low + h) s = NM_POWER_PROPORTIONAL;
    if (s == NM_POWER_PROPORTIONAL && b >= p->t_high + h) s = NM_POWER_UNCONSTRAINED;
    return s;
}

nm_power_targets nm_power_policy_step(nm_power_policy *pol, double pct) {
    const nm_power_params *p = &pol->p;
    if (isfinite(pct)) {
        pol->state = next_state(p, pol->state, pol->started, pct);
        pol->started = true;
        pol->pct = pct;
    }
    nm_power_targets t = {.state = pol->state};
    const int32_t threads = p->n_threads > 0 ? p->n_threads : nm_cpu_count();
    switch (pol->state) {
    case NM_POWER_UNCONSTRAINED:
        t.alpha = 1;
        t.fps = p->fps_max;
        t.decode_share = 1;
        t.freq_share = 1;
        t.n_threads = threads;
        t.decode_tps_cap = 0;
        return t;
    case NM_POWER_PROPORTIONAL: {
        double a = (pol->pct - p->t_low) / (p->t_high - p->t_low);
        t.alpha = a < 0 ? 0 : a > 1 ? 1 : a;
        t.fps = p->fps_min + t.alpha * (p->fps_max - p->fps_min);
        t.decode_share = p->share_min + t.alpha * (1 - p->share_min);
        break;
    }
    case NM_POWER_CRITICAL:
        t.alpha = 0;
        t.fps = 0;
        t.decode_share = p->share_min;
        t.cascade = true;
        break;
    }
    t.freq_share = t.decode_share;
    t.decode_tps_cap = t.decode_share * p->decode_tps;
    int32_t n = (int32_t)ceil(t.decode_share * threads - 1e-9);
    t.n_threads = t.state == NM_POWER_CRITICAL ? 1 : n < 1 ? 1 : n > threads ? threads : n;
    return t;
}
