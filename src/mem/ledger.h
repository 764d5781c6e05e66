// Copy ledger (public API in nanomind.h, "copy ledger" section).
//
// A table of (from, to) -> bytes, copies counters, indexed by endpoint ids
// handed out by nm_ledger_endpoint. Counting is one relaxed fetch_add per
// counter: copies are counted, not ordered, so nothing stronger is needed;
// readers may see a copy's bytes before its count (documented as such).
#ifndef NM_MEM_LEDGER_H
#define NM_MEM_LEDGER_H

#include "nanomind.h"

#endif
