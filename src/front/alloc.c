/* alloc.c: the malloc family behind qmalloc.h: dispatch between the primary
 * (requests below the large threshold) and the secondary, alignment,
 * calloc, realloc, usable sizes and sized frees. The fast paths of qm_malloc
 * and qm_free touch only the calling thread's cache: no syscall, no lock, no
 * atomic read-modify-write. Everything else is in the _slow functions.
 */
#include <errno.h>
#include <string.h>

#include "alloc.h"
#include "boot.h"
#include "cache.h"
#include "guarded.h"
#include "init.h"
#include "large_report.h"
#include "options.h"
#include "primary.h"
#include "qmalloc.h"
#include "report.h"
#include "secondary.h"
#include "smallstate.h"
#include "zero.h"

/* ---- small chunks ---- */

/* What a small chunk for n bytes aligned to align (> 16) must hold: room
 * for the offset (a chunk is only 16-aligned); the class adds the canary's
 * 8. Its class is the one such a chunk is in (see small_alloc_plain):
 * free_aligned_sized checks it. */
static size_t aligned_req(size_t n, size_t align) { return n + align - QM_MIN_ALIGN; }

/* A small chunk for n bytes aligned to align (<= 16: the natural alignment).
 * A plain request falls back to larger classes when a class's region is
 * exhausted; an over-aligned one goes to the secondary instead, so that its
 * class always follows from its size and alignment. */
static void *small_alloc_plain(size_t n, size_t align) {
  if (!n && align <= QM_MIN_ALIGN)
    return qm__zero_alloc();
  bool over = align > QM_MIN_ALIGN;
  size_t req = over ? aligned_req(n, align) : n;
  for (unsigned c = qm_class_of(req); c < QM_NCLASS; c++) {
    qm_bin_t *b = &qm__bin[c];
    uintptr_t s = b->count ? qm__bin_slot[c][--b->count] : qm__small_take_slow(c);
    if (s)
      return qm__small_hand_out(s, c, n, align);
    if (over)
      return qm__large_alloc(n, align, false);
  }
  errno = ENOMEM;
  return NULL;
}

/* The same, or a guarded slot under guard_all (over-aligned requests and the
 * slow path of malloc come here). */
static void *small_alloc(size_t n, size_t align) {
  if (QM_UNLIKELY(qm__opt.guard_all)) {
    void *g = qm__guarded_alloc(n, align > QM_MIN_ALIGN ? align : 0);
    if (g)
      return g;
  }
  return small_alloc_plain(n, align);
}

/* The countdown of qm_malloc reached zero: a guarded slot if it was due
 * (not on a thread's first malloc, which arms it), else an ordinary chunk,
 * as when no slot can be had. */
static QM_COLD void *sampled_malloc(size_t n) {
  /* the countdown re-armed either way; malloc(0) is never sampled: it is a
   * slot of the zero-size region, whose every byte faults, not 16 bytes of
   * a guarded slot (fuzz-api caught one at sample_rate's default). Under
   * guard_all every allocation is guarded, malloc(0) too. */
  uintptr_t was = qm_busy_enter();
  void *p = NULL;
  if (qm__sample_due() && (n || qm__opt.guard_all))
    p = qm__guarded_alloc(n, 0);
  if (!p)
    p = small_alloc_plain(n, 0);
  qm__busy_leave_applying(was);
  return p;
}

/* A large chunk for a call that is not malloc's slow path (calloc, the
 * aligned family), marked busy as that path is: a signal handler's free of
 * a large or guarded chunk landing in it takes the nested path. Unmarked,
 * it waited for good on the large side's lock the interrupted call held. */
static void *large_alloc_marked(size_t n, size_t align, bool zero) {
  uintptr_t was = qm_busy_enter();
  void *p = qm__large_alloc(n, align, zero);
  qm__busy_leave_applying(was);
  return p;
}

/* Marked busy throughout: a free from a signal handler landing here (while
 * a bin, the parked frees or a central list is half changed, or a lock is
 * held) takes the nested path. */
QM_COLD void *qm__malloc_slow(size_t n) {
  uintptr_t was = qm_busy_enter();
  void *p;
  qm__init();
  if (QM_UNLIKELY(qm__init_bootstrapping()))
    p = qm__boot_alloc(n);
  else if (qm__cache_checked && n && n < qm__small_limit && !qm__opt.guard_all)
    p = qm__small_malloc_checked(n); /* checked mode: every malloc comes here */
  else if (n < qm__small_limit)
    p = small_alloc(n, 0);
  else
    p = qm__large_alloc(n, 0, false);
  qm__busy_leave_applying(was);
  return p;
}

QM_EXPORT void *qm_malloc(size_t n) {
  if (QM_LIKELY(n < qm__small_limit)) {
    /* sampling's whole cost on this path (qm__small_limit is 0 until init,
     * so the sampled path runs initialised) */
    if (QM_UNLIKELY(!--qm__sample_left))
      return sampled_malloc(n);
    unsigned c = qm_class_of(n);
    qm_bin_t *b = &qm__bin[c];
    /* a free from a signal handler between the count's store and the
     * slot's load would put its chunk where this one is taken from: it
     * finds the mark and leaves the bin alone. The mark found is put back,
     * not cleared: a handler that mallocs while its thread was in free
     * must leave that free's mark for its own frees to find. */
    uintptr_t was = qm__freeing;
    qm_freeing_set(QM_BUSY);
    if (QM_LIKELY(b->count)) {
      uintptr_t s = qm__bin_slot[c][--b->count], ch = qm_slot_chunk(s);
      /* an entry of the cache must be in its class region: checked from
       * the address alone. Entries were checked in full when they entered
       * the cache (at free, or by the central list's arm), the cache's
       * arrays sit in guarded metadata, and the slot carries the chunk's
       * generation: the table entry is written, never read, here. */
      uintptr_t roff = ch - qm__class[c].base;
      if (QM_LIKELY(roff <= qm__rmask)) {
        /* s ^ ch: the generation, in place (QM_E_GEN_SHIFT is 48) */
        qm_entry_store(qm_entry_at(c, qm_chunk_index(roff, c)), qm__me | (s ^ ch) | (uint64_t)n);
        qm_store8(ch + n, qm_canary_of(s, c)); /* s: ch ^ gen << 48 */
        qm_freeing_restore(was);
        return (void *)ch;
      }
      qm__small_bad_pop(ch, c);
    }
    /* checked mode's bins never hold a chunk here: its own path, past the
     * default profile's (a test its misses alone pay; a tail call, so that
     * no register is saved on the hits) */
    if (qm__cache_checked)
      return qm__small_malloc_checked_fast(n, c, was);
    qm_freeing_restore(was);
  }
  return qm__malloc_slow(n);
}

/* Outside the primary: a large chunk, a sampled one, or one of init's
 * bootstrap chunks. Under the caller's mark. */
QM_COLD void qm__free_outside(void *p) {
  if (QM_UNLIKELY(qm__boot_owns(p))) {
    qm__boot_free(p); /* marked freed, never reused */
    return;
  }
  if (qm_guarded_owns(p)) {
    qm__guarded_free(p, QM_OP_FREE);
    return;
  }
  qm__large_free(p);
}

QM_EXPORT void qm_free(void *p) {
  uintptr_t a = (uintptr_t)p, off = a - qm__pbase;
  if (QM_UNLIKELY(qm__freeing)) { /* re-entered from a signal handler */
    qm__free_nested(p);
    return;
  }
  if (QM_LIKELY(off < qm__pspan)) {
    qm_freeing_set(a);
    /* checked mode checks at once, on a path of its own (before the fast
     * path's work: a test it did last before) */
    if (QM_UNLIKELY(qm__cache_checked)) {
      qm__small_free_slow(p, off);
      return;
    }
    unsigned c = (unsigned)(off >> qm__rshift);
    uintptr_t roff = off & qm__rmask;
    /* below the committed end: the entry is then in the committed table
     * even for a bad pointer (the zero-size region has nothing committed);
     * a pointer off a chunk boundary, misaligned ones included, fails the
     * boundary test below */
    if (QM_LIKELY(roff < qm_committed(c))) {
      const qm_class_info_t *ci = &qm__class[c];
      uintptr_t i = qm_chunk_index(roff, c);
      uint64_t *e = qm_entry_at(c, i), w = qm_entry_load(e);
      /* a chunk boundary; state ALLOC, offset 0 and owned by this thread in
       * one compare (a thread with no cache matches no entry). The owner is
       * the only thread that changes the entry: a plain store. */
      if (QM_LIKELY(i * ci->size == roff && (w & (QM_E_STATE | QM_E_OFF | QM_E_OWNER)) == qm__me)) {
        uint64_t fw = qm_e_freed_alloc(w);
        qm_entry_store(e, fw);
        /* the canary is checked QM_PEND_HALF..QM_PEND_N - 1 frees from now
         * (in a batch, qm__small_pend_batch): its line (cold
         * in a churn: the chunk was last touched at its malloc) arrives
         * meanwhile, and free does not wait for it */
        uintptr_t at = a + qm_e_size(w);
        __builtin_prefetch((void *)at);
        uint64_t k = qm__pend_i++;
        qm__pend_slot[k % QM_PEND_N] = qm_slot_make(a, qm_e_gen(fw));
        qm__pend_at[k % QM_PEND_N] = at | (uintptr_t)c << QM_ADDR_BITS;
        /* free's caller: an overflow the batch finds is reported as freed
         * there, where the program last held the chunk */
        qm__pend_by[k % QM_PEND_N] = (uintptr_t)__builtin_return_address(0);
        if (QM_UNLIKELY(!((k + 1) % QM_PEND_HALF)))
          qm__small_pend_batch(k + 1);
        qm_freeing_clear();
        return;
      }
    }
    qm__small_free_slow(p, off); /* other threads' chunks, over-aligned ones, every error */
    return;
  }
  if (p) {
    /* large and guarded frees take locks: a handler's free must not; what
     * handlers deferred meanwhile is applied as the mark is left (a thread
     * that only frees large chunks has no other place to apply it), plain
     * busy by then: the side turned it so as it made p the heap's
     * (qm_mark_released) */
    qm_freeing_set(a);
    qm__free_outside(p);
    qm__busy_leave_applying(0);
  }
}

/* ---- the rest of the family ---- */

static void *enomem(void) {
  errno = ENOMEM;
  return NULL;
}

QM_EXPORT void *qm_calloc(size_t nmemb, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(nmemb, size, &n))
    return enomem();
  qm__init();
  if (n >= qm__small_limit && !qm__init_bootstrapping())
    return large_alloc_marked(n, 0, true);
  void *p = qm_malloc(n);
  /* chunks checked to be zero at hand-out need no memset */
  if (p && n && !(qm__cache_checked && qm__opt.zero_on_free))
    memset(p, 0, n);
  return p;
}

/* Whether a request over-aligned to align (> 16) is served by the primary.
 * Over-aligned small chunks keep the offset in their table entry (12 bits of
 * 16-byte units: below 64 KiB). */
static bool aligned_is_small(size_t n, size_t align) {
  return n + align < qm__small_limit && align <= 65536;
}

static void *aligned(size_t align, size_t n) {
  if (align <= QM_MIN_ALIGN)
    return qm_malloc(n);
  if (n > QM_MAX_REQUEST || align > QM_MAX_REQUEST)
    return enomem();
  qm__init();
  if (QM_UNLIKELY(qm__init_bootstrapping()))
    return align <= QM_MIN_ALIGN ? qm__boot_alloc(n) : enomem();
  if (aligned_is_small(n, align)) {
    uintptr_t was = qm_busy_enter();
    void *p = small_alloc(n, align);
    qm__busy_leave_applying(was);
    return p;
  }
  return large_alloc_marked(n, align, false);
}

QM_EXPORT int qm_posix_memalign(void **out, size_t align, size_t n) {
  if (!qm_is_pow2(align) || align % sizeof(void *))
    return EINVAL;
  int saved = errno;
  void *p = aligned(align, n);
  int err = p ? 0 : errno;
  errno = saved;
  if (p)
    *out = p;
  return err;
}

QM_EXPORT void *qm_aligned_alloc(size_t align, size_t n) {
  if (!qm_is_pow2(align)) {
    errno = EINVAL;
    return NULL;
  }
  return aligned(align, n);
}

QM_EXPORT void *qm_memalign(size_t align, size_t n) {
  /* glibc rounds an alignment that is not a power of two up to one, and
   * answers EINVAL only where that would overflow (past 2^63); any other
   * alignment it cannot serve is ENOMEM, as for posix_memalign */
  if (align > ((size_t)1 << 63)) {
    errno = EINVAL;
    return NULL;
  }
  size_t a = QM_MIN_ALIGN;
  while (a < align)
    a <<= 1;
  return aligned(a, n);
}

QM_EXPORT void *qm_valloc(size_t n) {
  qm__init();
  return aligned(qm__page, n);
}

QM_EXPORT void *qm_pvalloc(size_t n) {
  qm__init();
  if (n > QM_MAX_REQUEST)
    return enomem();
  return aligned(qm__page, n ? qm_page_up(n) : qm__page);
}

/* What a chunk of any kind holds: its requested size, and the bytes the
 * program may write (the same for small chunks, whose canary sits right
 * after the request; whole pages for large ones). Reports a pointer that is
 * not a live chunk, naming op. */
typedef struct held {
  size_t size, usable;
  size_t align;         /* asked for at allocation, 16 for malloc's; 0: not recorded */
  qm_chunk_kind_t kind; /* for the report */
  bool large;
} held_t;

/* The lookups of the kinds that keep their state under a lock (zero-size,
 * start-up, sampled, large): marked busy, so that a signal handler's free landing
 * while the lock is held takes the nested path instead of waiting on it
 * (realloc's shrink of a large chunk hung so under a timer's frees). */
static QM_COLD held_t held_locked(qm_op_t op, void *p) {
  uintptr_t was = qm_busy_enter();
  held_t h;
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (off < qm__pspan) {
    h = (held_t){qm__zero_check(op, p), 0, QM_MIN_ALIGN, QM_CK_ZERO, false};
  } else if (qm__boot_owns(p)) {
    size_t n = qm__boot_size(p, op);
    h = (held_t){n, n, QM_MIN_ALIGN, QM_CK_BOOT, false};
  } else if (qm_guarded_owns(p)) {
    size_t align, n = qm__guarded_size(p, op, &align);
    h = (held_t){n, n, align, QM_CK_SAMPLED, false};
  } else {
    size_t align, n = qm__large_held(p, op, &align);
    h = (held_t){n, qm__large_usable(p, op), align, QM_CK_LARGE, true};
  }
  qm__busy_leave_applying(was);
  return h;
}

static held_t held_of(qm_op_t op, void *p) {
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (off < qm__pspan && (off >> qm__rshift) != QM_ZCLASS) {
    unsigned c;
    uint64_t *e, w;
    qm__small_check(op, p, off, &c, &e, &w);
    return (held_t){qm_e_size(w), qm_e_size(w), qm_e_align(w), QM_CK_SMALL, false};
  }
  return held_locked(op, p);
}

QM_EXPORT size_t qm_malloc_usable_size(void *p) {
  return p ? held_of(QM_OP_USABLE_SIZE, p).usable : 0;
}

/* Whether a size passed to a sized free names this chunk: the exact
 * requested size. C++'s operator new turns a request of 0 into 1, and its
 * aligned form may round the size up to the alignment: those are accepted
 * from the operator delete entry points (cxx). */
static bool size_names(size_t held, size_t passed, size_t align, bool cxx) {
  if (held == passed)
    return true;
  if (!cxx)
    return false;
  size_t one = passed ? passed : 1;
  return held == one || (align > 1 && qm_is_pow2(align) && one <= QM_MAX_REQUEST &&
                         held == qm_align_up(one, align));
}

/* Whether an alignment passed to an aligned free names the one chunk p
 * was allocated with: a power of two, exactly the alignment recorded at
 * allocation (every kind records it; zero-size and start-up chunks are
 * never over-aligned); up to 16 all name malloc's natural one. A chunk
 * that happens to sit on a larger boundary was not asked for it. */
static bool align_names(size_t align, const held_t *h) {
  return qm_is_pow2(align) && (align > QM_MIN_ALIGN ? align : QM_MIN_ALIGN) == h->align;
}

void qm__free_checked(const char *call, void *p, size_t align, size_t size, unsigned how) {
  if (!p)
    return;
  held_t h = held_of(QM_OP_FREE, p);
  bool sized = how & QM_FREE_SIZED, aligned = how & QM_FREE_ALIGNED;
  if ((sized && !size_names(h.size, size, align, how & QM_FREE_CXX)) ||
      (aligned && !align_names(align, &h))) {
    qm_kept_t k;
    qm__report_size_mismatch(call, p, sized, size, aligned, align, h.kind, h.size, h.align,
                             h.kind == QM_CK_LARGE ? qm__large_kept((uintptr_t)p, &k) : NULL);
  }
  qm_free(p);
}

QM_EXPORT void qm_free_aligned_sized(void *p, size_t align, size_t size) {
  qm__free_checked("free_aligned_sized", p, align, size, QM_FREE_SIZED | QM_FREE_ALIGNED);
}

QM_EXPORT void qm_free_sized(void *p, size_t size) {
  qm__free_checked("free_sized", p, 0, size, QM_FREE_SIZED);
}

/* Leaves realloc's mark (set whatever mark was there): back to was inside
 * another call's, which applies what handlers deferred; else cleared,
 * applying them under a plain busy mark (a large chunk moved is back in
 * the heap, and another thread's malloc may have its address now). */
static void realloc_leave(uintptr_t was) {
  if (was) {
    qm_freeing_restore(was);
    return;
  }
  qm_freeing_set(QM_BUSY);
  qm__busy_leave_applying(0);
}

QM_EXPORT void *qm_realloc(void *p, size_t n) {
  if (!p)
    return qm_malloc(n);
  if (!n) { /* glibc: realloc(p, 0) frees p and returns NULL */
    qm_free(p);
    return NULL;
  }
  /* p | QM_REALLOCING from the lookup to the end of the resize or of the
   * move's copy: a free of p from a signal handler in between reports (a
   * resize's store would undo it, a copy read a freed chunk), any other
   * takes the nested path, applied as the mark is left, and the lookups of
   * the kinds kept under a lock wait on no handler. Not held across the
   * move's free of p, which would find it. */
  uintptr_t was = qm__freeing, off = (uintptr_t)p - qm__pbase;
  qm_freeing_set((uintptr_t)p | QM_REALLOCING);
  size_t old_usable;
  if (off < qm__pspan && (off >> qm__rshift) != QM_ZCLASS) {
    unsigned c;
    uint64_t *e, w;
    uintptr_t ch = qm__small_check(QM_OP_REALLOC, p, off, &c, &e, &w);
    size_t cap = qm__class[c].size - QM_CANARY - qm_e_offset(w);
    /* in place while it fits, canary included, wastes at most half the
     * chunk, and this thread may change the entry */
    if (n <= cap && n >= cap / 2 && n < qm__small_limit && qm__small_resize(p, ch, c, e, w, n)) {
      realloc_leave(was);
      return p;
    }
    old_usable = qm_e_size(w); /* checked just now: the free below checks it again */
  } else if (off >= qm__pspan && !qm__boot_owns(p) && !qm_guarded_owns(p) && n >= qm__small_limit) {
    void *q = qm__large_realloc(p, n);
    realloc_leave(was);
    return q;
  } else {
    old_usable = held_of(QM_OP_REALLOC, p).usable;
  }
  void *q = qm_malloc(n);
  if (q) /* everything the program may have written comes along */
    memcpy(q, p, old_usable < n ? old_usable : n);
  realloc_leave(was);
  if (!q)
    return NULL;
  qm_free(p);
  return q;
}

QM_EXPORT void *qm_reallocarray(void *p, size_t nmemb, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(nmemb, size, &n))
    return enomem();
  return qm_realloc(p, n);
}

/* ---- object sizes, for bounds checks ---- */

QM_EXPORT size_t qm_malloc_object_size(const void *ptr) {
  uintptr_t a = (uintptr_t)ptr, off = a - qm__pbase;
  if (off < qm__pspan) {
    unsigned c = (unsigned)(off >> qm__rshift);
    uintptr_t roff = off & qm__rmask;
    if (c == QM_ZCLASS || roff >= qm_committed(c))
      return 0;
    uintptr_t i = qm_chunk_index(roff, c), ch = a - roff + i * qm__class[c].size;
    uint64_t w = qm_entry_load(qm_entry_at(c, i));
    if (qm_e_state(w) != QM_CHUNK_ALLOC)
      return 0;
    uintptr_t user = ch + qm_e_offset(w), end = user + qm_e_size(w);
    return a >= user && a < end ? end - a : 0;
  }
  if (!ptr || qm__boot_owns(ptr))
    return SIZE_MAX;
  /* marked: both look under a lock a handler's free may need */
  uintptr_t was = qm_busy_enter();
  size_t r = qm_guarded_owns(ptr) ? qm__guarded_object_size(a) : qm__large_object_size(a);
  qm__busy_leave_applying(was);
  return r;
}
