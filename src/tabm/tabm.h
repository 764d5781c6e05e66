// TABM: the Token-Aware Buffer Manager ring (public API in nanomind.h).
//
// Shared layout (one memfd, offsets from its start; fixed by TABM_VERSION):
//   [ctl]      magic "NMTABM", version, geometry, the queue indices, the futex
//              words, shutdown flag, stats; each hot word on its own 128-byte line
//   [hdr]      n_slots x tabm_hdr (128 bytes): state word + nm_tabm_meta
//   [freeq]    qcap cells: indices of FREE slots          (bounded MPMC queue,
//   [readyq]   qcap cells: indices of READY_TO_READ slots  D. Vyukov's design)
//   [payload]  n_slots x stride bytes, page-aligned start, 128-byte (or page) stride
//
// A slot index lives in exactly one place at a time: the free queue, a
// writer's hands, the ready queue, or a reader's hands. Both queues have room
// for every index (qcap >= n_slots), so a push never finds them full. Reading
// in publish order is the ready queue's FIFO order; "publish" is the moment a
// writer claims its ticket in that queue, and the ticket is the slot's seq.
//
// The protocol is modelled in tests/spin/tabm.pml; the transition labels of
// the model (W0..W3, R1..R3, S1, SLEEP/WAKE) are named at the matching lines
// of tabm.c.
#ifndef NM_TABM_TABM_H
#define NM_TABM_TABM_H

#include "nanomind.h"

// Slot states in the low 2 bits of the slot's state word; the rest is a
// generation bumped on every return to FREE, so a stale handle cannot act on
// the slot's next life.
enum { NM_TABM_FREE = 0, NM_TABM_ALLOCATED_FOR_WRITE = 1, NM_TABM_READY_TO_READ = 2,
       NM_TABM_ALLOCATED_FOR_READ = 3 };

// State of a slot now (for tests and debugging); -1 if index is out of range.
int nm_tabm_slot_state(const nm_tabm *r, uint32_t index);

#endif
