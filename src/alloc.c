/* alloc.c: the malloc family behind qmalloc.h: dispatch between the primary
 * (requests below the large threshold) and the secondary, alignment,
 * calloc, realloc, usable sizes and sized frees. The fast paths of qm_malloc
 * and qm_free touch only the calling thread's cache: no syscall, no lock, no
 * atomic read-modify-write. Everything else is in the _slow functions.
 */
#include <errno.h>
#include <string.h>
#include <sys/single_threaded.h>

#include "alloc.h"
#include "cache.h"
#include "chunk.h"
#include "guarded.h"
#include "init.h"
#include "options.h"
#include "primary.h"
#include "qmalloc.h"
#include "report.h"
#include "secondary.h"
#include "zero.h"

/* ---- small chunks ---- */

QM_INLINE uintptr_t region_mask(void) { return ((uintptr_t)1 << qm__rshift) - 1; }
QM_INLINE size_t committed(unsigned c) {
  return atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
}

/* The chunk holding small pointer a (off = a - qm__pbase < qm__pspan). */
QM_INLINE uintptr_t chunk_of(uintptr_t a, uintptr_t off, unsigned *cls, uintptr_t *roff) {
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t r = off & region_mask();
  *cls = c;
  *roff = r;
  return a - r + qm_chunk_index(r, c) * qm__class[c].size;
}

static size_t class_user(unsigned c) { return qm__class[c].size - QM_HDR; }

QM_INLINE uint64_t load8(uintptr_t a) {
  uint64_t v;
  memcpy(&v, (const void *)a, 8);
  return v;
}
QM_INLINE void store8(uintptr_t a, uint64_t v) { memcpy((void *)a, &v, 8); }

/* The canary after the requested bytes ending at end_req: 8 bytes of the
 * region's pattern (see chunk.h). Where the chunk has less than 8 bytes of
 * room they run into the next chunk's guard word, rewriting bytes that
 * already hold these values: carving leaves 16 bytes committed after the
 * last chunk, and a purge never drops a page holding a live chunk's
 * canary. */
QM_INLINE void put_canary(uintptr_t end_req, uint64_t gkey) {
  store8(end_req, qm_pattern8(end_req, gkey));
}
QM_INLINE bool canary_ok(uintptr_t end_req, uint64_t gkey) {
  return load8(end_req) == qm_pattern8(end_req, gkey);
}

static _Noreturn QM_COLD void small_error(const char *op, void *p, uintptr_t chunk, unsigned c,
                                          uintptr_t roff) {
  uintptr_t a = (uintptr_t)p;
  qm_buf_t d;
  d.n = 0;
  if (c == QM_ZCLASS)
    qm__zero_error(op, p);
  if (roff >= committed(c))
    qm__report_fatal(op, p, "not allocated by qmalloc: unused part of the small-chunk heap");
  const qm_class_info_t *ci = &qm__class[c];
  if (qm_slot_dead(chunk - qm_region(c), ci->size))
    qm__report_fatal(op, p,
                     "not allocated by qmalloc: space by a guard page of the small-chunk heap");
  uint64_t w = *qm_hdr_at(chunk), g = *qm_guard_at(chunk);
  if ((w && !qm_hdr_valid(chunk, w, ci->key)) || (w && g != ci->gkey)) {
    qm_buf_str(&d, "small chunk of class ");
    qm_buf_dec(&d, class_user(c));
    qm_buf_str(&d, " bytes at ");
    qm_buf_hex(&d, chunk + QM_HDR);
    qm_buf_str(&d, ", header ");
    qm_buf_hex(&d, g);
    qm_buf_str(&d, " ");
    qm_buf_hex(&d, w);
    qm__report_fatal_buf("corrupted chunk header of", p, &d);
  }
  uintptr_t user = chunk + QM_HDR + (w ? qm_hdr_offset(w) : 0);
  if (a != user) {
    qm_buf_offset(&d, a, user);
    qm_buf_str(&d, " in small chunk of class ");
    qm_buf_dec(&d, class_user(c));
    qm_buf_str(&d, " bytes at ");
    qm_buf_hex(&d, user);
  } else if (qm_hdr_state(w) == QM_CHUNK_FREE) {
    qm_buf_str(&d, "small chunk, ");
    qm_buf_dec(&d, qm_hdr_size(w));
    qm_buf_str(&d, " bytes");
    if (!strcmp(op, "invalid free of"))
      qm__report_fatal_buf("double free of", p, &d);
    qm_buf_str(&d, ", already freed");
  } else if (qm_hdr_state(w) == QM_CHUNK_ALLOC) {
    size_t n = qm_hdr_size(w);
    uint64_t bad = load8(a + n) ^ qm_pattern8(a + n, ci->gkey);
    qm_buf_dec(&d, n);
    qm_buf_str(&d, " bytes, written past the end at offset ");
    qm_buf_dec(&d, n + (bad ? (size_t)__builtin_ctzll(bad) / 8 : 0));
    qm__report_fatal_buf("heap overflow past small chunk", p, &d);
  } else {
    qm_buf_str(&d, "small chunk of class ");
    qm_buf_dec(&d, class_user(c));
    qm_buf_str(&d, " bytes, not allocated");
  }
  qm__report_fatal_buf(op, p, &d);
}

/* Validates a small pointer for free/realloc/usable-size: every byte of its
 * header and its canary. Returns its chunk and header word, or reports. */
static uintptr_t small_check(const char *op, void *p, uintptr_t off, unsigned *cls,
                             uint64_t *word) {
  uintptr_t a = (uintptr_t)p, roff;
  uintptr_t ch = chunk_of(a, off, cls, &roff);
  unsigned c = *cls;
  const qm_class_info_t *ci = &qm__class[c];
  if (QM_UNLIKELY(c == QM_ZCLASS || roff >= committed(c) ||
                  qm_slot_dead(ch - qm_region(c), ci->size)))
    small_error(op, p, ch, c, roff);
  uint64_t w = *qm_hdr_at(ch);
  if (QM_UNLIKELY(qm_hdr_state(w) != QM_CHUNK_ALLOC || !qm_hdr_valid(ch, w, ci->key) ||
                  *qm_guard_at(ch) != ci->gkey || a != ch + QM_HDR + qm_hdr_offset(w) ||
                  qm_hdr_size(w) > class_user(c) - qm_hdr_offset(w) ||
                  !canary_ok(a + qm_hdr_size(w), ci->gkey)))
    small_error(op, p, ch, c, roff);
  *word = w;
  return ch;
}

/* An entry taken from a free list that is not a free chunk of its class: a
 * forged entry, or a freed chunk whose header was written to. */
static _Noreturn QM_COLD void bad_pop(uintptr_t ch, unsigned c) {
  if (ch - qm_region(c) >= committed(c))
    qm__report_bad_entry(class_user(c), ch, "outside its class region");
  uint64_t w = *qm_hdr_at(ch);
  if (qm_hdr_valid(ch, w, qm__class[c].key) && qm_hdr_state(w) == QM_CHUNK_ALLOC)
    qm__report_bad_entry(class_user(c), ch, "chunk in use");
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "free small chunk of class ");
  qm_buf_dec(&d, class_user(c));
  qm_buf_str(&d, " bytes, header ");
  qm_buf_hex(&d, *qm_guard_at(ch));
  qm_buf_str(&d, " ");
  qm_buf_hex(&d, w);
  qm_buf_str(&d, ": written after free");
  qm__report_fatal_buf("corrupted chunk header of", (void *)(ch + QM_HDR), &d);
}

/* A chunk zeroed at free with a byte set at or after user offset at. */
static _Noreturn QM_COLD void zero_error(uintptr_t ch, unsigned c, size_t at) {
  const unsigned char *q = (const unsigned char *)(ch + QM_HDR);
  while (!q[at])
    at++;
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "class ");
  qm_buf_dec(&d, class_user(c));
  qm_buf_str(&d, " bytes, byte at offset ");
  qm_buf_dec(&d, at);
  qm_buf_str(&d, " is ");
  qm_buf_hex(&d, ((const unsigned char *)q)[at]);
  qm_buf_str(&d, ", written while the chunk was free");
  qm__report_fatal_buf("write after free of small chunk", (void *)(ch + QM_HDR), &d);
}

/* Checked mode: a chunk zeroed at free must still be zero. */
static void check_zero(uintptr_t ch, unsigned c) {
  /* 64 bytes per step, ORed in 16-byte vectors (SSE2 on x86-64, NEON on
   * arm64): a word at a time cost 4 instructions per 8 bytes, the largest
   * cost of hardening=max in small churn. User bytes start 16-aligned and
   * every class size is a multiple of 16. */
  typedef uint64_t v2 __attribute__((vector_size(16), may_alias));
  const v2 *v = (const v2 *)(ch + QM_HDR);
  size_t nv = class_user(c) / 16, i = 0;
  for (; i + 4 <= nv; i += 4) {
    v2 x = v[i] | v[i + 1] | v[i + 2] | v[i + 3];
    if (QM_UNLIKELY(x[0] | x[1]))
      break;
  }
  for (; i < nv; i++) {
    v2 x = v[i];
    if (x[0] | x[1])
      break;
  }
  if (QM_UNLIKELY(i < nv))
    zero_error(ch, c, i * 16);
}

/* Hands out chunk ch of class c, just taken from a cache or central list,
 * on the slow path: checks in full that it is a free chunk of its class
 * (and still zero, in checked mode), writes its header and canary. */
static void *hand_out(uintptr_t ch, unsigned c, size_t n, size_t align) {
  const qm_class_info_t *ci = &qm__class[c];
  if (QM_UNLIKELY(ch - qm_region(c) >= committed(c)))
    bad_pop(ch, c);
  uint64_t w = *qm_hdr_at(ch);
  if (QM_UNLIKELY(qm_hdr_state(w) != QM_CHUNK_FREE || !qm_hdr_valid(ch, w, ci->key) ||
                  *qm_guard_at(ch) != ci->gkey))
    bad_pop(ch, c);
  if (qm__cache_checked && qm__opt.zero_on_free)
    check_zero(ch, c);
  uintptr_t user = qm_align_up(ch + QM_HDR, align > QM_MIN_ALIGN ? align : QM_MIN_ALIGN);
  *qm_hdr_at(ch) = qm_hdr_make(ch, ci->key, QM_CHUNK_ALLOC, user - ch - QM_HDR, n);
  put_canary(user + n, ci->gkey);
  return (void *)user;
}

/* What a small chunk for n bytes aligned to align (> 16) must hold: room
 * for the offset; n = 0 counts as 1, or the aligned pointer could land on
 * the next chunk's header. Its class is the one such a chunk is in (see
 * small_alloc_plain): free_aligned_sized checks it. */
static size_t aligned_req(size_t n, size_t align) { return (n ? n : 1) + align - QM_MIN_ALIGN; }

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
    uintptr_t ch = b->count ? b->slot[--b->count] : qm__cache_take_slow(c);
    if (ch)
      return hand_out(ch, c, n, align);
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
  if (qm__sample_due()) {
    void *g = qm__guarded_alloc(n, 0);
    if (g)
      return g;
  }
  return small_alloc_plain(n, 0);
}

static QM_COLD void *malloc_slow(size_t n) {
  qm__init();
  if (QM_UNLIKELY(qm__init_bootstrapping()))
    return qm__boot_alloc(n);
  if (n < qm__small_limit)
    return small_alloc(n, 0);
  return qm__large_alloc(n, 0, false);
}

QM_EXPORT void *qm_malloc(size_t n) {
  if (QM_LIKELY(n < qm__small_limit)) {
    /* sampling's whole cost on this path (qm__small_limit is 0 until init,
     * so the sampled path runs initialised) */
    if (QM_UNLIKELY(!--qm__sample_left))
      return sampled_malloc(n);
    unsigned c = qm_class_of(n);
    qm_bin_t *b = &qm__bin[c];
    if (QM_LIKELY(b->count)) {
      uintptr_t ch = b->slot[--b->count];
      /* the next chunk of this class is about to have its header written:
       * start fetching its line now (slot[-1] is the bin's own memory) */
      __builtin_prefetch((void *)b->slot[(int)b->count - 1], 1);
      const qm_class_info_t *ci = &qm__class[c];
      /* an entry of the cache must be in its class region: checked from
       * the address alone (no load: the header line may be cold, and the
       * stores below need not wait for it). Entries were checked in full
       * when they entered the cache (at free, or by the central list's
       * arm), and the cache's arrays sit in guarded metadata. */
      if (QM_LIKELY((ch - qm__pbase) >> qm__rshift == c)) {
        *qm_hdr_at(ch) = qm_hdr_make(ch, ci->key, QM_CHUNK_ALLOC, 0, n);
        put_canary(ch + QM_HDR + n, ci->gkey);
        return (void *)(ch + QM_HDR);
      }
      bad_pop(ch, c);
    }
  }
  return malloc_slow(n);
}

/* Checked mode, at free: the chunks on either side must have intact
 * headers too (or none yet: never carved, or purged), so an overflow out of
 * one chunk into its neighbour is caught at either one's free. */
static QM_COLD void check_neighbours(uintptr_t ch, unsigned c) {
  const qm_class_info_t *ci = &qm__class[c];
  uintptr_t base = qm_region(c), top = base + committed(c);
  uintptr_t side[2] = {ch - ci->size, ch + ci->size};
  for (int i = 0; i < 2; i++) {
    uintptr_t n = side[i];
    if (n < base || n + QM_HDR > top || qm_slot_dead(n - base, ci->size))
      continue;
    uint64_t w = *qm_hdr_at(n), g = *qm_guard_at(n);
    if (!w || (qm_hdr_valid(n, w, ci->key) && g == ci->gkey))
      continue;
    qm_buf_t d;
    d.n = 0;
    qm_buf_str(&d, i ? "next" : "previous");
    qm_buf_str(&d, " neighbour of small chunk ");
    qm_buf_hex(&d, ch + QM_HDR);
    qm_buf_str(&d, ", class ");
    qm_buf_dec(&d, class_user(c));
    qm_buf_str(&d, " bytes, header ");
    qm_buf_hex(&d, g);
    qm_buf_str(&d, " ");
    qm_buf_hex(&d, w);
    qm__report_fatal_buf("corrupted chunk header of", (void *)(n + QM_HDR), &d);
  }
}

/* Marks a validated small chunk free, with a compare-and-swap so that of two
 * racing frees only one succeeds, and caches it. While the process has one
 * thread (glibc clears __libc_single_threaded in pthread_create, before the
 * second thread exists, and never sets it again) no free can race this one,
 * and a plain store does what the swap would: the locked instruction is a
 * full barrier that stalls on every miss in flight. */
QM_INLINE bool small_release(uintptr_t ch, unsigned c, uint64_t w) {
  uint64_t fw = qm_hdr_restate(ch, qm__class[c].key, w, QM_CHUNK_FREE);
  if (QM_LIKELY(__libc_single_threaded))
    *qm_hdr_at(ch) = fw;
  else if (QM_UNLIKELY(!__atomic_compare_exchange_n(qm_hdr_at(ch), &w, fw, false, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)))
    return false;
  qm_bin_t *b = &qm__bin[c];
  if (QM_LIKELY(b->count < b->max)) {
    /* at a random place: malloc takes the top one */
    b->count = qm_bin_insert(b->slot, b->count, ch);
  } else {
    if (qm__cache_checked) {
      /* the neighbours' headers are cold lines: fetched while the chunk is
       * zeroed rather than after */
      size_t size = qm__class[c].size;
      __builtin_prefetch((void *)(ch - size + 8));
      __builtin_prefetch((void *)(ch + size + 8));
      if (qm__opt.zero_on_free)
        memset((void *)(ch + QM_HDR), 0, size - QM_HDR);
      check_neighbours(ch, c);
    }
    qm__cache_give_slow(ch, c);
  }
  return true;
}

static QM_COLD void small_free_general(void *p, uintptr_t off) {
  if ((off >> qm__rshift) == QM_ZCLASS) {
    qm__zero_free(p, "invalid free of");
    return;
  }
  for (;;) {
    unsigned c;
    uint64_t w;
    uintptr_t ch = small_check("invalid free of", p, off, &c, &w);
    if (small_release(ch, c, w))
      return;
    /* the header changed under us: another free won; the check reports */
  }
}

/* Outside the primary: a large chunk, or one of init's bootstrap chunks. */
static QM_COLD void large_free(void *p) {
  if (QM_UNLIKELY(qm__boot_owns(p)))
    return; /* never reused: nothing to do */
  if (qm_guarded_owns(p)) {
    qm__guarded_free(p, "invalid free of");
    return;
  }
  qm__large_free(p);
}

QM_EXPORT void qm_free(void *p) {
  uintptr_t a = (uintptr_t)p, off = a - qm__pbase;
  if (QM_LIKELY(off < qm__pspan)) {
    unsigned c = (unsigned)(off >> qm__rshift);
    /* Where the header is when p has no alignment offset, the usual case:
     * p - 16. Load it first and check that it is a chunk boundary while the
     * load is in flight: the header's line is often cold, and the boundary
     * needs a multiply; the two now overlap instead of adding up. */
    uintptr_t h = (off & region_mask()) - QM_HDR;
    /* 16-aligned and below the committed end: the loads stay in RW memory
     * even for a bad pointer (committed is page-aligned); the zero-size
     * region has nothing committed */
    if (QM_LIKELY(!(a & (QM_MIN_ALIGN - 1)) && h < committed(c))) {
      uintptr_t ch = a - QM_HDR;
      const qm_class_info_t *ci = &qm__class[c];
      /* the canary sits after the requested bytes, which the header tells:
       * fetch the first and the last line where it can be alongside the
       * header rather than after it (with four classes per doubling that
       * span is at most a quarter of the chunk, and classes up to 256 bytes
       * are 16 apart). A 1.3x gain in small churn: the canary's line was a
       * second cache miss that waited for the first. */
      __builtin_prefetch((void *)(ch + ci->lo));
      __builtin_prefetch((void *)(ch + ci->size - 8));
      uint64_t g = *qm_guard_at(ch), w = *qm_hdr_at(ch);
      size_t n = qm_hdr_size(w);
      /* a chunk boundary; state ALLOC and offset 0 in one compare; every
       * bit of the header and guard words; then the canary (n is bounded
       * by the class for the load to stay inside the chunk's slot) */
      if (QM_LIKELY(qm_chunk_index(h, c) * ci->size == h &&
                    ((w >> 16) & 0xffff) == QM_CHUNK_ALLOC && qm_hdr_valid(ch, w, ci->key) &&
                    g == ci->gkey && n <= ci->size - QM_HDR && canary_ok(a + n, ci->gkey) &&
                    small_release(ch, c, w)))
        return;
    }
    small_free_general(p, off); /* over-aligned chunks, and every error */
    return;
  }
  if (p)
    large_free(p);
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
    return qm__large_alloc(n, 0, true);
  void *p = qm_malloc(n);
  /* chunks checked to be zero at hand-out need no memset */
  if (p && n && !(qm__cache_checked && qm__opt.zero_on_free))
    memset(p, 0, n);
  return p;
}

/* Whether a request over-aligned to align (> 16) is served by the primary.
 * Over-aligned small chunks carry the offset in their header (up to 256 KiB
 * fits its 14 bits of 16-byte units). */
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
  if (aligned_is_small(n, align))
    return small_alloc(n, align);
  return qm__large_alloc(n, align, false);
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
  /* glibc rounds an alignment that is not a power of two up to one */
  if (align > ((size_t)1 << 62)) {
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
  const char *kind;
} held_t;

static held_t held_of(const char *op, void *p) {
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (off < qm__pspan) {
    if ((off >> qm__rshift) == QM_ZCLASS)
      return (held_t){qm__zero_check(op, p), 0, "small"};
    unsigned c;
    uint64_t w;
    small_check(op, p, off, &c, &w);
    return (held_t){qm_hdr_size(w), qm_hdr_size(w), "small"};
  }
  if (qm__boot_owns(p)) {
    size_t n = qm__boot_size(p);
    return (held_t){n, n, "small"};
  }
  if (qm_guarded_owns(p)) {
    size_t n = qm__guarded_size(p, op);
    return (held_t){n, n, "sampled small"};
  }
  return (held_t){qm__large_size(p, op), qm__large_usable(p, op), "large"};
}

QM_EXPORT size_t qm_malloc_usable_size(void *p) {
  return p ? held_of("malloc_usable_size of", p).usable : 0;
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
 * was allocated with; up to 16 all name malloc's natural one. A power of two
 * that p is aligned to, and then:
 *  - large chunks: exactly the alignment recorded at allocation;
 *  - small chunks of the class regions: for more than 16, the class an
 *    allocation of n bytes so aligned takes (small_alloc_plain never falls
 *    back to another for those); for 16 or less nothing more (a plain
 *    chunk may sit in a larger class than its size's, so one allocated
 *    over-aligned and freed as plain is not told apart);
 *  - zero-size and start-up chunks: never over-aligned;
 *  - guarded slots: the pointer's alignment only. */
static bool align_names(void *p, size_t n, size_t align, const char *kind) {
  if (!qm_is_pow2(align) || ((uintptr_t)p & (align - 1)))
    return false;
  size_t a = align > QM_MIN_ALIGN ? align : QM_MIN_ALIGN;
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (kind[0] == 'l') {
    size_t had;
    qm__large_held(p, "invalid free of", &had);
    return had == a;
  }
  if (off < qm__pspan) {
    unsigned c = (unsigned)(off >> qm__rshift);
    if (c == QM_ZCLASS || a == QM_MIN_ALIGN)
      return a == QM_MIN_ALIGN;
    return aligned_is_small(n, a) && qm_class_of(aligned_req(n, a)) == c;
  }
  return qm_guarded_owns(p) || a == QM_MIN_ALIGN; /* else a start-up chunk */
}

void qm__free_checked(const char *call, void *p, size_t align, size_t size, unsigned how) {
  if (!p)
    return;
  held_t h = held_of("invalid free of", p);
  bool sized = how & QM_FREE_SIZED, aligned = how & QM_FREE_ALIGNED;
  if ((sized && !size_names(h.size, size, align, how & QM_FREE_CXX)) ||
      (aligned && !align_names(p, h.size, align, h.kind)))
    qm__report_size_mismatch(call, p, sized, size, aligned, align, h.kind, h.size,
                             h.kind[0] == 'l' ? qm__large_report_stacks : NULL);
  qm_free(p);
}

QM_EXPORT void qm_free_aligned_sized(void *p, size_t align, size_t size) {
  qm__free_checked("free_aligned_sized", p, align, size, QM_FREE_SIZED | QM_FREE_ALIGNED);
}

QM_EXPORT void qm_free_sized(void *p, size_t size) {
  qm__free_checked("free_sized", p, 0, size, QM_FREE_SIZED);
}

QM_EXPORT void *qm_realloc(void *p, size_t n) {
  if (!p)
    return qm_malloc(n);
  if (!n) { /* glibc: realloc(p, 0) frees p and returns NULL */
    qm_free(p);
    return NULL;
  }
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (off < qm__pspan && (off >> qm__rshift) != QM_ZCLASS) {
    unsigned c;
    uint64_t w;
    uintptr_t ch = small_check("realloc of", p, off, &c, &w);
    size_t cap = class_user(c) - qm_hdr_offset(w);
    /* in place while it fits, canary included where there is room, and
     * wastes at most half the chunk */
    if (n <= cap && n >= cap / 2 && n < qm__small_limit) {
      const qm_class_info_t *ci = &qm__class[c];
      uint64_t nw = qm_hdr_make(ch, ci->key, QM_CHUNK_ALLOC, qm_hdr_offset(w), n);
      if (__atomic_compare_exchange_n(qm_hdr_at(ch), &w, nw, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
        put_canary((uintptr_t)p + n, ci->gkey);
        return p;
      }
      small_check("realloc of", p, off, &c, &w); /* a racing free: it reports */
    }
  } else if (off >= qm__pspan && !qm__boot_owns(p) && !qm_guarded_owns(p) && n >= qm__small_limit) {
    return qm__large_realloc(p, n);
  }
  /* a move: everything the program may have written comes along */
  size_t old_usable = held_of("realloc of", p).usable;
  void *q = qm_malloc(n);
  if (!q)
    return NULL;
  memcpy(q, p, old_usable < n ? old_usable : n);
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
    uintptr_t roff = off & region_mask();
    if (c == QM_ZCLASS || roff >= committed(c))
      return 0;
    const qm_class_info_t *ci = &qm__class[c];
    uintptr_t ch = a - roff + qm_chunk_index(roff, c) * ci->size;
    uint64_t w = __atomic_load_n(qm_hdr_at(ch), __ATOMIC_RELAXED);
    if (qm_hdr_state(w) != QM_CHUNK_ALLOC || !qm_hdr_valid(ch, w, ci->key))
      return 0;
    uintptr_t user = ch + QM_HDR + qm_hdr_offset(w), end = user + qm_hdr_size(w);
    return a >= user && a < end ? end - a : 0;
  }
  if (!ptr || qm__boot_owns(ptr))
    return SIZE_MAX;
  if (qm_guarded_owns(ptr))
    return qm__guarded_object_size(a);
  return qm__large_object_size(a);
}
