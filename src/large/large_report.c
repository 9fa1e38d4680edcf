/* large_report.c: what lies at an address in a large chunk's mapping (the
 * large side of qm__describe), and the stacks that freed and allocated the
 * chunk, which follow every report about it (report.c prints them, handed
 * in by whoever reports: this file gives data only). Lock-free and allocation-free,
 * for the SIGSEGV handler: the record is found through the address index
 * (qm__rec_find); records and stack entries never move, and are
 * read racily (counts clamped).
 */
#include "large_report.h"

#include "belt.h"
#include "large_record.h"
#include "stack.h"

bool qm__large_describe(uintptr_t a, qm_place_t *pl) {
  qm_buf_t *d = &pl->words;
  if (!atomic_load_explicit(&S.ready, memory_order_acquire) || !LF.blk)
    return false;
  uint32_t i = qm__rec_find(a);
  if (i != NIL) {
    const block_t *b = &LF.blk[i];
    /* a racy read of the record: the fault came from an access to it, so
     * at worst the words are those of a moment earlier */
    uintptr_t u = user_of(b);
    pl->chunk = true;
    pl->kind = QM_CK_LARGE;
    pl->user = u;
    pl->size = b->chunk.size;
    bool freed = b->chunk.state == B_QUAR || b->chunk.state == B_DEAD ||
                 (b->chunk.state == B_BUSY && (b->chunk.flags & F_FREED));
    if (freed && a >= b->map.usable && a < u) {
      /* the chunk's memory before its last user pointer: a THP chunk's
       * lead, which an earlier use of the chunk may have started in */
      pl->access = QM_ACC_UAF;
      qm_buf_dec(d, u - a);
      qm_buf_str(d, u - a == 1 ? " byte before freed " : " bytes before freed ");
    } else if (a < u) {
      pl->access = QM_ACC_UNDERFLOW;
      qm_buf_dec(d, u - a);
      qm_buf_str(d, u - a == 1 ? " byte before " : " bytes before ");
    } else if (freed) {
      pl->access = QM_ACC_UAF;
      qm_buf_str(d, "offset ");
      qm_buf_dec(d, a - u);
      qm_buf_str(d, " in freed ");
    } else if (a - u >= b->chunk.size) {
      pl->access = QM_ACC_OVERFLOW;
      size_t past = a - u - b->chunk.size + 1;
      qm_buf_dec(d, past);
      qm_buf_str(d, past == 1 ? " byte past the end of " : " bytes past the end of ");
    } else {
      pl->access = QM_ACC_LIVE;
      qm_buf_str(d, "offset ");
      qm_buf_dec(d, a - u);
      qm_buf_str(d, " in ");
    }
    qm_buf_str(d, "large chunk of ");
    qm_buf_dec(d, b->chunk.size);
    qm_buf_str(d, " bytes at ");
    qm_buf_hex(d, u);
    return true;
  }
  /* in the belt but in no record: a chunk whose record the ring let go
   * (the belt has not come round to its range again), or a range never
   * handed out */
  bool ever;
  if (!qm__belt_holds(a, &ever))
    return false;
  pl->access = ever ? QM_ACC_UAF : QM_ACC_WILD;
  qm_buf_str(d, ever ? "in a large chunk freed long ago, its record no longer kept"
                     : "in qmalloc's large-chunk reservation, never handed out");
  return true;
}

const qm_kept_t *qm__large_kept(uintptr_t a, qm_kept_t *k) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire) || !LF.blk || !LF.frames)
    return NULL;
  uint32_t i = qm__rec_find(a);
  if (i == NIL)
    return NULL;
  const block_t *b = &LF.blk[i];
  stk_t *e = qm__stk_at(i);
  if (!e)
    return NULL;
  /* racy reads, as in qm__large_describe: counts are clamped */
  const uintptr_t *pcs = qm__stk_pcs(e);
  k->freed = b->chunk.state == B_QUAR || b->chunk.state == B_DEAD ||
             (b->chunk.state == B_BUSY && (b->chunk.flags & F_FREED));
  k->alloc_tid = e->alloc_tid;
  k->free_tid = e->free_tid;
  k->alloc_pc = pcs;
  k->free_pc = pcs + LF.frames;
  k->nalloc = e->nalloc < LF.frames ? e->nalloc : LF.frames;
  k->nfree = e->nfree < LF.frames ? e->nfree : LF.frames;
  k->frees_ago = k->ms_ago = 0;
  if (k->freed) {
    uint64_t now = qm__clock_ms();
    k->frees_ago = qm__rec_frees() - e->free_seq;
    k->ms_ago = now > e->free_ms ? now - e->free_ms : 0;
  }
  return k;
}
