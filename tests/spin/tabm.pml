/* Promela model of the TABM slot protocol (src/tabm/tabm.c) with a peer that
 * may be killed (SIGKILL) at any step, checked with spin by
 * tests/spin/run_spin.sh: 2 producers x 2 consumers, one message each.
 *
 * What is modelled (labels [L1].. are named at the matching lines of tabm.c):
 *   - slot states FREE / ALLOCATED_FOR_WRITE / READY_TO_READ /
 *     ALLOCATED_FOR_READ and the holder's pid of each slot
 *   - the free and ready queues as the C arrays: cells, head, tail
 *   - each step of a slot's life as one critical section under the ring lock
 *     [L1]: it takes the lock (over from a dead owner: [REC] restores the
 *     journal, then wakes both sides, the wakes the dead may have owed),
 *     journals [J1], stores, clears the journal [J2], unlocks. A section is
 *     one atomic step of the model unless its process is killed inside it:
 *     then any prefix of its stores stays (the state a kill leaves), the lock
 *     stays held by the dead. Others see a live holder's section only through
 *     the lock-free looks of the reaper and of sleep_chunk, which skip a live
 *     holder's slots and find in its half-done state nothing the state
 *     before or after would not show them
 *   - reaping [REAP]: a dead owner's lock taken over, then every slot a dead
 *     process holds back to FREE
 *   - futex sleeping: an event word, a sleepers count, FUTEX_WAIT (sleeps only
 *     if the word still holds the value seen), FUTEX_WAKE (all sleepers); a
 *     waiter on a ring of several processes sleeps in bounded chunks
 *     (sleep_chunk), then reaps and looks again; KILL=9 models a ring of
 *     one process's threads: no kill, unbounded sleeps. The timed wake is in the model only when it
 *     can matter (see wait_ev); otherwise it is a stutter, left out so that a
 *     deadlock stays one
 *   - shutdown at any moment (nm_tabm_shutdown reaps too: the same code as a
 *     waiter's reap, left out of the stopper)
 *   - one kill at most: of a producer (KILL=1), a consumer (KILL=3), or any
 *     (KILL=0), at any step between sections (the killer process and
 *     `unless`) or inside one (CUT)
 * Checked:
 *   - no live process deadlocks, shutdown ends everyone (invalid end states)
 *   - no slot lost: once everyone ended (and a last take-over and reap of
 *     what the dead left), every slot is FREE and in the free queue exactly
 *     once, the ready queue is empty, no writer counted, every published
 *     message taken by a consumer
 *   - none taken twice; per-producer order kept per consumer
 *   - every step starts from the state the protocol says
 * Mutants (each must fail; run_spin.sh checks it):
 *   -DBUG_NO_UNDO         a taker of a dead owner's lock does not restore the journal
 *   -DBUG_NO_STEAL        the lock of a dead owner is never taken over
 *   -DBUG_NO_REAP         slots of dead processes are never taken back
 *   -DBUG_UNBOUNDED_SLEEP waiters sleep without looking for dead peers
 *   -DBUG_NO_WRITERS      readers end on shutdown without waiting for writers
 *   -DBUG_NO_SLEEPERS     the waiter is not counted as sleeping
 */

#ifndef NSLOTS
#define NSLOTS 2
#endif
#define QM (2 * NSLOTS)  /* queue positions count modulo this (cells: position % NSLOTS) */
#define NP 2
#ifndef NPROD
#define NPROD 2          /* producers (pids 1, 2) */
#endif
#ifndef NCONS
#define NCONS 2          /* consumers (pids 3, 4) */
#endif
#ifndef KILL
#define KILL 0
#endif
#define NPID 7           /* pids 1, 2: producers; 3, 4: consumers; 6: init; 0: nobody */

#define FREE 0
#define AW 1
#define RR 2
#define AR 3

byte state[NSLOTS], owner[NSLOTS];
byte msg_p[NSLOTS];                  /* the payload: which producer's message */
byte fq[NSLOTS], rq[NSLOTS];
byte fqh, fqt, rqh, rqt;
byte n_write;
byte lk;                             /* the ring lock: 0, or the pid of a dead owner */
bit jv;                              /* the journal */
byte j_slot, j_state, j_owner, j_fqh, j_fqt, j_rqh, j_rqt, j_nw;
bit shutdown;
bit dead[NPID];
bit killed;

/* ghosts: counted when a section commits */
byte published, taken;
bit was_taken[NP];

/* The futex words, as what matters of them: whether each waiter's word has
 * changed since it read it (`seen`). Exact (a 32-bit word in C needs 2^32
 * events to come back), and without counters the state space stays small. */
bit chg[NPID];
byte sl_free, sl_ready;
bit asleep[NPID];

#if KILL == 0
#define KILLABLE (!killed)
#elif KILL == 9
#define KILLABLE 0
#else
#define KILLABLE (!killed && (me == KILL))
#endif
/* inside a section: the process may be killed here (then `unless` ends it) */
#define CUT if :: KILLABLE -> killed = 1; dead[me] = 1 :: true -> skip fi

inline signal_free() {
    d_step { chg[1] = 1; chg[2] = 1 };
    if
    :: sl_free > 0 -> d_step { asleep[1] = 0; asleep[2] = 0 }
    :: else -> skip
    fi
}
inline signal_ready() {
    d_step { chg[3] = 1; chg[4] = 1 };
    if
    :: sl_ready > 0 -> d_step { asleep[3] = 0; asleep[4] = 0 }
    :: else -> skip
    fi
}

/* [L1] inside a section's atomic step: the lock is free, or its owner is
 * dead (sections are atomic unless killed): take it over, [REC] undo. */
inline lock() {
    if
    :: lk == 0 -> lk = me
#ifndef BUG_NO_STEAL
    :: lk != 0 -> lk = me; stole = 1;
#ifndef BUG_NO_UNDO
        if
        :: jv ->
            fqh = j_fqh; fqt = j_fqt; rqh = j_rqh; rqt = j_rqt; n_write = j_nw;
            state[j_slot] = j_state; owner[j_slot] = j_owner;
            jv = 0
        :: else -> skip
        fi
#endif
#endif
    fi
}
/* after the section: the wakes a dead owner may have owed (the chunked
 * sleeps would find them late without these) */
inline owed() {
    if
    :: stole -> stole = 0; signal_free(); signal_ready()
    :: else -> skip
    fi
}

/* [J1] */
inline journal(s) {
    j_fqh = fqh; j_fqt = fqt; j_rqh = rqh; j_rqt = rqt; j_nw = n_write;
    j_slot = s; j_state = state[s]; j_owner = owner[s];
    jv = 1
}

#define HELD(s) (state[s] == AW || state[s] == AR)
#define DEADHELD(s) (HELD(s) && dead[owner[s]])
#if NSLOTS == 1
#define ANY_DEADHELD (lk != 0 || DEADHELD(0))
#else
#define ANY_DEADHELD (lk != 0 || DEADHELD(0) || DEADHELD(1))
#endif

/* [REAP] a dead owner's lock (taken over, its step undone), then every slot
 * a dead process holds, one section each */
inline reap() {
    s = 0;
    n_reaped = 0;
#ifndef BUG_NO_REAP
    if
    :: lk != 0 -> atomic { lock(); lk = 0 }; owed()
    :: else -> skip
    fi;
    do
    :: s < NSLOTS ->
        if
        :: DEADHELD(s) ->
            atomic {
                lock();
                if
                :: DEADHELD(s) ->
                    journal(s); CUT;
                    wasw = (state[s] == AW);
                    state[s] = FREE; CUT;
                    owner[s] = 0; CUT;
                    fq[fqt % NSLOTS] = s; CUT;
                    fqt = (fqt + 1) % QM; CUT;
                    if
                    :: wasw -> n_write--; CUT
                    :: else -> skip
                    fi;
                    jv = 0; CUT;
                    n_reaped++
                :: else -> skip
                fi;
                lk = 0
            };
            owed()
        :: else -> skip
        fi;
        s++
    :: else -> break
    od;
    if
    :: n_reaped > 0 -> signal_free(); signal_ready()
    :: else -> skip
    fi;
    d_step { s = 0; n_reaped = 0; wasw = 0 }
#else
    skip
#endif
}

/* sleep_chunk: on a ring more than one process uses, every sleep is bounded
 * (100 ms while another process holds the lock or a slot or a slot is READY,
 * else 1 s): a process killed between a step and its wake leaves nothing
 * behind, but a waiter that needed the wake. The model's peers are processes. */
#if !defined(BUG_UNBOUNDED_SLEEP) && KILL != 9
#define BOUNDED 1
#else
#define BOUNDED 0
#endif

/* [SLEEP_F] / [SLEEP_R]: wait_or_reap. sleepers++, FUTEX_WAIT while the word
 * is unchanged; a bounded sleeper also wakes at the end of a chunk, reaps and
 * returns to look again. That timed wake is in the model when it can matter:
 * a dead process holds the lock or a slot, or what the waiter waits for
 * (`want`) has come without its wake (owed by a process killed first). */
inline wait_ev(sleepers, want) {
    bounded = BOUNDED;
#ifndef BUG_NO_SLEEPERS
    sleepers++;
#endif
    do
    :: !chg[me] ->
        atomic { if :: !chg[me] -> asleep[me] = 1 :: else -> skip fi }  /* FUTEX_WAIT */
        if
        :: asleep[me] == 0 -> skip
        :: atomic { asleep[me] == 1 && bounded && (ANY_DEADHELD || want) -> asleep[me] = 0; timedout = 1 }
        fi;
        if
        :: timedout -> break
        :: else -> skip
        fi
    :: else -> break
    od;
#ifndef BUG_NO_SLEEPERS
    sleepers--;
#endif
    if
    :: timedout -> timedout = 0; reap()
    :: else -> skip
    fi
}

proctype producer(byte me) {   /* me: pid 1 or 2 */
    byte idx, s, n_reaped, res;
    bit stole, bounded, timedout, wasw;
    {
    do
    :: chg[me] = 0;                                    /* seen = the word */
        atomic {
            lock();
            if
            :: shutdown -> res = 2                     /* [W0] NM_ERR_SHUTDOWN */
            :: !shutdown && fqh != fqt ->              /* [W1] take a FREE slot */
                idx = fq[fqh % NSLOTS];
                assert(state[idx] == FREE);
                journal(idx); CUT;
                fqh = (fqh + 1) % QM; CUT;
                state[idx] = AW; CUT;
                owner[idx] = me; CUT;
                n_write++; CUT;
                jv = 0; CUT;                           /* [J2] */
                res = 1
            :: else -> res = 0                         /* full */
            fi;
            lk = 0
        };
        owed();
        if
        :: res == 2 -> break
        :: res == 1 -> break
        :: else -> wait_ev(sl_free, (fqh != fqt || shutdown))  /* backpressure */
        fi
    od;
    if
    :: res == 1 ->
        msg_p[idx] = me - 1;                           /* write the payload */
        atomic {                                       /* [W2] publish */
            lock();
            assert(state[idx] == AW && owner[idx] == me);
            journal(idx); CUT;
            state[idx] = RR; CUT;
            owner[idx] = 0; CUT;
            rq[rqt % NSLOTS] = idx; CUT;
            rqt = (rqt + 1) % QM; CUT;
            n_write--; CUT;                            /* [W3] */
            jv = 0; published++; CUT;
            lk = 0
        };
        owed();
        signal_ready()                                 /* [WAKE_R] */
    :: else -> skip
    fi
    } unless { dead[me] };
end_p:
    skip
}

proctype consumer(byte me) {   /* me: pid 3 or 4 */
    byte idx, s, n_reaped, res;
    bit stole, bounded, timedout, wasw;
    {
    do
    :: chg[me] = 0;                                    /* seen = the word */
        atomic {
            lock();
            if
            :: rqh != rqt ->                           /* [R1] READY -> ALLOCATED_FOR_READ */
                idx = rq[rqh % NSLOTS];
                assert(state[idx] == RR);
                journal(idx); CUT;
                rqh = (rqh + 1) % QM; CUT;
                state[idx] = AR; CUT;
                owner[idx] = me; CUT;
                jv = 0;
                assert(!was_taken[msg_p[idx]]);        /* none taken twice (one message each: */
                was_taken[msg_p[idx]] = 1;             /*  order is this, per producer) */
                taken++; CUT;
                res = 1
#ifndef BUG_NO_WRITERS
            :: rqh == rqt && shutdown && n_write == 0 -> res = 2   /* [R3] */
            :: rqh == rqt && !(shutdown && n_write == 0) -> res = 0
#else
            :: rqh == rqt && shutdown -> res = 2
            :: rqh == rqt && !shutdown -> res = 0
#endif
            fi;
            lk = 0
        };
        owed();
        if
        :: res == 1 ->
            atomic {                                   /* [R2] release */
                lock();
                assert(state[idx] == AR && owner[idx] == me);
                journal(idx); CUT;
                state[idx] = FREE; CUT;
                owner[idx] = 0; CUT;
                fq[fqt % NSLOTS] = idx; CUT;
                fqt = (fqt + 1) % QM; CUT;
                jv = 0; CUT;
                lk = 0
            };
            owed();
            signal_free()                              /* [WAKE_F] */
        :: res == 2 -> break                           /* NM_ERR_SHUTDOWN */
        :: res == 0 -> wait_ev(sl_ready, (rqh != rqt || (shutdown && n_write == 0)))
        fi
    od
    } unless { dead[me] };
end_c:
    skip
}

proctype stopper() {
    shutdown = 1;                                      /* [S1] */
    signal_free();
    signal_ready()
}

/* a kill between sections (inside one: CUT) */
proctype killer() {
    if
#if KILL == 1 || KILL == 0
    :: atomic { !killed -> killed = 1; dead[1] = 1 }
#endif
#if KILL == 0
    :: atomic { !killed -> killed = 1; dead[2] = 1 }
#endif
#if KILL == 3 || KILL == 0
    :: atomic { !killed -> killed = 1; dead[3] = 1 }
#endif
#if KILL == 0
    :: atomic { !killed -> killed = 1; dead[4] = 1 }
#endif
    :: skip
    fi
}

init {
    byte s, c, me, n_reaped, n_free;
    bit stole, wasw;
    atomic {
        s = 0;
        do
        :: s < NSLOTS -> fq[s] = s; s++
        :: else -> break
        od;
        fqt = NSLOTS;
        run producer(1);
#if NPROD == 2
        run producer(2);
#endif
        run consumer(3);
#if NCONS == 2
        run consumer(4);
#endif
        run stopper(); run killer()
    }
    _nr_pr == 1;                                       /* everyone else has ended */
    me = 6;                                            /* what the dead left: take over, reap */
    killed = 1;                                        /* (init is not killed: CUT never fires) */
    reap();
    /* every slot FREE in the free queue or READY in the ready queue, exactly
     * once; READY ones left only if no consumer lived to the end */
    assert(jv == 0 && lk == 0 && n_write == 0);
    assert(rqh == rqt || (dead[3] && NCONS == 1));
    assert((fqt + QM - fqh) % QM + (rqt + QM - rqh) % QM == NSLOTS);
    s = 0;
    do
    :: s < NSLOTS ->
        assert(owner[s] == 0);
        n_free = 0;
        c = fqh;
        do
        :: c != fqt -> if :: fq[c % NSLOTS] == s -> assert(state[s] == FREE); n_free++ :: else -> skip fi; c = (c + 1) % QM
        :: else -> break
        od;
        c = rqh;
        do
        :: c != rqt -> if :: rq[c % NSLOTS] == s -> assert(state[s] == RR); n_free++ :: else -> skip fi; c = (c + 1) % QM
        :: else -> break
        od;
        assert(n_free == 1);
        s++
    :: else -> break
    od;
    assert(taken + (rqt + QM - rqh) % QM == published)
}
