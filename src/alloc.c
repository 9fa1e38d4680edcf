/* alloc.c: the malloc family behind qmalloc.h: dispatch between the primary
 * (requests below the large threshold) and the secondary, alignment,
 * calloc, realloc, usable sizes and sized frees. The fast paths of qm_malloc
 * and qm_free touch only the calling thread's cache: no syscall, no lock, no
 * atomic read-modify-write. Everything else is in the _slow functions.
 */
#include <errno.h>
#include <string.h>

#include "cache.h"
#include "chunk.h"
#include "init.h"
#include "primary.h"
#include "qmalloc.h"
#include "report.h"
#include "secondary.h"

/* ---- small chunks ---- */

QM_INLINE uintptr_t region_mask(void) { return ((uintptr_t)1 << qm__rshift) - 1; }

/* The chunk holding small pointer a (off = a - qm__pbase < qm__pspan). */
QM_INLINE uintptr_t chunk_of(uintptr_t a, uintptr_t off, unsigned *cls, uintptr_t *roff) {
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t r = off & region_mask();
  *cls = c;
  *roff = r;
  return a - r + qm_chunk_index(r, c) * qm__class[c].size;
}

static size_t class_user(unsigned c) { return qm__class[c].size - QM_HDR; }

static _Noreturn QM_COLD void small_error(const char *op, void *p, uintptr_t chunk, unsigned c,
                                          uintptr_t roff) {
  uintptr_t a = (uintptr_t)p;
  qm_buf_t d;
  d.n = 0;
  if (roff >= atomic_load_explicit(&qm__class[c].committed, memory_order_relaxed))
    qm__report_fatal(op, p, "not allocated by qmalloc: unused part of the small-chunk heap");
  uint64_t w = *(uint64_t *)chunk;
  if (w && !qm_hdr_valid(chunk, w)) {
    qm_buf_str(&d, "small chunk of class ");
    qm_buf_dec(&d, class_user(c));
    qm_buf_str(&d, " bytes at ");
    qm_buf_hex(&d, chunk + QM_HDR);
    qm_buf_str(&d, ", header ");
    qm_buf_hex(&d, w);
    qm__report_fatal_buf("corrupted chunk header of", p, &d);
  }
  uintptr_t user = chunk + QM_HDR + (w ? qm_hdr_offset(w) : 0);
  if (a != user) {
    qm_buf_str(&d, "offset ");
    if (a < user) {
      qm_buf_str(&d, "-");
      qm_buf_dec(&d, user - a);
    } else {
      qm_buf_dec(&d, a - user);
    }
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
  } else {
    qm_buf_str(&d, "small chunk of class ");
    qm_buf_dec(&d, class_user(c));
    qm_buf_str(&d, " bytes, not allocated");
  }
  qm__report_fatal_buf(op, p, &d);
}

/* Validates a small pointer for free/realloc/usable-size; returns its chunk
 * and header word, or reports. */
QM_INLINE uintptr_t small_check(const char *op, void *p, uintptr_t off, unsigned *cls,
                                uint64_t *word) {
  uintptr_t a = (uintptr_t)p, roff;
  uintptr_t ch = chunk_of(a, off, cls, &roff);
  if (QM_UNLIKELY(roff >= atomic_load_explicit(&qm__class[*cls].committed, memory_order_relaxed)))
    small_error(op, p, ch, *cls, roff);
  uint64_t w = *(uint64_t *)ch;
  if (QM_UNLIKELY(qm_hdr_state(w) != QM_CHUNK_ALLOC || !qm_hdr_valid(ch, w) ||
                  a != ch + QM_HDR + qm_hdr_offset(w)))
    small_error(op, p, ch, *cls, roff);
  *word = w;
  return ch;
}

/* A small chunk for n bytes aligned to align (<= 16: the natural alignment).
 * Falls back to larger classes when a class's region is exhausted. */
static void *small_alloc(size_t n, size_t align) {
  /* room for the offset; n = 0 counts as 1, or the aligned pointer could
   * land on the next chunk's header */
  size_t req = align > QM_MIN_ALIGN ? (n ? n : 1) + align - QM_MIN_ALIGN : n;
  for (unsigned c = qm_class_of(req); c < QM_NCLASS; c++) {
    qm_bin_t *b = &qm__bin[c];
    uintptr_t ch = b->count ? b->slot[--b->count] : qm__cache_take_slow(c);
    if (!ch)
      continue;
    uintptr_t user = qm_align_up(ch + QM_HDR, align > QM_MIN_ALIGN ? align : QM_MIN_ALIGN);
    *(uint64_t *)ch = qm_hdr_make(ch, QM_CHUNK_ALLOC, user - ch - QM_HDR, n);
    return (void *)user;
  }
  errno = ENOMEM;
  return NULL;
}

static QM_COLD void *malloc_slow(size_t n) {
  qm__init();
  if (n < qm__small_limit)
    return small_alloc(n, 0);
  return qm__large_alloc(n, 0, false);
}

QM_EXPORT void *qm_malloc(size_t n) {
  if (QM_LIKELY(n < qm__small_limit)) {
    qm_bin_t *b = &qm__bin[qm_class_of(n)];
    if (QM_LIKELY(b->count)) {
      uintptr_t ch = b->slot[--b->count];
      /* the next chunk of this class is about to have its header written:
       * start fetching its line now (slot[-1] is the bin's own memory) */
      __builtin_prefetch((void *)b->slot[(int)b->count - 1], 1);
      *(uint64_t *)ch = qm_hdr_make(ch, QM_CHUNK_ALLOC, 0, n);
      return (void *)(ch + QM_HDR);
    }
  }
  return malloc_slow(n);
}

/* Marks a validated small chunk free and caches it. */
QM_INLINE void small_release(uintptr_t ch, unsigned c, uint64_t w) {
  *(uint64_t *)ch = w ^ QM_HDR_FREE_FLIP;
  qm_bin_t *b = &qm__bin[c];
  if (QM_LIKELY(b->count < b->max))
    b->slot[b->count++] = ch;
  else
    qm__cache_give_slow(ch, c);
}

static QM_COLD void small_free_general(void *p, uintptr_t off) {
  unsigned c;
  uint64_t w;
  uintptr_t ch = small_check("invalid free of", p, off, &c, &w);
  small_release(ch, c, w);
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
    /* 16-aligned and below the committed end: the 8-byte load stays in RW
     * memory even for a bad pointer (committed is page-aligned) */
    if (QM_LIKELY(!(a & (QM_MIN_ALIGN - 1)) &&
                  h < atomic_load_explicit(&qm__class[c].committed, memory_order_relaxed))) {
      uintptr_t ch = a - QM_HDR;
      uint64_t w = *(uint64_t *)ch;
      if (QM_LIKELY(qm_chunk_index(h, c) * qm__class[c].size == h &&
                    ((w >> 16) & 0xffff) == QM_CHUNK_ALLOC && qm_hdr_valid(ch, w))) {
        small_release(ch, c, w);
        return;
      }
    }
    small_free_general(p, off); /* over-aligned chunks, and every error */
    return;
  }
  if (p)
    qm__large_free(p, SIZE_MAX, 0);
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
  if (n >= qm__small_limit)
    return qm__large_alloc(n, 0, true);
  void *p = qm_malloc(n);
  if (p)
    memset(p, 0, n);
  return p;
}

static void *aligned(size_t align, size_t n) {
  if (align <= QM_MIN_ALIGN)
    return qm_malloc(n);
  if (n > QM_MAX_REQUEST || align > QM_MAX_REQUEST)
    return enomem();
  qm__init();
  /* over-aligned small chunks carry the offset in their header (up to
   * 256 KiB fits its 14 bits of 16-byte units) */
  if (n + align < qm__small_limit && align <= 65536)
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

QM_EXPORT size_t qm_malloc_usable_size(void *p) {
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (off < qm__pspan) {
    unsigned c;
    uint64_t w;
    small_check("malloc_usable_size of", p, off, &c, &w);
    return class_user(c) - qm_hdr_offset(w);
  }
  return p ? qm__large_usable(p) : 0;
}

QM_EXPORT void qm_free_aligned_sized(void *p, size_t align, size_t size) {
  uintptr_t off = (uintptr_t)p - qm__pbase;
  if (off < qm__pspan) {
    unsigned c;
    uint64_t w;
    uintptr_t ch = small_check("invalid free of", p, off, &c, &w);
    /* a size of the same class is accepted: what matters is that it could
     * have come from this allocation */
    size_t held = qm_hdr_size(w);
    if (size > class_user(c) - qm_hdr_offset(w) ||
        (size != held && qm_class_of(size) != qm_class_of(held)) ||
        (align > QM_MIN_ALIGN && ((uintptr_t)p & (align - 1))))
      qm__report_size_mismatch(p, size, "small", held);
    small_release(ch, c, w);
    return;
  }
  if (p)
    qm__large_free(p, size, align > qm__page ? align : 0);
}

QM_EXPORT void qm_free_sized(void *p, size_t size) { qm_free_aligned_sized(p, 0, size); }

QM_EXPORT void *qm_realloc(void *p, size_t n) {
  if (!p)
    return qm_malloc(n);
  if (!n) { /* glibc: realloc(p, 0) frees p and returns NULL */
    qm_free(p);
    return NULL;
  }
  uintptr_t off = (uintptr_t)p - qm__pbase;
  size_t old_usable;
  if (off < qm__pspan) {
    unsigned c;
    uint64_t w;
    uintptr_t ch = small_check("realloc of", p, off, &c, &w);
    old_usable = class_user(c) - qm_hdr_offset(w);
    /* in place while it fits and wastes at most half the chunk */
    if (n <= old_usable && n >= old_usable / 2 && n < qm__small_limit) {
      *(uint64_t *)ch = qm_hdr_make(ch, QM_CHUNK_ALLOC, qm_hdr_offset(w), n);
      return p;
    }
  } else {
    if (n >= qm__small_limit)
      return qm__large_realloc(p, n);
    old_usable = qm__large_size(p);
  }
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

/* ---- describing small-chunk addresses (for the SIGSEGV report) ---- */

bool qm__small_describe(uintptr_t a, const char **what, qm_buf_t *d) {
  uintptr_t off = a - qm__pbase;
  if (off >= qm__pspan)
    return false;
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t roff = off & region_mask();
  if (roff < atomic_load_explicit(&qm__class[c].committed, memory_order_relaxed))
    return false; /* RW memory: whatever faulted there, it was not qmalloc's guard */
  *what = "wild access";
  qm_buf_str(d, "unused part of the small-chunk heap, class ");
  qm_buf_dec(d, class_user(c));
  qm_buf_str(d, " bytes");
  return true;
}
