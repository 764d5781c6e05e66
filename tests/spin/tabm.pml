/* Promela model of the TABM slot protocol (src/tabm/tabm.c), checked with spin
 * by tests/spin/run_spin.sh for 2 producers x 2 consumers.
 *
 * What is modelled, step for step with the C code (labels [W0].. are named
 * at the matching lines of tabm.c):
 *   - slot states FREE / ALLOCATED_FOR_WRITE / READY_TO_READ / ALLOCATED_FOR_READ
 *   - the free and ready queues of slot indices (FIFO; each push and pop is
 *     one atomic step: the Vyukov queue is linearizable, and a pop that finds
 *     a push half done behaves as a pop before that push, which the model
 *     covers since the pusher signals only after its push completes)
 *   - the `writers` count and the shutdown flag, read and written as the C
 *     code does (separate seq_cst loads, no more atomicity than it has)
 *   - futex sleeping: an event word, a sleepers count, FUTEX_WAIT (sleeps only
 *     if the word still holds the value seen) and FUTEX_WAKE (all sleepers)
 *   - shutdown at any moment
 * Checked:
 *   - no deadlock, and shutdown wakes everyone: every run ends with every
 *     process at its end (spin's invalid-end-state check)
 *   - no slot lost: at the end every slot is FREE and back in the free queue,
 *     and every published message was read
 *   - none read twice; per-producer order kept (each consumer sees each
 *     producer's messages in increasing order; the queue is FIFO overall)
 *   - every state change starts from the state the protocol says
 * Mutants (-DBUG_NO_WRITERS: readers stop on shutdown without waiting for
 * writers; -DBUG_NO_SLEEPERS: the waker skips the wake when it reads no
 * sleepers before the waiter counts itself; -DBUG_W3_EARLY: a publisher stops
 * counting itself before its slot is in the ready queue, so a reader can see
 * shutdown, no writer and an empty queue, and lose the message;
 * -DBUG_R3_NO_SECOND_LOOK: a reader that found the queue empty stops on
 * shutdown without looking again, losing what was pushed meanwhile) must fail:
 * run_spin.sh checks it.
 */

#ifndef NSLOTS
#define NSLOTS 2
#endif
#define NP 2
#ifndef EVMOD
#define EVMOD 8      /* futex words count modulo this (32-bit in C; ABA needs EVMOD wakes between a load and a sleep) */
#endif
#define NC 2
#ifndef K
#define K 2          /* messages per producer */
#endif

#define FREE 0
#define AW 1
#define RR 2
#define AR 3

byte state[NSLOTS];
byte msg_p[NSLOTS], msg_i[NSLOTS];   /* the payload: which message the slot carries */
chan freeq = [NSLOTS] of { byte };
chan readyq = [NSLOTS] of { byte };

bit shutdown;
byte writers;
byte published, nread;
bit was_read[NP * K];

/* futex words and sleepers */
byte ev_free, ev_ready;
byte sl_free, sl_ready;
bit asleep_p[NP], asleep_c[NC];

/* [WAKE_F] / [WAKE_R]: word++, then wake all if anyone counts as sleeping */
inline signal_free() {
    ev_free = (ev_free + 1) % EVMOD;
    if
    :: sl_free > 0 -> d_step { asleep_p[0] = 0; asleep_p[1] = 0 }
    :: else -> skip
    fi
}
inline signal_ready() {
    ev_ready = (ev_ready + 1) % EVMOD;
    if
    :: sl_ready > 0 -> d_step { asleep_c[0] = 0; asleep_c[1] = 0 }
    :: else -> skip
    fi
}

/* [SLEEP_F]: sleepers++, re-check the word, FUTEX_WAIT while unchanged */
inline wait_free(seen) {
#ifndef BUG_NO_SLEEPERS
    sl_free++;
#endif
    do
    :: ev_free == seen ->
        atomic { if :: ev_free == seen -> asleep_p[me] = 1 :: else -> skip fi }  /* FUTEX_WAIT */
        asleep_p[me] == 0
    :: else -> break
    od;
#ifndef BUG_NO_SLEEPERS
    sl_free--
#endif
}
inline wait_ready(seen) {
#ifndef BUG_NO_SLEEPERS
    sl_ready++;
#endif
    do
    :: ev_ready == seen ->
        atomic { if :: ev_ready == seen -> asleep_c[me] = 1 :: else -> skip fi }
        asleep_c[me] == 0
    :: else -> break
    od;
#ifndef BUG_NO_SLEEPERS
    sl_ready--
#endif
}

/* [W3] on the paths that leave without publishing: writers--, and after
 * shutdown tell the readers (they may be waiting for the last writer) */
inline writer_leave() {
    writers--;
    if
    :: shutdown -> signal_ready()
    :: else -> skip
    fi
}

proctype producer(byte me) {
    byte i = 0, idx, seen;
    bit got;
    do
    :: i == K -> break
    :: else ->
        seen = ev_free;
        writers++;                                     /* [W0] */
        if
        :: shutdown -> writer_leave(); break           /* NM_ERR_SHUTDOWN */
        :: else -> skip
        fi;
        atomic {                                       /* [W1] take a FREE slot */
            if
            :: nempty(freeq) -> freeq?idx; got = 1
            :: empty(freeq) -> got = 0
            fi
        }
        if
        :: got ->
            assert(state[idx] == FREE);
            state[idx] = AW;
            msg_p[idx] = me; msg_i[idx] = i;           /* write the payload */
            assert(state[idx] == AW);                  /* [W2] publish: AW -> RR, push */
            state[idx] = RR;
#ifndef BUG_W3_EARLY
            atomic { readyq!idx; published++ }
            writers--;                                 /* [W3] */
#else
            writers--;                                 /* [W3] before the push */
            atomic { readyq!idx; published++ }
#endif
            signal_ready();
            i++
        :: else ->
            writer_leave();                            /* full: backpressure */
            wait_free(seen)
        fi
    od;
end_p:
    skip
}

proctype consumer(byte me) {
    byte idx, seen, m;
    short last[NP];
    bit got;
    last[0] = -1; last[1] = -1;
    do
    :: seen = ev_ready;
        atomic {                                       /* [R1] take the oldest READY slot */
            if
            :: nempty(readyq) -> readyq?idx; got = 1
            :: empty(readyq) -> got = 0
            fi
        }
        if
        :: !got ->                                     /* [R3] shut down and no writer left? */
            if
            :: shutdown ->
#ifndef BUG_NO_WRITERS
                if
                :: writers == 0 ->
#endif
#ifndef BUG_R3_NO_SECOND_LOOK
                    atomic {                           /* one more look: pushed before the last writer left */
                        if
                        :: nempty(readyq) -> readyq?idx; got = 1
                        :: empty(readyq) -> got = 0
                        fi
                    }
#endif
                    if
                    :: !got -> break                   /* NM_ERR_SHUTDOWN */
                    :: else -> skip
                    fi
#ifndef BUG_NO_WRITERS
                :: else -> skip
                fi
#endif
            :: else -> skip
            fi
        :: else -> skip
        fi;
        if
        :: got ->
            assert(state[idx] == RR);                  /* [R1] RR -> AR */
            state[idx] = AR;
            m = msg_p[idx] * K + msg_i[idx];
            assert(!was_read[m]);                      /* none read twice */
            was_read[m] = 1;
            assert(msg_i[idx] > last[msg_p[idx]]);     /* per-producer order */
            last[msg_p[idx]] = msg_i[idx];
            nread++;
            assert(state[idx] == AR);                  /* [R2] release: AR -> FREE, push */
            state[idx] = FREE;
            freeq!idx;
            signal_free()
        :: else ->
            wait_ready(seen)                           /* [SLEEP_R] */
        fi
    od;
end_c:
    skip
}

proctype stopper() {
    shutdown = 1;                                      /* [S1] */
    signal_free();
    signal_ready()
}

init {
    byte s;
    atomic {
        s = 0;
        do
        :: s < NSLOTS -> freeq!s; s++
        :: else -> break
        od;
        run producer(0); run producer(1);
        run consumer(0); run consumer(1);
        run stopper()
    }
    _nr_pr == 1;                                       /* everyone else has ended */
    /* no slot lost */
    assert(len(freeq) == NSLOTS && len(readyq) == 0 && writers == 0);
    s = 0;
    do
    :: s < NSLOTS -> assert(state[s] == FREE); s++
    :: else -> break
    od;
    assert(nread == published)
}
