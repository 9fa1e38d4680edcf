/* smallstate.c: the small chunk's state machine (NONE -> ALLOC <-> FREE, in
 * the tables of smallstate.h) past the fast paths, and every report about a
 * small chunk. Who may change an entry: its owner, with plain stores; a
 * thread that frees a chunk another thread owns sends it to that owner (a
 * batch pushed on the owner's inbox, applied on the owner's next refill),
 * and only the owner makes the transition, so of two frees of one chunk,
 * on any threads, exactly one succeeds. An id whose thread is gone has its
 * inbox closed: senders then apply their frees themselves, under the id's
 * lock, until a new thread adopts the id.
 */
#include "smallstate.h"

#include <errno.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cache.h"
#include "lock.h"
#include "meta.h"
#include "options.h"
#include "qmalloc.h"
#include "report.h"
#include "seal.h"
#include "up.h"
#include "zero.h"

/* the calling thread's hot state (thread.h): it owns nothing, and its
 * first malloc sets its sampling countdown */
__thread qm_thread_t qm__t
    __attribute__((tls_model("initial-exec"))) = {.me = QM_E_NOBODY, .sample_left = 1};

QM_INLINE size_t committed(unsigned c) {
  return atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
}
/* This thread's id, 0 when it has none. */
QM_INLINE unsigned my_id(void) {
  return qm__me == QM_E_NOBODY ? 0 : (unsigned)(qm__me >> QM_E_OWNER_SHIFT) & 0xffff;
}

/* The chunk holding small pointer a (off = a - qm__pbase < qm__pspan). */
QM_INLINE uintptr_t chunk_of(uintptr_t a, uintptr_t off, unsigned *cls, uintptr_t *roff,
                             uintptr_t *index) {
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t r = off & qm__rmask;
  *cls = c;
  *roff = r;
  *index = c == QM_ZCLASS ? 0 : qm_chunk_index(r, c);
  return a - r + *index * qm__class[c].size;
}

/* ---- describing addresses (qm__describe) ---- */

bool qm__small_describe_heap(uintptr_t a, qm_place_t *pl) {
  if (a < qm__pbase && qm__pbase - a <= qm__page && qm__pspan) {
    qm_buf_str(&pl->words, "guard page below the small-chunk heap");
    return true;
  }
  return qm__small_describe(a, pl);
}

bool qm__small_describe(uintptr_t a, qm_place_t *pl) {
  uintptr_t off = a - qm__pbase, roff, index;
  if (off >= qm__pspan)
    return false;
  unsigned c;
  uintptr_t ch = chunk_of(a, off, &c, &roff, &index);
  if (c == QM_ZCLASS)
    return qm__zero_describe(a, pl);
  const qm_class_info_t *ci = &qm__class[c];
  qm_buf_t *d = &pl->words;
  if (roff >= committed(c)) {
    pl->access = QM_ACC_WILD;
    qm_buf_str(d, "unused part of the small-chunk heap, class ");
  } else if (qm_on_guard(roff)) {
    pl->access = QM_ACC_GUARD;
    qm_buf_str(d, "guard page between runs of small chunks of class ");
  } else if (qm_slot_dead(ch - qm_region(c), ci->size)) {
    pl->access = QM_ACC_WILD;
    pl->plain = true;
    qm_buf_str(d, "space by a guard page of the small-chunk heap, class ");
  }
  if (d->n) {
    qm_buf_dec(d, ci->size);
    qm_buf_str(d, " bytes");
    return true;
  }
  /* a chunk: memory qmalloc never protects. A racy read of the entry: at
   * worst a moment old */
  pl->plain = true;
  uint64_t w = qm_entry_load(qm_entry_at(c, index));
  unsigned st = qm_e_state(w);
  uintptr_t user = ch + (st == QM_CHUNK_NONE ? 0 : qm_e_offset(w));
  if (st != QM_CHUNK_NONE) {
    pl->chunk = true;
    pl->kind = QM_CK_SMALL;
    pl->user = user;
    pl->size = qm_e_size(w);
  }
  qm_buf_offset(d, a, user);
  if (st == QM_CHUNK_ALLOC) {
    pl->access = QM_ACC_LIVE;
    qm_buf_str(d, " in small chunk of ");
    qm_buf_dec(d, qm_e_size(w));
    qm_buf_str(d, " bytes (class ");
  } else if (st == QM_CHUNK_NONE) {
    pl->access = QM_ACC_WILD;
    qm_buf_str(d, " in small chunk never allocated (class ");
  } else {
    pl->access = QM_ACC_UAF;
    qm_buf_str(d, " in freed small chunk of ");
    qm_buf_dec(d, qm_e_size(w));
    qm_buf_str(d, " bytes (class ");
  }
  qm_buf_dec(d, ci->size);
  qm_buf_str(d, " bytes) at ");
  qm_buf_hex(d, user);
  return true;
}

/* ---- reports ---- */

/* p, passed to op, failed qm__small_check: its own chunk's canary when p
 * is a live chunk's pointer (an overflow), else what this heap says of it
 * (the heap's addresses are the small side's alone: qm__describe asks it). */
static _Noreturn QM_COLD void small_error(qm_op_t op, void *p, uintptr_t ch, unsigned c,
                                          uintptr_t roff, uintptr_t index) {
  uintptr_t a = (uintptr_t)p;
  const qm_class_info_t *ci = &qm__class[c];
  if (c != QM_ZCLASS && roff < committed(c) && !qm_slot_dead(ch - qm_region(c), ci->size)) {
    uint64_t w = qm_entry_load(qm_entry_at(c, index));
    size_t n = qm_e_size(w);
    if (qm_e_state(w) == QM_CHUNK_ALLOC && a == ch + qm_e_offset(w)) {
      uint64_t bad = qm_load8(a + n) ^ qm_canary(ch, qm_e_gen(w), c);
      qm__report_small_overflow(p, QM_CK_SMALL, n, n + (bad ? (size_t)__builtin_ctzll(bad) / 8 : 0),
                                0, 0, 0);
    }
  }
  qm_place_t pl;
  qm__report_pointer(op, p, qm__small_describe(a, qm_place_empty(&pl)) ? &pl : NULL, NULL);
}

/* A second free of p found when the owner applied a free sent to it (or by
 * the sender of a free to an id with no thread): the chunk was freed, and
 * maybe handed out again, since the sender read its entry. */
static _Noreturn QM_COLD void late_double_free(uintptr_t p, uint64_t w) {
  qm__report_refree((void *)p, qm_e_size(w), QM_REFREE_TWO_THREADS);
}

_Noreturn void qm__small_bad_pop(uintptr_t ch, unsigned c) {
  qm__report_bad_entry(qm__class[c].size, ch, "outside its class region");
}

/* A chunk zeroed at free with a byte set at or after offset at. */
static _Noreturn QM_COLD void zero_error(uintptr_t ch, unsigned c, size_t at) {
  const unsigned char *q = (const unsigned char *)ch;
  while (!q[at])
    at++;
  qm__report_write_after_free(ch, qm__class[c].size, at, q[at]);
}

#if defined(__x86_64__)
/* Checked mode's zeroing at free and zero check at hand-out, by the widest
 * vectors the CPU runs: steps of four vectors (128 bytes with AVX2, 256
 * with AVX-512F) through the chunk, then one more of four over its last
 * bytes, overlapping the steps before, instead of a loop over what is left
 * (a chunk below a step takes four vectors that overlap). A chunk is a
 * multiple of 16 bytes, at least 16. The check returns an offset at or
 * before the first byte not zero (zero_error finds the byte), or size. In
 * small churn under hardening=max (AVX2: callgrind does not run AVX-512)
 * the check took 89 instructions a malloc, now 64. With AVX2 the zeroing
 * is memset's: the same steps took as many instructions. */
#define OR4(L, a, b, c, d) _mm256_or_si256(_mm256_or_si256(L(a), L(b)), _mm256_or_si256(L(c), L(d)))
#define LD32(q) _mm256_loadu_si256((const __m256i_u *)(q))
__attribute__((target("avx2"))) static size_t nonzero_avx2(uintptr_t ch, size_t size) {
  const char *p = (const char *)ch, *end = p + size;
  if (QM_UNLIKELY(size < 32)) {
    __m128i y = _mm_loadu_si128((const __m128i_u *)p);
    return _mm_testz_si128(y, y) ? size : 0;
  }
  __m256i x;
  if (size < 128) {
    size_t b = size - 32;
    x = OR4(LD32, p, p + (b < 32 ? b : 32), p + (b < 64 ? b : 64), p + b);
    return _mm256_testz_si256(x, x) ? size : 0;
  }
  for (size_t k = size / 128; k; k--, p += 128) {
    x = OR4(LD32, p, p + 32, p + 64, p + 96);
    if (!_mm256_testz_si256(x, x))
      return (size_t)(p - (const char *)ch);
  }
  p = end - 128; /* again if size is a multiple of 128: no branch */
  x = OR4(LD32, p, p + 32, p + 64, p + 96);
  return _mm256_testz_si256(x, x) ? size : size - 128;
}

/* The check and the zeroing with AVX-512F; below 64 bytes (16, 32, 48) by
 * a masked load or store, which does not touch memory past the chunk. */
#define OR4W(L, a, b, c, d)                                                                        \
  _mm512_or_si512(_mm512_or_si512(L(a), L(b)), _mm512_or_si512(L(c), L(d)))
#define LD64(q) _mm512_loadu_si512((const void *)(q))
__attribute__((target("avx512f"))) static size_t nonzero_avx512(uintptr_t ch, size_t size) {
  const char *p = (const char *)ch, *end = p + size;
  __m512i x;
  if (QM_UNLIKELY(size < 64)) {
    x = _mm512_maskz_loadu_epi64((__mmask8)((1u << (size / 8)) - 1), p);
    return _mm512_test_epi64_mask(x, x) ? 0 : size;
  }
  if (size < 256) {
    size_t b = size - 64;
    x = OR4W(LD64, p, p + (b < 64 ? b : 64), p + (b < 128 ? b : 128), p + b);
    return _mm512_test_epi64_mask(x, x) ? 0 : size;
  }
  for (size_t k = size / 256; k; k--, p += 256) {
    x = OR4W(LD64, p, p + 64, p + 128, p + 192);
    if (_mm512_test_epi64_mask(x, x))
      return (size_t)(p - (const char *)ch);
  }
  p = end - 256;
  x = OR4W(LD64, p, p + 64, p + 128, p + 192);
  return _mm512_test_epi64_mask(x, x) ? size - 256 : size;
}

__attribute__((target("avx512f"))) static void zero_avx512(uintptr_t ch, size_t size) {
  char *p = (char *)ch, *end = p + size;
  const __m512i z = _mm512_setzero_si512();
  if (QM_UNLIKELY(size < 64)) {
    _mm512_mask_storeu_epi64(p, (__mmask8)((1u << (size / 8)) - 1), z);
    return;
  }
  if (size < 256) {
    size_t b = size - 64;
    _mm512_storeu_si512(p, z);
    _mm512_storeu_si512(p + (b < 64 ? b : 64), z);
    _mm512_storeu_si512(p + (b < 128 ? b : 128), z);
    _mm512_storeu_si512(p + b, z);
    return;
  }
  for (size_t k = size / 256; k; k--, p += 256) {
    _mm512_storeu_si512(p, z);
    _mm512_storeu_si512(p + 64, z);
    _mm512_storeu_si512(p + 128, z);
    _mm512_storeu_si512(p + 192, z);
  }
  p = end - 256;
  _mm512_storeu_si512(p, z);
  _mm512_storeu_si512(p + 64, z);
  _mm512_storeu_si512(p + 128, z);
  _mm512_storeu_si512(p + 192, z);
}
#endif

/* Checked mode, at free (zero_on_free): chunk ch, size bytes, zeroed. */
QM_INLINE void zero_chunk(uintptr_t ch, size_t size) {
#if defined(__x86_64__)
  if (QM_LIKELY(qm__vec == 2)) {
    zero_avx512(ch, size);
    return;
  }
#endif
  memset((void *)ch, 0, size);
}

/* Checked mode: a chunk zeroed at free must still be zero. 64 bytes per
 * step, ORed in 16-byte vectors (32-byte ones with AVX2): a word at a
 * time cost 4 instructions per 8 bytes, the largest cost of hardening=max
 * in small churn. */
QM_INLINE void check_zero(uintptr_t ch, unsigned c) {
#if defined(__x86_64__)
  if (QM_LIKELY(qm__vec)) {
    size_t size = qm__class[c].size;
    size_t at = qm__vec == 2 ? nonzero_avx512(ch, size) : nonzero_avx2(ch, size);
    if (QM_UNLIKELY(at < size))
      zero_error(ch, c, at);
    return;
  }
#endif
  typedef uint64_t v2 __attribute__((vector_size(16), may_alias));
  const v2 *v = (const v2 *)ch;
  size_t nv = qm__class[c].size / 16, i = 0;
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

/* The canary of live neighbour n (entry w) of chunk ch, freed, differs
 * from its expected one by bad; side 1: ch is n's next neighbour. */
static _Noreturn QM_COLD void neighbour_error(uintptr_t n, uint64_t w, uint64_t bad, int side,
                                              uintptr_t ch) {
  qm__report_small_overflow((void *)(n + qm_e_offset(w)), QM_CK_SMALL, qm_e_size(w),
                            qm_e_size(w) + (size_t)__builtin_ctzll(bad) / 8, side, ch, 0);
}

/* Checked mode, at free: the live neighbours this thread owns must have
 * intact canaries, so an overflow out of one chunk that skips its own
 * canary (a stale or computed pointer) is caught at its neighbour's free
 * too. Only this thread's: another thread may be writing its chunk's entry
 * and canary right now. */
static QM_COLD void check_neighbours(uintptr_t ch, unsigned c) {
  const qm_class_info_t *ci = &qm__class[c];
  uintptr_t base = qm_region(c), top = base + committed(c);
  uintptr_t side[2] = {ch - ci->size, ch + ci->size};
  unsigned me = my_id();
  for (int i = 0; i < 2; i++) {
    uintptr_t n = side[i];
    if (!me || n < base || n + ci->size > top || qm_slot_dead(n - base, ci->size))
      continue;
    uint64_t w = qm_entry_load(qm_entry_at(c, (n - base) / ci->size));
    if (qm_e_state(w) != QM_CHUNK_ALLOC || qm_e_owner(w) != me)
      continue;
    uintptr_t user = n + qm_e_offset(w), end = user + qm_e_size(w);
    uint64_t bad = qm_load8(end) ^ qm_canary(n, qm_e_gen(w), c);
    if (bad)
      neighbour_error(n, w, bad, i ? -1 : 1, ch);
  }
}

/* ---- validation and hand-out ---- */

uintptr_t qm__small_check(qm_op_t op, void *p, uintptr_t off, unsigned *cls, uint64_t **entry,
                          uint64_t *word) {
  uintptr_t a = (uintptr_t)p, roff, index;
  uintptr_t ch = chunk_of(a, off, cls, &roff, &index);
  unsigned c = *cls;
  const qm_class_info_t *ci = &qm__class[c];
  if (QM_UNLIKELY(c == QM_ZCLASS || roff >= committed(c) ||
                  qm_slot_dead(ch - qm_region(c), ci->size)))
    small_error(op, p, ch, c, roff, index);
  uint64_t *e = qm_entry_at(c, index), w = qm_entry_load(e);
  if (QM_UNLIKELY(qm_e_state(w) != QM_CHUNK_ALLOC || a != ch + qm_e_offset(w) ||
                  qm_load8(a + qm_e_size(w)) != qm_canary(ch, qm_e_gen(w), c)))
    small_error(op, p, ch, c, roff, index);
  *entry = e;
  *word = w;
  return ch;
}

QM_INLINE void *hand_out(uintptr_t s, unsigned c, size_t n, size_t align) {
  const qm_class_info_t *ci = &qm__class[c];
  uintptr_t ch = qm_slot_chunk(s), roff = ch - qm_region(c);
  if (QM_UNLIKELY(roff >= committed(c)))
    qm__small_bad_pop(ch, c);
  uint64_t *e = qm_entry_at(c, qm_chunk_index(roff, c)), w = qm_entry_load(e);
  if (QM_UNLIKELY(qm_e_state(w) == QM_CHUNK_ALLOC || qm_e_state(w) == QM_CHUNK_SENT))
    qm__report_bad_entry(ci->size, ch, "chunk in use");
  if (qm__cache_checked && qm__opt.zero_on_free)
    check_zero(ch, c);
  uintptr_t user = qm_align_up(ch, align > QM_MIN_ALIGN ? align : QM_MIN_ALIGN);
  uint64_t gen = qm_e_gen(w);
  /* a thread with no cache owns nothing: any thread may free this chunk,
   * by compare-and-swap */
  qm_entry_store(e, qm_e_make(QM_CHUNK_ALLOC, my_id(), gen, user - ch, n) | qm_e_align_code(align));
  qm_store8(user + n, qm_canary(ch, gen, c));
  return (void *)user;
}

void *qm__small_hand_out(uintptr_t s, unsigned c, size_t n, size_t align) {
  return hand_out(s, c, n, align);
}

bool qm__small_resize(void *p, uintptr_t ch, unsigned c, uint64_t *e, uint64_t w, size_t n) {
  unsigned owner = qm_e_owner(w);
  /* realloc hands out malloc's kind of chunk, as a move would */
  uint64_t nw = (w & ~(QM_E_SIZE | QM_E_ALIGN)) | n;
  if (owner && owner == my_id())
    qm_entry_store(e, nw);
  else if (owner ||
           !__atomic_compare_exchange_n(e, &w, nw, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return false; /* another thread's, or a racing free: moved instead */
  /* the old canary lies inside the grown request, or past the shrunk one
   * where a later, larger allocation of the chunk would find it: cleared
   * first (a new canary overlapping it is written over the zeros) */
  qm_canary_clear((uintptr_t)p + qm_e_size(w));
  qm_store8((uintptr_t)p + n, qm_canary(ch, qm_e_gen(w), c));
  return true;
}

/* ---- release ---- */

void qm__small_release(uintptr_t slot, unsigned c) {
  if (qm__cache_checked) {
    uintptr_t ch = qm_slot_chunk(slot);
    size_t size = qm__class[c].size;
    /* the neighbours' canaries are cold lines: fetched while the chunk is
     * zeroed rather than after */
    __builtin_prefetch((void *)(ch - 8));
    __builtin_prefetch((void *)(ch + 2 * size - 8));
    if (qm__opt.zero_on_free)
      zero_chunk(ch, size);
    check_neighbours(ch, c);
  } else {
    qm_bin_t *b = &qm__bin[c];
    if (QM_LIKELY(b->count < b->max)) {
      b->count = qm_bin_insert(b->slot, b->count, slot);
      return;
    }
  }
  qm__cache_give_slow(slot, c);
}

/* ---- frees parked for their canary check ---- */

/* The canary of user pointer p (n bytes, at p + n) is not expect. */
/* by: the return address of the free that parked the chunk, or 0 */
static _Noreturn QM_COLD void canary_error(uintptr_t p, uintptr_t at, uint64_t expect,
                                           uintptr_t by) {
  size_t n = at - p;
  uint64_t bad = qm_load8(at) ^ expect;
  qm__report_small_overflow((void *)p, QM_CK_SMALL, n, n + (size_t)__builtin_ctzll(bad) / 8, 0, 0,
                            by);
}

void qm__small_pend_error(const qm_pend_t *e) {
  canary_error(qm_slot_chunk(e->slot), QM_PEND_AT(e), qm_canary_before(e->slot, QM_PEND_CLASS(e)),
               qm__pend_by[e - qm__pend]);
}

/* Checks parked free e and puts its chunk in its bin at a random place (r:
 * 16 bits of a draw; malloc takes the top one), or on to the central list
 * when the bin is full. The canary is the one its malloc wrote, of the
 * generation before the free's. */
static inline void pend_settle(const qm_pend_t *e, qm_bin_t *bins, uint64_t r) {
  uintptr_t s = e->slot, at = QM_PEND_AT(e);
  unsigned c = QM_PEND_CLASS(e);
  if (QM_UNLIKELY(qm_load8(at) != qm_canary_before(s, c)))
    qm__small_pend_error(e);
  qm_canary_clear(at);
  qm_bin_t *b = &bins[c];
  uint32_t n = b->count;
  if (QM_UNLIKELY(n >= b->max)) {
    qm__small_release(s, c);
    return;
  }
  /* bins hold at most 128, so the bias of a 16-bit draw is below 1/512 */
  uint32_t j = (uint32_t)(((r & 0xffff) * (n + 1)) >> 16);
  uintptr_t *slot = b->slot;
  slot[n] = slot[j];
  slot[j] = s;
  b->count = n + 1;
}

void qm__small_pend_batch(uint64_t k) {
  /* the half to check was filled QM_PEND_HALF frees before the one just
   * filled: nothing in it yet since the ring was last emptied */
  if (QM_UNLIKELY(k < QM_PEND_N))
    return;
  const qm_pend_t *q = &qm__pend[(k / QM_PEND_HALF) % 2 * QM_PEND_HALF];
  qm_bin_t *const bins = qm__bin;
  for (unsigned i = 0; i < QM_PEND_HALF; i += 4) {
    /* four places to a draw */
    uint64_t r = qm_rand();
    for (unsigned j = i; j < i + 4; j++, r >>= 16)
      pend_settle(&q[j], bins, r);
  }
}

/* The first parked free not yet checked, of n parked since the ring was
 * last emptied (see smallstate.h). */
static uint64_t pend_first(uint64_t n) {
  return n < QM_PEND_N ? 0 : n / QM_PEND_HALF * QM_PEND_HALF - QM_PEND_HALF;
}

void qm__small_pend_flush(void) {
  /* nothing parked since the last flush (always so in checked mode) */
  if (!qm__pend_i)
    return;
  /* Marked busy (fork's prepare handler and the exit hook call this
   * unmarked): the entries are settled where they stand and the count is
   * reset only at the end, so a free from a signal handler landing in the
   * loop would park behind n, be lost to the reset, and, at a multiple of
   * QM_PEND_HALF, run a batch over entries this loop settles too: the same
   * chunk twice in a bin, handed out twice. Marked, it takes the nested
   * path. The count is read under the mark. */
  uintptr_t was = qm_busy_enter();
  uint64_t n = qm__pend_i;
  qm_bin_t *const bins = qm__bin;
  uint64_t r = 0;
  for (uint64_t k = pend_first(n), i = 0; k < n; k++, i++, r >>= 16) {
    if (!(i % 4))
      r = qm_rand();
    pend_settle(&qm__pend[k % QM_PEND_N], bins, r);
  }
  qm__pend_i = 0;
  qm_busy_leave(was);
}

/* The main thread's parked frees, and what other threads sent it, when
 * the program ends (it has no exit hook): a free sent to it that finds its
 * chunk freed meanwhile by the main thread itself (the two frees raced:
 * the sender's swap landed between the owner's load and its plain store)
 * is reported before the process is gone, not never. */
__attribute__((destructor)) static void drain_at_exit(void) {
  uintptr_t was = qm_busy_enter();
  qm__state_drain();
  qm_busy_leave(was);
}

/* ---- frees sent to the owner ----
 * The sender checked the chunk (state, pointer, canary) and made its entry
 * SENT; the owner, applying the batch, checks the entry is still the SENT
 * of the generation the sender saw and makes it FREE. */

#define MSG_CAP 61 /* a batch is 512 bytes */
typedef struct msgb {
  struct msgb *next;
  struct msgb *chain; /* while spare: the next chain on the shared stack */
  uint32_t count, owner;
  uintptr_t m[MSG_CAP]; /* user pointer | generation << 48 */
} msgb_t;

/* An id's inbox (a stack of batches; CLOSED while no thread has the id)
 * and the lock under which senders apply frees to a closed one. */
#define CLOSED ((msgb_t *)1)
typedef struct owner_slot {
  _Atomic(msgb_t *) inbox;
  qm_lock_t lock;
} __attribute__((aligned(64))) owner_slot_t;
/* The steering state (every id's inbox and lock, the shared stack of
 * spare batches and its lock) lives in a metadata mapping between guard
 * pages, mapped at init; the pointer to it is sealed (qm__smeta, sealed.c). In
 * .bss it sat where a stray write past the library's data could redirect
 * frees. */
struct qm_state_meta {
  owner_slot_t owners[QM_MAX_OWNERS];
  qm_lock_t msg_lock;
  struct msgb *msg_spare;
};
int qm__state_init(void) {
  struct qm_state_meta *m = qm__meta_alloc(sizeof *m);
  if (!m)
    return -1;
  qm_lock_reinit(&m->msg_lock); /* zeroed: a default mutex; made adaptive */
  qm__smeta = m;
  return 0;
}

#define owners (qm__smeta->owners)
#define msg_lock (qm__smeta->msg_lock)
#define msg_spare (qm__smeta->msg_spare)

/* Emptied batches. A thread with an id keeps the ones it empties in a
 * chain of its own and trades whole chains of up to SPARE_CHAIN with the
 * shared stack (msg_spare: chain heads linked by `chain`, each head's count
 * the chain's length), so msg_lock is taken once per SPARE_CHAIN batches:
 * taken per batch, a consumer's msg_new and its producer's msg_drop
 * contended on it for 25-40% of producer-consumer's time. A thread with no
 * id has no exit hook to return a chain at: it trades single batches. */
#define SPARE_CHAIN 16u
static __thread msgb_t *spare_local __attribute__((tls_model("initial-exec")));
static __thread unsigned spare_local_n __attribute__((tls_model("initial-exec")));

static __thread msgb_t *outbox __attribute__((tls_model("initial-exec")));
/* the inbox of this thread's id while it has one, else NULL (drain_due's
 * one load) */
static __thread _Atomic(msgb_t *) *my_inbox __attribute__((tls_model("initial-exec")));
/* Frees re-entered from signal handlers (user pointer | generation << 48,
 * the chunk made SENT), settled at the next refill: a ring the handler
 * only appends to (slot, then nested_tail) and the refill only takes from
 * (nested_head), so neither loses the other's entries. One that finds the
 * ring full leaves its chunk SENT: never handed out again (counted). */
#define NESTED_CAP 16u
static __thread uintptr_t nested[NESTED_CAP] __attribute__((tls_model("initial-exec")));
static __thread unsigned nested_head, nested_tail __attribute__((tls_model("initial-exec")));
static _Atomic size_t nested_lost;

/* Pushes chain head..(n batches) onto the shared stack. */
static void spare_give(msgb_t *head, unsigned n) {
  head->count = n;
  qm_lock(&msg_lock);
  head->chain = msg_spare;
  msg_spare = head;
  qm_unlock(&msg_lock);
}

static msgb_t *msg_new(void) {
  msgb_t *b = spare_local;
  if (b) {
    spare_local = b->next;
    spare_local_n--;
    return b;
  }
  bool mine = my_id() != 0;
  qm_lock(&msg_lock);
  b = msg_spare;
  if (b) {
    msg_spare = b->chain;
    if (!mine && b->count > 1) { /* one batch; the rest of its chain stays */
      msgb_t *rest = b->next;
      rest->count = b->count - 1;
      rest->chain = msg_spare;
      msg_spare = rest;
    }
  }
  qm_unlock(&msg_lock);
  if (!b)
    return qm__meta_alloc(sizeof *b);
  if (mine) {
    spare_local = b->next;
    spare_local_n = b->count - 1;
  }
  return b;
}
static void msg_drop(msgb_t *b) {
  if (!my_id()) {
    b->next = NULL;
    spare_give(b, 1);
    return;
  }
  b->next = spare_local;
  spare_local = b;
  if (++spare_local_n == SPARE_CHAIN) {
    spare_give(spare_local, spare_local_n);
    spare_local = NULL;
    spare_local_n = 0;
  }
}

/* Message m, for a chunk of owner `owner`: the entry must still be the
 * ALLOC of the generation the sender saw. Returns the chunk's bin slot, or
 * reports. Called by the owner, or under the owner's lock while no thread
 * has the id. */
static uintptr_t settle(uintptr_t m, unsigned owner, unsigned *cls) {
  uintptr_t p = qm_slot_chunk(m), off = p - qm__pbase, roff, index;
  uintptr_t ch = chunk_of(p, off, cls, &roff, &index);
  uint64_t *e = qm_entry_at(*cls, index), w = qm_entry_load(e);
  if (qm_e_state(w) != QM_CHUNK_SENT || qm_e_owner(w) != owner || qm_e_gen(w) != qm_slot_gen(m) ||
      p != ch + qm_e_offset(w))
    late_double_free(p, w);
  uint64_t fw = qm_e_freed(w);
  qm_entry_store(e, fw);
  /* the sender checked the canary; the owner clears it: a sender's store
   * there would race the owner's checks of its live neighbours, which
   * read an entry and then its canary (checked mode) */
  qm_canary_clear(p + qm_e_size(w));
  return qm_slot_make(ch, qm_e_gen(fw));
}

/* Starts fetching the entry of message m's chunk (for write: settle
 * changes it). m came through an inbox from a sender that checked it; a
 * prefetch of any address is harmless all the same. */
#define SETTLE_AHEAD 8u
QM_INLINE void prefetch_entry(uintptr_t m) {
  uintptr_t p = qm_slot_chunk(m), off = p - qm__pbase;
  unsigned c = (unsigned)(off >> qm__rshift);
  if (off < qm__pspan && c != QM_ZCLASS)
    __builtin_prefetch(qm_entry_at(c, qm_chunk_index(off & qm__rmask, c)), 1);
}

/* Frees of a closed id's chunks, by their sender: each message's entry
 * made FREE (under the id's lock, as its owner would), the message
 * replaced by the chunk's slot; then given to the central lists (the id
 * has no cache) outside that lock, a run of one class at a time: the class
 * lock (and the metadata lock it may take) is never taken under an id's. */
static void settle_closed(unsigned owner, msgb_t *b) {
  for (uint32_t i = 0; i < b->count; i++) {
    unsigned c;
    b->m[i] = settle(b->m[i], owner, &c);
  }
}
static void give_settled(msgb_t *b) {
  for (uint32_t i = 0, j; i < b->count; i = j) {
    unsigned c = (unsigned)((qm_slot_chunk(b->m[i]) - qm__pbase) >> qm__rshift);
    for (j = i + 1; j < b->count && (qm_slot_chunk(b->m[j]) - qm__pbase) >> qm__rshift == c; j++)
      ;
    if (qm__cache_checked && qm__opt.zero_on_free)
      for (uint32_t k = i; k < j; k++)
        memset((void *)qm_slot_chunk(b->m[k]), 0, qm__class[c].size);
    if (qm__opt.free_delay) /* no ring ages them: the limbo does */
      for (uint32_t k = i; k < j; k++)
        qm__central_hold(c, qm__cache_group(), b->m[k], 0);
    else
      qm__central_give(c, qm__cache_group(), &b->m[i], j - i);
  }
  b->count = 0;
}
/* false if the id was adopted meanwhile: b is then sent to its inbox */
static bool apply_closed(unsigned owner, msgb_t *b) {
  owner_slot_t *o = &owners[owner];
  qm_lock(&o->lock);
  bool closed = atomic_load_explicit(&o->inbox, memory_order_relaxed) == CLOSED;
  if (closed)
    settle_closed(owner, b);
  qm_unlock(&o->lock);
  if (closed)
    give_settled(b);
  return closed;
}

static void send(msgb_t *b) {
  owner_slot_t *o = &owners[b->owner];
  msgb_t *head = atomic_load_explicit(&o->inbox, memory_order_relaxed);
  for (;;) {
    if (head == CLOSED) {
      if (apply_closed(b->owner, b)) {
        msg_drop(b);
        return;
      }
      head = atomic_load_explicit(&o->inbox, memory_order_relaxed);
      continue;
    }
    b->next = head;
    /* release: the owner's settle reads the entries after our reads */
    if (atomic_compare_exchange_weak_explicit(&o->inbox, &head, b, memory_order_release,
                                              memory_order_relaxed))
      return;
  }
}

static void rpend_flush(void);

void qm__state_flush_outbox(void) {
  rpend_flush();
  msgb_t *b = outbox;
  if (b && b->count) {
    outbox = NULL;
    send(b);
  }
}

/* A free of p (validated, entry w) that another thread owns: batched per
 * owner. A thread with no cache has no refill to flush its outbox at:
 * it sends at once. */
static void send_free(uintptr_t p, uint64_t w) {
  unsigned owner = qm_e_owner(w);
  msgb_t *b = outbox;
  if (b && (b->owner != owner || b->count == MSG_CAP)) {
    outbox = NULL;
    send(b);
    b = NULL;
  }
  if (!b) {
    if (!(b = msg_new()))
      qm__report_send_failed((void *)p);
    b->count = 0;
    b->owner = owner;
    outbox = b;
  }
  b->m[b->count++] = qm_slot_make(p, qm_e_gen(w));
  if (!my_id()) {
    outbox = NULL;
    send(b);
  }
}

/* ---- frees of other threads' chunks, parked for their canary check ----
 * A free of a chunk another thread owns makes its entry SENT at once (so a
 * second free of it, on any thread, reports at once), starts fetching the
 * canary's line and parks the chunk here; the free RPEND_N frees later
 * checks the canary and only then sends the chunk to its owner, so the
 * chunk cannot be handed out again unchecked. The canary's line was last
 * written by the owner's malloc, on another core: waiting for it was over
 * half of a producer-consumer consumer's time. Only threads with an id
 * (whose exit hook flushes the ring); checked mode checks at once. */
#define RPEND_N 16u
typedef struct rpend {
  uintptr_t m;     /* user pointer | generation << 48 (0: empty) */
  uintptr_t at;    /* where its canary is */
  uint64_t expect; /* the canary */
  uint64_t owner;
} rpend_t;
static __thread rpend_t rpend[RPEND_N] __attribute__((tls_model("initial-exec")));
static __thread unsigned rpend_i __attribute__((tls_model("initial-exec")));

static void rpend_settle(const rpend_t *q) {
  if (QM_UNLIKELY(qm_load8(q->at) != q->expect))
    canary_error(qm_slot_chunk(q->m), q->at, q->expect, 0);
  send_free(qm_slot_chunk(q->m), (uint64_t)q->owner << QM_E_OWNER_SHIFT | qm_slot_gen(q->m)
                                                                              << QM_E_GEN_SHIFT);
}

static void rpend_flush(void) {
  for (unsigned i = 0; i < RPEND_N; i++) {
    rpend_t q = rpend[i];
    if (!q.m)
      continue;
    rpend[i].m = 0;
    rpend_settle(&q);
  }
}

/* the main thread's (which has no exit hook), when the program ends: an
 * overflow past a chunk it freed among its last RPEND_N such frees is
 * still reported */
__attribute__((destructor)) static void rpend_at_exit(void) {
  uintptr_t was = qm_busy_enter();
  rpend_flush();
  qm_busy_leave(was);
}

/* Settles the frees other threads sent this one (id me) into its bins. */
QM_INLINE void drain_inbox(unsigned me) {
  if (me && atomic_load_explicit(&owners[me].inbox, memory_order_relaxed)) {
    msgb_t *b = atomic_exchange_explicit(&owners[me].inbox, NULL, memory_order_acquire);
    while (b && b != CLOSED) {
      msgb_t *next = b->next;
      /* the entries were last written by the senders, on other cores:
       * fetched SETTLE_AHEAD messages ahead, so their misses overlap */
      for (uint32_t i = 0; i < b->count && i < SETTLE_AHEAD; i++)
        prefetch_entry(b->m[i]);
      for (uint32_t i = 0; i < b->count; i++) {
        unsigned c;
        if (i + SETTLE_AHEAD < b->count)
          prefetch_entry(b->m[i + SETTLE_AHEAD]);
        uintptr_t s = settle(b->m[i], me, &c);
        qm__small_release(s, c);
      }
      msg_drop(b);
      b = next;
    }
  }
}

void qm__state_drain(void) {
  qm__small_pend_flush();
  unsigned me = my_id();
  drain_inbox(me);
  while (nested_head != nested_tail) {
    uintptr_t m = nested[nested_head % NESTED_CAP];
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    nested_head++;
    uintptr_t p = qm_slot_chunk(m), off = p - qm__pbase, roff, index;
    unsigned c;
    if (off >= qm__pspan || (off >> qm__rshift) == QM_ZCLASS) {
      /* not a small chunk: applied as the free it is, with its own mark */
      uintptr_t was = qm__freeing;
      qm__freeing = 0;
      qm__small_up.free((void *)p);
      qm__freeing = was;
      continue;
    }
    chunk_of(p, off, &c, &roff, &index);
    uint64_t w = qm_entry_load(qm_entry_at(c, index));
    unsigned owner = qm_e_owner(w);
    if (owner && owner != me) { /* another thread's: it settles the SENT entry */
      if (qm_e_state(w) != QM_CHUNK_SENT || qm_e_gen(w) != qm_slot_gen(m))
        late_double_free(p, w);
      send_free(p, w);
    } else {
      uintptr_t s = settle(m, owner, &c);
      qm__small_release(s, c);
    }
  }
}

uintptr_t qm__small_take_slow(unsigned c) {
  /* frees other threads sent this one come back to its bins first */
  qm__state_drain();
  return qm__cache_take_slow(c);
}

/* ---- checked mode's own malloc and free ----
 * Every malloc and free of checked mode misses the fast paths (its bins
 * stay empty); these take it the shortest way: each check done once, the
 * steering work only when there is some. */

/* Whether qm__state_drain has anything to do: frees other threads sent
 * this one, or frees re-entered from a signal handler. */
QM_INLINE bool drain_due(void) {
  return (my_inbox && atomic_load_explicit(my_inbox, memory_order_relaxed)) ||
         nested_head != nested_tail;
}

/* Checked mode's hand-out of bin slot s of class c for n bytes (no
 * over-alignment) by a thread with a cache: hand_out's checks, with the
 * owner and state bits from qm__me, as the default fast path has them. */
QM_INLINE void *hand_out_checked(uintptr_t s, unsigned c, size_t n) {
  uintptr_t ch = qm_slot_chunk(s), roff = ch - qm_region(c);
  if (QM_UNLIKELY(roff >= committed(c)))
    qm__small_bad_pop(ch, c);
  uint64_t *e = qm_entry_at(c, qm_chunk_index(roff, c)), w = qm_entry_load(e);
  /* ALLOC (1) and SENT (3): the state's low bit */
  if (QM_UNLIKELY(w & (uint64_t)1 << QM_E_STATE_SHIFT))
    qm__report_bad_entry(qm__class[c].size, ch, "chunk in use");
  if (qm__opt.zero_on_free)
    check_zero(ch, c);
  uint64_t gen = qm_e_gen(w);
  qm_entry_store(e, qm__me | gen << QM_E_GEN_SHIFT | (uint64_t)n);
  qm_store8(ch + n, qm_canary(ch, gen, c));
  return (void *)ch;
}

void *qm__small_malloc_checked_fast(size_t n, unsigned c, uintptr_t was) {
  uintptr_t s;
  /* an exhausted class: the slow path tries larger ones */
  if (QM_UNLIKELY(c >= QM_NCLASS || drain_due() || qm__opt.guard_all || !qm__cc[c].slot ||
                  !(s = qm_cache_take_checked(c)))) {
    qm_freeing_restore(was);
    return qm__small_up.malloc_slow(n);
  }
  void *p = hand_out_checked(s, c, n);
  qm_freeing_restore(was);
  return p;
}

void *qm__small_malloc_checked(size_t n) {
  if (QM_UNLIKELY(drain_due()))
    qm__state_drain();
  void *p = NULL;
  /* as small_alloc_plain: a larger class when this one's region is full */
  for (unsigned c = qm_class_of(n); c < QM_NCLASS; c++) {
    uintptr_t s = qm_cache_take_checked(c);
    if (QM_LIKELY(s)) {
      p = hand_out(s, c, n, QM_MIN_ALIGN);
      break;
    }
  }
  if (!p)
    errno = ENOMEM;
  return p;
}

/* A free of chunk a (off = a - qm__pbase) this thread owns, live, at
 * offset 0, canary intact: made FREE, zeroed (zero_on_free), its live
 * neighbours of this thread checked, given to the ring; false, having
 * changed nothing, for any other (qm__small_free_slow then takes it, and
 * reports what is wrong). The neighbours' entries and canaries are read
 * ahead of the chunk's own canary, so that the three cold lines arrive
 * together. */
QM_INLINE bool free_checked(uintptr_t a, uintptr_t off) {
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t roff = off & qm__rmask;
  if (c == QM_ZCLASS)
    return false;
  size_t top = committed(c);
  if ((a & (QM_MIN_ALIGN - 1)) || roff >= top)
    return false;
  const qm_class_info_t *ci = &qm__class[c];
  size_t size = ci->size;
  uintptr_t i = qm_chunk_index(roff, c);
  if (i * size != roff)
    return false;
  /* the whole chunk is written (zeroed) below: its lines, its canary's
   * among them, start coming now, together */
  if (qm__opt.zero_on_free)
    QM_PREFETCH_SPAN(a, size, QM_PF_W);
  uint64_t *e = qm_entry_at(c, i), w = qm_entry_load(e);
  const uint64_t mine = qm__me;
  if ((w & (QM_E_STATE | QM_E_OFF | QM_E_OWNER)) != mine)
    return false; /* not live, not at offset 0, or not this thread's */
  /* the live neighbours this thread owns (a dead slot beside a guard page
   * is never carved: its entry stays NONE); their canaries' lines start
   * coming now */
  const uint64_t live = mine & (QM_E_STATE | QM_E_ID);
  uint64_t lw = roff >= size ? qm_entry_load(e - 1) : 0;
  uint64_t rw = roff + 2 * size <= top ? qm_entry_load(e + 1) : 0;
  bool lhas = (lw & (QM_E_STATE | QM_E_ID)) == live;
  bool rhas = (rw & (QM_E_STATE | QM_E_ID)) == live;
  /* each side by name, not in arrays: looped over, they went through the
   * stack */
  uintptr_t lend = a - size + qm_e_offset(lw) + qm_e_size(lw);
  uintptr_t rend = a + size + qm_e_offset(rw) + qm_e_size(rw);
  if (lhas)
    __builtin_prefetch((void *)lend);
  if (rhas)
    __builtin_prefetch((void *)rend);
  uint64_t gen = qm_e_gen(w);
  if (QM_UNLIKELY(qm_load8(a + qm_e_size(w)) != qm_canary(a, gen, c)))
    return false;
  uint64_t fw = qm_e_freed_alloc(w);
  qm_entry_store(e, fw);
  if (qm__opt.zero_on_free)
    zero_chunk(a, size);
  else
    qm_canary_clear(a + qm_e_size(w));
  if (lhas) {
    uint64_t bad = qm_load8(lend) ^ qm_canary(a - size, qm_e_gen(lw), c);
    if (QM_UNLIKELY(bad))
      neighbour_error(a - size, lw, bad, 1, a);
  }
  if (rhas) {
    uint64_t bad = qm_load8(rend) ^ qm_canary(a + size, qm_e_gen(rw), c);
    if (QM_UNLIKELY(bad))
      neighbour_error(a + size, rw, bad, -1, a);
  }
  qm_cache_give_checked(qm_slot_make(a, qm_e_gen(fw)), c, size);
  return true;
}

void qm__state_adopt(unsigned id) {
  owner_slot_t *o = &owners[id];
  qm_lock(&o->lock);
  /* frees sent while nobody had the id were applied by their senders */
  atomic_store_explicit(&o->inbox, NULL, memory_order_relaxed);
  qm_unlock(&o->lock);
  qm__me = (uint64_t)QM_CHUNK_ALLOC << QM_E_STATE_SHIFT | (uint64_t)id << QM_E_OWNER_SHIFT;
  my_inbox = &o->inbox;
}

/* Closes id's inbox and applies what was in it, as a sender would (under
 * the id's lock; in a fork child, whose only thread this is, without). */
static void close_inbox(unsigned id, bool locked) {
  owner_slot_t *o = &owners[id];
  msgb_t *b = atomic_exchange_explicit(&o->inbox, CLOSED, memory_order_acquire);
  while (b && b != CLOSED) {
    msgb_t *next = b->next;
    if (locked)
      apply_closed(id, b);
    else {
      settle_closed(id, b);
      give_settled(b);
    }
    msg_drop(b);
    b = next;
  }
}

void qm__state_retire(unsigned id) {
  qm__me = QM_E_NOBODY; /* later frees here go through the closed path */
  my_inbox = NULL;
  close_inbox(id, true);
  if (spare_local) /* the thread's emptied batches, for the others */
    spare_give(spare_local, spare_local_n);
  spare_local = NULL;
  spare_local_n = 0;
}

void qm__state_orphan(unsigned id) {
  qm_lock_reinit(&owners[id].lock);
  close_inbox(id, false);
}

void qm__state_fork_settle(void) {
  uintptr_t was = qm_busy_enter();
  qm__state_flush_outbox();
  drain_inbox(my_id());
  qm_busy_leave(was);
}

uintptr_t qm__small_regen(uintptr_t s, unsigned c) {
  uintptr_t ch = qm_slot_chunk(s), roff = ch - qm_region(c);
  if (roff >= committed(c))
    qm__small_bad_pop(ch, c);
  uint64_t *e = qm_entry_at(c, qm_chunk_index(roff, c)), w = qm_entry_load(e);
  /* FREE, or NONE: carved, never handed out */
  if (qm_e_state(w) == QM_CHUNK_ALLOC || qm_e_state(w) == QM_CHUNK_SENT)
    qm__report_bad_entry(qm__class[c].size, ch, "chunk in use");
  uint64_t gen = qm_rand() & 0xffff;
  qm_entry_store(e, (w & ~QM_E_GEN) | gen << QM_E_GEN_SHIFT);
  return qm_slot_make(ch, gen);
}

void qm__small_pend_regen(void) {
  /* marked busy, as the flush is: a handler's free parking (and batching)
   * here would settle entries half given their new generation */
  uintptr_t was = qm_busy_enter();
  uint64_t n = qm__pend_i;
  for (uint64_t k = pend_first(n); k < n; k++) {
    qm_pend_t *e = &qm__pend[k % QM_PEND_N];
    uintptr_t s = e->slot, at = QM_PEND_AT(e);
    unsigned c = QM_PEND_CLASS(e);
    /* checked against the canary its malloc wrote, then given the one the
     * new generation expects */
    if (qm_load8(at) != qm_canary_before(s, c))
      qm__small_pend_error(e);
    s = qm__small_regen(s, c);
    qm_store8(at, qm_canary_before(s, c));
    e->slot = s;
  }
  qm_busy_leave(was);
}

/* (no steering state: small chunks are not in use) */
qm_lock_t *qm__state_owner_lock(unsigned id) { return &owners[id].lock; }

static unsigned fork_ids; /* the owner locks fork holds: 1..fork_ids-1 */
void qm__state_fork_prepare(unsigned ids) {
  if (!qm__smeta)
    return;
  qm_fork_lock(&msg_lock);
  fork_ids = ids < QM_MAX_OWNERS ? ids : QM_MAX_OWNERS;
  for (unsigned id = 1; id < fork_ids; id++)
    qm_fork_lock(&owners[id].lock);
}
void qm__state_fork_parent(void) {
  if (!qm__smeta)
    return;
  for (unsigned id = fork_ids; id-- > 1;)
    qm_unlock(&owners[id].lock);
  qm_unlock(&msg_lock);
}
/* Every id's lock afresh, not only this thread's and the registered
 * ones': a closed id's lock held across fork stayed held in the child,
 * whose first free sent to that id then waited for it forever. */
void qm__state_fork_child(void) {
  if (!qm__smeta)
    return;
  qm_lock_reinit(&msg_lock);
  for (unsigned id = 1; id < fork_ids; id++)
    qm_lock_reinit(&owners[id].lock);
}

/* ---- free past the fast path ---- */

void qm__free_nested(void *p) {
  uintptr_t a = (uintptr_t)p, off = a - qm__pbase;
  if (!p)
    return;
  /* a realloc's mark first: p | QM_REALLOCING is also the address p + 2,
   * an interior pointer, which must report as one */
  uintptr_t f = qm__freeing;
  if (f & QM_REALLOCING) {
    if (a == (f & ~QM_REALLOCING))
      qm__report_refree(p, 0, QM_REFREE_HANDLER_REALLOC);
  } else if (a == f) {
    qm__report_refree(p, 0, QM_REFREE_HANDLER);
  }
  /* a small chunk is checked now, lock-free; anything else (zero-size,
   * large, guarded) takes locks the interrupted free may hold: checked
   * when applied */
  uintptr_t m = a;
  if (off < qm__pspan && (off >> qm__rshift) != QM_ZCLASS) {
    unsigned c;
    uint64_t *e, w;
    qm__small_check(QM_OP_FREE, p, off, &c, &e, &w);
    /* SENT at once: a later free of p finds it and reports; a plain store
     * by the interrupted code over it is found at the refill, which expects
     * this very SENT entry of this generation */
    while (!__atomic_compare_exchange_n(e, &w, qm_e_sent(w), false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
      qm__small_check(QM_OP_FREE, p, off, &c, &e, &w); /* another free won: reports */
    m = qm_slot_make(a, qm_e_gen(w));
  }
  unsigned t = nested_tail;
  if (t - nested_head < NESTED_CAP) {
    nested[t % NESTED_CAP] = m;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    nested_tail = t + 1;
  } else {
    atomic_fetch_add_explicit(&nested_lost, 1, memory_order_relaxed);
  }
}

static void free_general(void *p, uintptr_t off);

/* A chunk this thread just made FREE (entry w before, fw after; a its
 * user pointer): its checked canary cleared, into the cache. */
static void release_freed(uintptr_t a, uintptr_t ch, unsigned c, uint64_t w, uint64_t fw) {
  qm_canary_clear(a + qm_e_size(w));
  qm__small_release(qm_slot_make(ch, qm_e_gen(fw)), c);
}

void qm__small_free_slow(void *p, uintptr_t off) {
  if (qm__cache_checked && QM_LIKELY(free_checked((uintptr_t)p, off))) {
    qm_freeing_clear();
    return;
  }
  free_general(p, off);
}

/* Everything but checked mode's own frees (kept apart: its registers
 * would be saved on that path too). */
static __attribute__((noinline)) void free_general(void *p, uintptr_t off) {
  if ((off >> qm__rshift) == QM_ZCLASS) {
    qm__zero_free(p, QM_OP_FREE);
    qm_freeing_clear();
    return;
  }
  uintptr_t a = (uintptr_t)p, roff, index;
  unsigned c;
  uint64_t *e, w;
  uintptr_t ch = chunk_of(a, off, &c, &roff, &index);
  if (QM_UNLIKELY(c == QM_ZCLASS || roff >= committed(c) ||
                  qm_slot_dead(ch - qm_region(c), qm__class[c].size)))
    small_error(QM_OP_FREE, p, ch, c, roff, index);
  e = qm_entry_at(c, index);
  w = qm_entry_load(e);
  unsigned owner = qm_e_owner(w), me = my_id();
  /* a thread that frees what others allocate and has not malloc'd yet:
   * its cache and id now, so it batches its frees (else each took
   * msg_lock and went alone), the id of this chunk's owner if that thread
   * has exited (a successor then frees its predecessor's chunks as its
   * own) */
  if (owner && owner != me && !me && !qm__cache_checked && qm__cache_ensure(owner))
    me = my_id();
  if (owner && owner != me && me && !qm__cache_checked) {
    /* another thread's chunk: SENT at once, its canary checked RPEND_N
     * frees from now (see rpend). The owner may be changing the entry with
     * plain stores: if it freed the chunk meanwhile, this swap fails and
     * reports, or its store overwrites SENT and the owner reports when the
     * chunk reaches it. */
    for (;;) {
      if (QM_UNLIKELY(qm_e_state(w) != QM_CHUNK_ALLOC || a != ch + qm_e_offset(w)))
        small_error(QM_OP_FREE, p, ch, c, roff, index);
      if (__atomic_compare_exchange_n(e, &w, qm_e_sent(w), false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED))
        break;
    }
    owner = qm_e_owner(w);
    if (QM_LIKELY(owner != my_id())) {
      uintptr_t at = a + qm_e_size(w);
      __builtin_prefetch((void *)at);
      rpend_t *q = &rpend[rpend_i++ % RPEND_N], old = *q;
      *q = (rpend_t){qm_slot_make(a, qm_e_gen(w)), at, qm_canary(ch, qm_e_gen(w), c), owner};
      if (old.m)
        rpend_settle(&old);
      qm_freeing_clear();
      return;
    }
    /* it became this thread's meanwhile (an id retired and adopted): SENT
     * by this thread, checked and freed now */
    if (QM_UNLIKELY(qm_load8(a + qm_e_size(w)) != qm_canary(ch, qm_e_gen(w), c)))
      canary_error(a, a + qm_e_size(w), qm_canary(ch, qm_e_gen(w), c), 0);
    uint64_t fw = qm_e_freed(w);
    qm_entry_store(e, fw);
    release_freed(a, ch, c, w, fw);
    qm_freeing_clear();
    return;
  }
  ch = qm__small_check(QM_OP_FREE, p, off, &c, &e, &w);
  owner = qm_e_owner(w);
  /* each way below clears the checked canary once the entry has changed
   * and before the chunk can be anyone's again; one sent to its owner is
   * cleared by the owner (settle) */
  if (owner && owner == me) {
    uint64_t fw = qm_e_freed(w);
    qm_entry_store(e, fw);
    release_freed(a, ch, c, w, fw);
  } else if (!owner) {
    uint64_t fw;
    while (!__atomic_compare_exchange_n(e, &w, fw = qm_e_freed(w), false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
      ch = qm__small_check(QM_OP_FREE, p, off, &c, &e, &w); /* another free won: reports */
    release_freed(a, ch, c, w, fw);
  } else {
    /* checked mode, or a thread with no id: checked at once */
    while (!__atomic_compare_exchange_n(e, &w, qm_e_sent(w), false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
      qm__small_check(QM_OP_FREE, p, off, &c, &e, &w);
    if (qm_e_owner(w) == me && me) { /* it became this thread's meanwhile */
      uint64_t fw = qm_e_freed(w);
      qm_entry_store(e, fw);
      release_freed(a, ch, c, w, fw);
    } else {
      send_free((uintptr_t)p, w);
    }
  }
  qm_freeing_clear();
}
