/* SPDX-License-Identifier: MIT (see LICENSE; installed in share/doc/qmalloc) */
/* qmalloc.h: the public API of qmalloc, a hardened malloc for Linux whose
 * large chunks sit in a PROT_NONE quarantine after free, so a dangling
 * pointer faults at once. libqmalloc.so and libqmalloc.a export the libc
 * names (malloc, free, ...) as aliases of the qm_ functions below.
 *
 * Return convention: functions returning a pointer return NULL and set errno
 * (ENOMEM when memory, address space or mappings run out; EINVAL for an
 * invalid alignment). qm_posix_memalign returns the error number instead.
 * An invalid or double free never returns: qmalloc prints one line,
 *   qmalloc: ERROR: <what> 0x<ptr> (<details>)
 * and aborts.
 */
#ifndef QMALLOC_H
#define QMALLOC_H

#include <malloc.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QMALLOC_VERSION "0.1.0"

/* The malloc family. Requests of at least large_threshold_kb (128 KiB by
 * default) are large chunks: each has its own mapping between guard pages,
 * and after free it is quarantined before any reuse. */
void *qm_malloc(size_t size);
void qm_free(void *ptr);
void *qm_calloc(size_t nmemb, size_t size);
void *qm_realloc(void *ptr, size_t size);
void *qm_reallocarray(void *ptr, size_t nmemb, size_t size);
int qm_posix_memalign(void **out, size_t alignment, size_t size);
void *qm_aligned_alloc(size_t alignment, size_t size);
void *qm_memalign(size_t alignment, size_t size);
void *qm_valloc(size_t size);
void *qm_pvalloc(size_t size);
size_t qm_malloc_usable_size(void *ptr);
/* C23: size (and alignment) must be what the chunk was allocated with; a
 * size that does not fit the chunk is reported and aborts. */
void qm_free_sized(void *ptr, size_t size);
void qm_free_aligned_sized(void *ptr, size_t alignment, size_t size);
/* The bytes from ptr to the end of the live chunk that holds it (ptr may
 * point anywhere inside; the end is the requested size), 0 if that chunk is
 * free or ptr is in its header or slack, SIZE_MAX for memory qmalloc does not
 * manage: what a bounds check needs (hardened_malloc's name). */
size_t qm_malloc_object_size(const void *ptr);
struct mallinfo2 qm_mallinfo2(void);
/* Gives back every page it can: the calling thread's cache, free pages of
 * small-chunk classes, the pages of quarantined large chunks. Returns 1 if
 * memory was released. */
int qm_malloc_trim(size_t pad);
/* Prints qm_stats() in words to stderr. */
void qm_malloc_stats(void);

/* How freed large chunks are quarantined and reused. */
typedef enum qm_strategy {
  QM_STRATEGY_PROTECT = 1, /* mprotect NONE on free, RW on reuse: pages kept */
  QM_STRATEGY_DISCARD = 2, /* pages dropped on free (fresh PROT_NONE mapping) */
  QM_STRATEGY_GUARD = 3,   /* MADV_GUARD_INSTALL on free, _REMOVE on reuse */
  QM_STRATEGY_UNMAP = 4,   /* munmap on free, fresh mmap for every chunk */
  QM_STRATEGY_NONE = 5     /* quarantine off: freed chunks reused at once */
} qm_strategy_t;
const char *qm_strategy_name(int strategy);

/* How the belt (window_gb) reuses a freed chunk's pages at another address. */
typedef enum qm_belt_way {
  QM_BELT_IN_PLACE = 0, /* no belt: chunks reused in place (no fault-free way) */
  QM_BELT_PROTECT = 1,  /* pages wait PROT_NONE at the freed address, moved at
                           reuse, then opened with mprotect(RW): fault-free
                           only with the mprotect fast path */
  QM_BELT_MOVE = 2      /* pages moved away RW at free to a pool the program
                           never sees, the freed range mapped afresh PROT_NONE,
                           and moved back at reuse: no mprotect, fault-free on
                           any kernel with MREMAP_DONTUNMAP (5.7+) */
} qm_belt_way_t;
const char *qm_belt_way_name(int way);

/* What the kernel does when a PROT_NONE range is made PROT_READ|PROT_WRITE
 * again, found by counting minor faults, never from the version number. */
typedef struct qm_probe_result {
  int measured;      /* 0: the probe option forced the verdict */
  int fast_dirty;    /* written (dirty) exclusive anonymous pages become
                        writable during mprotect: Linux 6.0+ */
  int fast_clean;    /* clean exclusive anonymous pages too: 6.2+;
                        -1 when it could not be measured */
  int fast_thp;      /* PMD-mapped transparent huge pages too: 6.2+;
                        -1 when not measured or THP is unavailable */
  int guard_regions; /* MADV_GUARD_INSTALL works: 6.13+ */
  unsigned pages;    /* pages written in each test */
  long faults_first; /* faults writing them the first time (= pages) */
  long faults_dirty; /* faults rewriting them after NONE -> RW */
  long faults_clean; /* the same after MADV_FREE made them clean */
  long faults_thp;   /* rewriting a 2 MiB THP after NONE -> RW; -1 n/a */
  uint64_t probe_ns; /* what the probe cost */
  int strategy;      /* qm_strategy_t qmalloc chose */
  char reason[192];  /* why, in words */
  char kernel[65];   /* uname release */
  /* the belt's reuse (window_gb): faults rewriting the written pages after
     mremap(MREMAP_DONTUNMAP) moved them to a fresh range, PROT_NONE and
     then opened with mprotect(RW) (pages that waited at the freed
     address), and RW, moved away and back with no mprotect at all (pages
     moved at free); -1 where it could not be measured (no MREMAP_DONTUNMAP
     before Linux 5.7). */
  long faults_move_protect, faults_move_rw;
  /* qm_belt_way_t the belt reuses pages by where it runs (window_gb), and
     why, in words */
  int belt_way;
  char belt_reason[160];
} qm_probe_result_t;

/* The verdict the allocator runs on (probing on first call). */
const qm_probe_result_t *qm_probe_result(void);
/* Runs the probe afresh into *out; full adds the THP test (maps 4 MiB).
 * Does not change the allocator's verdict. Returns 0, or an errno. */
int qm_probe_run(qm_probe_result_t *out, int full);

/* Measures one retire + reuse cycle of a `bytes`-sized range with the given
 * strategy, writing every page on each reuse (touch_pages = 0: none; else
 * that many pages), `iters` times after one warm-up. Reports minor faults
 * per iteration (x1000, exact) and the median ns of an iteration. */
int qm_strategy_cost(int strategy, size_t bytes, unsigned touch_pages, unsigned iters,
                     uint64_t *faults_x1000, uint64_t *median_ns);

/* The same for the belt's ways (QM_BELT_PROTECT, QM_BELT_MOVE): a chunk of
 * `bytes` freed and reused at the next place of a reservation, its pages
 * moved there, every page rewritten, `iters` times after one warm-up (the
 * dead ranges are mapped afresh outside the timing, as the belt does in
 * batches). EINVAL for another way; ENOMEM, or EINVAL without
 * MREMAP_DONTUNMAP (Linux 5.7). */
int qm_belt_way_cost(int way, size_t bytes, unsigned iters, uint64_t *faults_x1000,
                     uint64_t *median_ns);

typedef struct qm_stats {
  /* syscalls qmalloc made, by kind; skipped: protection changes not made
     because they were empty or a no-op */
  uint64_t sys_mmap, sys_munmap, sys_mprotect, sys_madvise, sys_mremap, sys_skipped;
  /* large chunks */
  uint64_t large_live_chunks, large_live_bytes; /* requested bytes */
  uint64_t large_mapped_bytes;                  /* mappings, guards included */
  uint64_t quarantine_chunks, quarantine_bytes; /* usable bytes */
  uint64_t quarantine_resident_bytes;           /* pages still held */
  uint64_t large_allocs, large_frees, reuses, fresh_maps, unmaps, drops;
  uint64_t faults_avoided; /* pages reused resident and writable: each would
                              have been a fault without the fast path */
  uint64_t realloc_in_place, realloc_moved;
  uint64_t mappings_estimate, mappings_budget;
  /* small chunks */
  uint64_t small_reserved, small_committed, small_in_use, small_free, small_purged;
  uint64_t threads;
  int strategy;
  /* guarded slots (sample_rate, guard_all) */
  uint64_t guarded_live_chunks, guarded_live_bytes; /* requested bytes */
  uint64_t guarded_quarantine_chunks, guarded_quarantine_resident_bytes;
  uint64_t guarded_allocs, guarded_frees, guarded_reuses;
  uint64_t guarded_skipped; /* requests that wanted a slot and got an ordinary chunk */
  uint64_t guarded_mappings_estimate, guarded_mappings_budget;
  int guarded_markers; /* 1: guard pages are MADV_GUARD_INSTALL markers (Linux 6.13+) */
  /* page drops the kernel refused with madvise on locked pages (mlock,
     mlockall), made by mapping the range afresh instead */
  uint64_t locked_remaps;
  /* large chunks that left the window early: freed ones unmapped before
     their quarantine window passed, and ones the belt should carry given
     mappings of their own (out of memory, address space or mappings;
     default profile only, warned of once; hardening=max fails instead) */
  uint64_t window_breaks;
  /* the belt large chunks are carved from (window_gb): the part in use, the
     window in force (bytes carved before a freed range comes back), the
     mappings its dead ranges may hold now; chunks carved fresh from it, and
     reuses that moved a freed chunk's pages to a range carved afresh */
  uint64_t belt_reserved_bytes, belt_window_bytes, belt_mappings;
  uint64_t belt_fresh, belt_moves;
  /* qm_belt_way_t in force (QM_BELT_IN_PLACE without a belt), and the frees
     whose pages moved to the belt's pool (belt_way=move) */
  int belt_way;
  uint64_t belt_pooled;
  /* reuses that assembled a chunk from pieces of pooled chunks (several of
     them, or a part of one), and the pieces moved for them */
  uint64_t belt_gathers, belt_pieces;
} qm_stats_t;
void qm_stats(qm_stats_t *out);

/* Describes what qmalloc knows of addr (e.g. "offset 16 in freed large chunk
 * of 131072 bytes at 0x..."), NUL-terminated into buf. Returns 1 if addr is
 * in memory qmalloc manages, else 0. Async-signal-safe. */
int qm_describe(const void *addr, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
