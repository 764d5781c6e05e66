// TABM: the Token-Aware Buffer Manager ring (public API in nanomind.h).
//
// Shared layout (one memfd, offsets from its start; fixed by TABM_VERSION):
//   [ctl]      magic "NMTABM", version, geometry, the futex words, the shutdown
//              flag, the ring lock with its journal, the queue indices and
//              counts, stats; hot words on their own 128-byte lines
//   [hdr]      n_slots x tabm_hdr (128 bytes): state word, holder's pid, nm_tabm_meta
//   [freeq]    qcap cells: indices of FREE slots           (FIFO arrays,
//   [readyq]   qcap cells: indices of READY_TO_READ slots   changed under the lock)
//   [payload]  n_slots x stride bytes, page-aligned start, 128-byte (or page) stride
//
// A slot index lives in exactly one place at a time: the free queue, a
// writer's hands, the ready queue, or a reader's hands. Both queues have room
// for every index (qcap >= n_slots), so a push never finds them full. Reading
// in publish order is the ready queue's FIFO order; a slot's seq is its
// position there.
//
// Every step of a slot's life is one short critical section under a lock
// whose word holds the owner's pid; each section journals what it changes
// first, so a process killed inside one is undone by whoever takes the lock
// over (dead owner), and slots held by a dead process are reaped. Waiting
// (full, empty) is on futex words outside the lock.
//
// The protocol is modelled in tests/spin/tabm.pml, with processes that may be
// killed at any step; the transition labels of the model (L1, J1, J2, REC,
// REAP, W0..W3, R1..R3, S1, SLEEP/WAKE) are named at the matching lines of tabm.c.
#ifndef NM_TABM_TABM_H
#define NM_TABM_TABM_H

#include "nanomind.h"

// Slot states in the low 2 bits of the slot's state word; the rest is a
// generation bumped on every return to FREE, so a stale handle cannot act on
// the slot's next life.
enum { NM_TABM_FREE = 0, NM_TABM_ALLOCATED_FOR_WRITE = 1, NM_TABM_READY_TO_READ = 2,
       NM_TABM_ALLOCATED_FOR_READ = 3 };

// Tests: when > 0, counts down at every step inside the ring's critical
// sections (lock taken, journal written, each store, journal cleared; and
// after publish's, before its wake) and kills this process with SIGKILL at 0 (tests/unit/test_tabm_deadpeer.c).
extern _Atomic int nm_tabm_crash_countdown;

// Checks the ring's bookkeeping under its lock (taking it over from a dead
// owner first): every slot FREE in the free queue, READY in the ready queue,
// or held by a process, each exactly once; the counts agree; no journal left.
nm_status nm_tabm_check(nm_tabm *r, char *err, size_t err_size);

// State of a slot now (for tests and debugging); -1 if index is out of range.
int nm_tabm_slot_state(const nm_tabm *r, uint32_t index);

#endif
