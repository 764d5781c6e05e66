// The pipeline's power policy (pipeline_impl.h, docs/power.md): before each
// request is taken the battery is read and the policy stepped; the request's
// plan follows (the cascade, the bricks' threads, the decoder's pace).
#include "sched/pipeline_impl.h"

// ---- power: the policy before each request -----------------------------------------------------

// The bricks' threads the pipeline runs with now.
static int32_t threads_of(const nm_pipeline *P) { return P->threads_now > 0 ? P->threads_now : P->power.n_threads; }

// Reads the battery and steps the policy for request r (NOTE and POWER
// events); the DVFS caps follow. The feed thread's.
static nm_power_targets power_step(nm_pipeline *P, pl_req *r) {
    double t0, t1;
    nm_battery_span(P->p.battery, &t0, &t1);
    nm_battery_reading br;
    nm_battery_read(P->p.battery, t0 + (nm_now_s() - P->t_create) * P->p.battery_speed, &br);
    char note[320];
    if (br.note[0]) {
        const int n = snprintf(note, sizeof note, "battery: %s", br.note);
        pl_push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, note, (size_t)n);
    }
    // the decoder's speed unpaced (tokens a second of generation: pacing's waits are not in t_gen), unless given
    pthread_mutex_lock(&P->lock);
    const nm_brick_stats *a = &P->L[NM_BRICK_LLM].base, *c = &P->L[NM_BRICK_LLM].cur;
    const double n_gen = (double)(a->n_gen + c->n_gen), t_gen = a->t_gen + c->t_gen;
    pthread_mutex_unlock(&P->lock);
    if (P->power.decode_tps <= 0 && n_gen > 0 && t_gen > 0) P->pol.p.decode_tps = n_gen / t_gen;
    const nm_power_targets tg = nm_power_policy_step(&P->pol, br.pct);
    char err[512];
    if (P->p.dvfs && nm_power_actuators_apply(P->p.dvfs, &tg, err, sizeof err) != NM_OK && !P->dvfs_said) {
        P->dvfs_said = true; // (once: it fails alike each time)
        const int n = snprintf(note, sizeof note, "power: DVFS not applied: %s", err);
        pl_push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, note, (size_t)n);
    }
    const nm_power_targets *o = &P->said;
    if (!P->power_said || tg.state != o->state || tg.alpha != o->alpha || tg.fps != o->fps ||
        tg.decode_share != o->decode_share || tg.decode_tps_cap != o->decode_tps_cap || tg.n_threads != o->n_threads ||
        tg.cascade != o->cascade || tg.freq_share != o->freq_share) {
        P->power_said = true, P->said = tg;
        char pace[64] = "";
        if (tg.decode_tps_cap > 0) snprintf(pace, sizeof pace, " (%.1f tokens/s)", tg.decode_tps_cap);
        const int n = snprintf(note, sizeof note,
                               "battery %.1f %%: %s, alpha %.2f: frames %.2f/s, decoder %.0f%% of its speed%s%s, "
                               "%d thread%s a brick%s",
                               br.pct, nm_power_state_name(tg.state), tg.alpha, tg.fps, 100 * tg.decode_share, pace,
                               tg.decode_share < 1 && tg.decode_tps_cap <= 0 ? " (once an answer has measured it)" : "",
                               (int)tg.n_threads, tg.n_threads == 1 ? "" : "s",
                               tg.cascade ? ", each brick loaded, run and released in turn" : "");
        nm_pipeline_event ev = {.kind = NM_PIPELINE_POWER, .request = r->id, .power = tg, .battery_pct = br.pct};
        pl_push(P, &ev, note, (size_t)n);
    }
    return tg;
}

// Request r's plan, when the feed thread takes it: the cascade or the
// resident bricks, their threads, the decoder's pace.
void pl_plan(nm_pipeline *P, pl_req *r) {
    bool cascade = P->p.mode == NM_PIPELINE_CASCADE;
    int32_t threads = threads_of(P);
    double max_tps = 0;
    if (P->p.battery) {
        const nm_power_targets tg = power_step(P, r);
        cascade = cascade || tg.cascade;
        if (tg.n_threads > 0) threads = tg.n_threads;
        if (tg.decode_share < 1 && tg.decode_tps_cap > 0) max_tps = tg.decode_tps_cap;
    }
    if (P->p.battery && P->p.mode == NM_PIPELINE_CASCADE) P->threads_now = threads; // (none loaded between requests)
    pthread_mutex_lock(&P->lock);
    r->cascade = cascade;
    r->threads = threads;
    r->max_tps = max_tps;
    r->remake = P->p.mode != NM_PIPELINE_CASCADE && (cascade ? P->resident : !P->resident || threads != threads_of(P));
    pthread_mutex_unlock(&P->lock);
}

// The graph idle (every earlier request done, the lanes idle): the resident
// bricks freed, and made again with r's threads unless r runs as the
// cascade. False (recorded on r) when one fails to load.
bool pl_remake(nm_pipeline *P, pl_req *r) {
    for (int k = 1; k < 5; k++) pl_unload(P, (nm_brick_kind)k);
    P->resident = false;
    P->threads_now = r->threads;
    if (r->cascade) return true;
    char err[600];
    if (!pl_load_all(P, err, sizeof err)) {
        pl_record(P, r, NM_ERR_STATE, "%s", err);
        return false;
    }
    P->resident = true;
    return true;
}
