/* secondary_int.h: what the files of the secondary share and no one else
 * sees: its state L (counts, and what it learnt of the kernel), the small
 * helpers of its large path (inline here), and the calls between its files:
 * secondary.c (the core: burial, the quarantine's victims, set-up), and
 * large_free.c (the lookup and the retiring of a chunk that left the user).
 * Included by secondary.c, large_alloc.c, large_free.c and large_realloc.c
 * only; their invariants are stated in secondary.c.
 */
#ifndef QM_SECONDARY_INT_H
#define QM_SECONDARY_INT_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "belt.h"
#include "large.h"
#include "large_record.h"
#include "options.h"
#include "quarantine.h"
#include "report.h"
#include "stack.h"
#include "strategy.h"

/* The secondary's own state (under S.lock, but init_lock): what it
 * counts, and what it learnt of the kernel. Defined in secondary.c. */
typedef struct qm_sec {
  qm_lock_t init_lock;
  size_t live, live_bytes;
  uint64_t allocs, reuses, fresh, avoided, in_place, moved;
  uint64_t unmaps, drops, buried;     /* chunks unmapped, that lost their pages, buried */
  uint64_t belt_fresh, belt_moves;    /* belt chunks carved, reuses by move */
  uint64_t belt_pooled;               /* frees whose pages moved to the mirror */
  uint64_t belt_gathers, belt_pieces; /* reuses assembled from pieces, and those */
  bool no_dontunmap;                  /* mremap refused MREMAP_DONTUNMAP: no belt, no move */
} qm_sec_t;
extern QM_HIDDEN qm_sec_t qm__sec;
#define L qm__sec

/* A stack captured on the way in, before any lock (unwinding takes none of
 * qmalloc's, but may take the loader's). */
static inline void trace_capture(trace_t *t) {
  t->n = LF.frames ? qm__stack_capture_unlocked(t->pc, LF.frames) : 0;
  t->tid = LF.frames ? qm__thread_id() : 0;
}

/* A live chunk's tail (tail_pages) counts against the quarantine's
 * resident budget from its hand-out or resize to its free or resize; most
 * chunks have none. */
static inline void tail_add(const block_t *b) {
  size_t n = tail_pages(b);
  if (n)
    qm__q_tail_add(n);
}
static inline void tail_sub(const block_t *b) {
  size_t n = tail_pages(b);
  if (n)
    qm__q_tail_sub(n);
}

/* The bytes live chunks were asked for, changed by `add` and `sub` (under
 * S.lock): the quarantine's resident budget follows them (qm__q_live). */
static inline void live_bytes(size_t add, size_t sub) {
  L.live_bytes = L.live_bytes + add - sub;
  qm__q_live(L.live_bytes);
}

/* How densely the program writes its large chunks, in 256ths (defined,
 * and explained, in secondary.c). */
#define DENSE_ONE 256u
extern QM_HIDDEN _Atomic uint32_t qm__sec_density;

static inline bool thp_dense(void) {
  return atomic_load_explicit(&qm__sec_density, memory_order_relaxed) >= DENSE_ONE / 2;
}

/* Chunks that keep their pages across reuse (protect, none) and span a
 * transparent huge page get one: each of its 512 pages then changes
 * protection with one PMD, and is touched again at the cost of one; a 4 KiB
 * page costs a PTE each, and on a VM a shadow-table sync each. Linux 6.2+
 * keeps PMD-mapped THP writable through mprotect(RW) (the probe's
 * fast_thp); before that, one fault per 2 MiB instead of 512. */
static inline bool want_thp(size_t cap_pages) {
  return LF.thp_size && qm__opt.thp_min_mb && thp_dense() &&
         (LF.strategy == QM_STRATEGY_PROTECT || LF.strategy == QM_STRATEGY_NONE) &&
         cap_pages << qm__page_shift >= qm__opt.thp_min_mb << 20 &&
         cap_pages << qm__page_shift >= LF.thp_size;
}

/* The THP advice of a fresh mapping: 1 asks for huge pages, -1 refuses them
 * where thp_min_mb=0 says never (under THP "always" the kernel would give
 * them to every aligned 2 MiB of the chunk otherwise), 0 leaves the default. */
static inline int thp_advice(size_t cap_pages) {
  if (want_thp(cap_pages))
    return 1;
  return LF.thp_size && !qm__opt.thp_min_mb && cap_pages << qm__page_shift >= LF.thp_size ? -1 : 0;
}

/* Whether a chunk of cap pages comes from the belt: under protect, while
 * window_gb asks for it, and not a chunk that is never reused (those are
 * unmapped when they leave the quarantine: address space goes back). */
static inline bool use_belt(size_t cap, bool noreuse) {
  return LF.strategy == QM_STRATEGY_PROTECT && !noreuse && qm__belt_on() && !L.no_dontunmap &&
         cap << qm__page_shift < qm__opt.unmap_threshold_mb << 20;
}

/* A chunk's extra mappings (extra_vmas) with `more`, saturating: past
 * MAX_GATHER_VMAS it is never gathered from, whatever the count. */
static inline uint8_t more_vmas(uint8_t had, unsigned more) {
  return (uint8_t)(had + more < UINT8_MAX ? had + more : UINT8_MAX);
}

static inline void *fail_enomem(void) {
  errno = ENOMEM;
  return NULL;
}

/* A chunk the belt should carry takes a mapping of its own (no room on the
 * belt even grown, or its address space refused under RLIMIT_AS): its
 * range would come back after quarantine_min_frees, inside the window.
 * Under hardening=max the request fails instead (false); else the break is
 * counted in window_breaks (under S.lock, as the quarantine's) and warned
 * of once. */
static inline bool may_leave_window(void) { return qm__opt.hardening != QM_HARDENING_MAX; }

/* secondary.c */
void qm__sec_note_density(const block_t *b);
int qm__sec_open_afresh(uintptr_t p, size_t len, int adv);
uint32_t qm__sec_carve_locked(size_t cap, size_t align, qm_range_t *r);
void qm__sec_uncarve(uint32_t i, const qm_range_t *r);
void qm__sec_left_window(void);
bool qm__sec_bury_locked(uint32_t i, bool clean);
void qm__sec_entomb_locked(uint32_t i);
void qm__sec_bury(uint32_t i);
void qm__sec_discard_block(uint32_t i);
void qm__sec_enforce_all(size_t extra_maps);
bool qm__sec_unmap_all(bool unaged_too);
void qm__sec_ensure_ready(void);

/* large_free.c */
uint32_t qm__sec_find_live_locked(void *p, qm_op_t op);
bool qm__sec_unmap_on_free(const block_t *b);
void qm__sec_retire_block(uint32_t i, bool unmap_now);

#endif
