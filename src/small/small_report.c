/* small_report.c: what the small side says of an address (its part of
 * qm__describe) and its reports about small chunks, each cold and not
 * returning. Read-only: entries are read racily, at worst a moment old.
 */
#include "report.h"
#include "smallstate_int.h"
#include "zero.h"

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
  if (roff >= qm_committed(c)) {
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
void qm__small_error(qm_op_t op, void *p, uintptr_t ch, unsigned c, uintptr_t roff,
                     uintptr_t index) {
  uintptr_t a = (uintptr_t)p;
  const qm_class_info_t *ci = &qm__class[c];
  if (c != QM_ZCLASS && roff < qm_committed(c) && !qm_slot_dead(ch - qm_region(c), ci->size)) {
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
void qm__small_late_double_free(uintptr_t p, uint64_t w) {
  qm__report_refree((void *)p, qm_e_size(w), QM_REFREE_TWO_THREADS);
}

void qm__small_bad_pop(uintptr_t ch, unsigned c) {
  qm__report_bad_entry(qm__class[c].size, ch, "outside its class region");
}

/* A chunk zeroed at free with a byte set at or after offset at. */
void qm__small_zero_error(uintptr_t ch, unsigned c, size_t at) {
  const unsigned char *q = (const unsigned char *)ch;
  while (!q[at])
    at++;
  qm__report_write_after_free(ch, qm__class[c].size, at, q[at]);
}

/* The canary of live neighbour n (entry w) of chunk ch, freed, differs
 * from its expected one by bad; side 1: ch is n's next neighbour. */
void qm__small_neighbour_error(uintptr_t n, uint64_t w, uint64_t bad, int side, uintptr_t ch) {
  qm__report_small_overflow((void *)(n + qm_e_offset(w)), QM_CK_SMALL, qm_e_size(w),
                            qm_e_size(w) + (size_t)__builtin_ctzll(bad) / 8, side, ch, 0);
}
