// umem: the unified-memory pool (public API in nanomind.h, "umem" section).
//
// Where a buffer comes from, in order of preference (each can be disallowed):
//   dma-buf heap  ioctl(DMA_HEAP_IOCTL_ALLOC) on /dev/dma_heap/<heap>; devices
//                 import the fd (GPU/NPU drivers), CPU access is bracketed by
//                 DMA_BUF_IOCTL_SYNC (see linux/dma-buf.h).
//   memfd         memfd_create + ftruncate, then F_SEAL_SHRINK|F_SEAL_GROW so
//                 an importer can trust the size it maps (a shrink would turn
//                 its accesses past the new end into SIGBUS).
//   anon          MAP_SHARED|MAP_ANONYMOUS: shared with forked children only.
// Every buffer is its own mapping; alignment above a page is obtained by
// reserving size + align of address space and mapping at the aligned address.
#ifndef NM_MEM_UMEM_H
#define NM_MEM_UMEM_H

#include <stdint.h>

#include "core/clock.h"
#include "nanomind.h"

// Maps fd (size bytes, shared, read-write) at an address aligned to align.
// Returns MAP_FAILED on failure (errno set).
// Marks b as held by a structure built in it (a TABM ring): nm_umem_free of
// its pool leaves it (and the pool) alive until nm_umem_buf_free(b).
void nm_umem_hold(nm_umem_buf *b);

void *nm_umem_map_aligned(int fd, size_t size, size_t align);
void nm_umem_unmap_aligned(void *p, size_t size);

#endif
