/* quarantine.c: freed large chunks between their free and their reuse or
 * unmapping: the FIFO (an aging queue of records, oldest first, Q.age its
 * aged prefix) and the hot and cold bins of aged chunks (lists through the
 * records). It owns Q (quarantine_state.h), under S.lock, which the reuse
 * choice and gathering (quarantine_reuse.c) and the limits and the chunks
 * that go when one is passed (quarantine_limits.c) read and change too.
 * The quarantine makes no syscall and changes no chunk's state (the
 * secondary does, and works on the chunks chosen here). Of a record it
 * writes the q part (large.h), and a pooled chunk's dirty pages as it
 * gathers from it. The window: a freed chunk stays mapped and out of every
 * bin until quarantine_min_frees large frees and quarantine_min_mb MiB of
 * them came after it (only the mapping budget unmaps it earlier); a chunk
 * in a bin is always QUAR and aged.
 */
#include "quarantine.h"

#include "large_record.h"
#include "options.h"
#include "out.h"
#include "quarantine_state.h"
#include "strategy.h"

/* The quarantine's state (quarantine_state.h), all of it under S.lock. */
qm_q_state_t qm__q;

void qm__q_init(void) {
  for (unsigned c = 0; c < NBINS; c++)
    Q.hot[c] = Q.cold[c] = NIL;
}

void qm__q_tail_add(size_t pages) { Q.ltail += pages; }

void qm__q_tail_sub(size_t pages) { Q.ltail -= pages; }

void qm__q_live(size_t bytes) { Q.live = bytes; }

void qm__q_window_broken(void) { Q.window_breaks++; }

void qm__q_stats(qm_stats_t *s) {
  s->quarantine_chunks = Q.qcount;
  s->quarantine_bytes = Q.qpages << qm__page_shift;
  s->quarantine_resident_bytes = Q.qresident << qm__page_shift;
  s->window_breaks = Q.window_breaks;
}

/* ---- the FIFO and the bins (under S.lock) ---- */

/* A bin holds aged chunks by what serves a request best: hot[] by resident
 * pages (a request that fits them takes no fault), cold[] by capacity (no
 * page resident: only the mmap is saved). */
static uint32_t *bin_head(const block_t *b) {
  return b->q.cold ? &Q.cold[b->q.bin] : &Q.hot[b->q.bin];
}

void qm__q_bin_insert(uint32_t i) {
  block_t *b = B(i);
  if (b->q.inbin)
    return;
  b->q.cold = !b->map.dirty;
  b->q.bin = (uint8_t)pclass(b->map.dirty ? b->map.dirty : b->map.cap);
  uint32_t *h = bin_head(b);
  b->q.prev = NIL;
  b->q.next = *h;
  if (*h != NIL)
    B(*h)->q.prev = i;
  *h = i;
  b->q.inbin = true;
  if (!b->q.cold)
    Q.nhot[b->q.bin]++;
}

void qm__q_bin_remove(uint32_t i) {
  block_t *b = B(i);
  if (!b->q.inbin)
    return;
  if (b->q.prev != NIL)
    B(b->q.prev)->q.next = b->q.next;
  else
    *bin_head(b) = b->q.next;
  if (b->q.next != NIL)
    B(b->q.next)->q.prev = b->q.prev;
  b->q.inbin = false;
  if (!b->q.cold)
    Q.nhot[b->q.bin]--;
}

/* The FIFO is an aging queue (age.h) of record indices: a chunk leaves it
 * from within, whenever a request reuses it from a bin, a belt chunk is
 * buried or the budgets unmap the oldest chunk not BUSY, by emptying its
 * entry (found by its q.pos). A full ring is compacted, or doubled if fewer
 * than half its entries are empty: O(1) a push. It can always take one
 * more: it holds records, at most LF.blk_max entries, and the chunk
 * entering is not among them. */
static void fifo_moved(uint32_t i, uint32_t at) { B(i)->q.pos = at; }

/* Writes to the pages of positions [from, to) (the entries as they are):
 * faulted in now, while the ring grows or a program starts to churn large
 * chunks, and not one at a time as the pushes first reach them (a fault in
 * a thousand frees in the midst of churn, as long as the ring had never
 * wrapped). */
static void fifo_touch(uint32_t from, uint32_t to) {
  uint32_t step = (uint32_t)(qm__page / sizeof(uint32_t));
  for (uint32_t k = from; k < to; k = (k | (step - 1)) + 1) {
    volatile uint32_t *e = &LF.qring[k];
    *e = *e;
  }
}

/* Chunks entered after which the ring's pages are touched (fifo_touch):
 * the program churns large chunks. */
#define PREFILL_AT 256

/* The first capacity: twice the aged chunks the cap allows (the chunks in
 * the window come on top, and half empty is when the ring grows). */
static uint32_t fifo_cap0(void) {
  size_t want = 2 * ((size_t)qm__opt.quarantine_max_chunks + 1), cap = 64;
  while (cap < want && cap < LF.blk_max)
    cap *= 2;
  return (uint32_t)(cap < LF.blk_max ? cap : LF.blk_max);
}

static void fifo_room(void) {
  uint32_t cap = Q.cap, newcap = cap;
  if (Q.qcount >= cap / 2 && cap < LF.blk_max) {
    newcap = cap * 2;
    fifo_touch(cap, newcap);
  }
  qm_age_compact(&Q.fifo, LF.qring, cap, newcap, &Q.age, fifo_moved);
  Q.cap = newcap;
  QM_CHECK(!qm_age_full(&Q.fifo, Q.cap));
}

static void q_append(uint32_t i) {
  block_t *b = B(i);
  if (!Q.cap)
    Q.cap = fifo_cap0();
  if (qm_age_full(&Q.fifo, Q.cap))
    fifo_room();
  if (Q.pushes < PREFILL_AT && ++Q.pushes == PREFILL_AT)
    fifo_touch(0, Q.cap);
  uint32_t at = qm_age_push(&Q.fifo, Q.cap);
  LF.qring[at] = i;
  b->q.pos = at;
  Q.qcount++;
  Q.qpages += b->map.cap;
  Q.qresident += b->map.dirty;
}

/* Takes a chunk out of the quarantine (to reuse or unmap it). Its place
 * is checked first: a corrupted q.pos must not empty another's, nor match
 * a stale copy that a compaction left past the queue's entries. */
void qm__q_unlink(uint32_t i) {
  block_t *b = B(i);
  QM_CHECK(b->q.pos < Q.cap && LF.qring[b->q.pos] == i);
  QM_CHECK_OP((b->q.pos + Q.cap - Q.fifo.head) % Q.cap, <, Q.fifo.n);
  qm__q_bin_remove(i);
  LF.qring[b->q.pos] = QM_AGE_EMPTY;
  qm_age_skip(&Q.fifo, LF.qring, Q.cap, &Q.age);
  Q.qcount--;
  Q.qpages -= b->map.cap;
  Q.qresident -= b->map.dirty;
}

/* Moves every chunk that has aged enough (min frees and min bytes freed
 * after it) into the bins where allocation looks. FIFO order makes the aged
 * chunks a prefix of the quarantine. */
static bool aged(const block_t *b) {
  /* a belt chunk's pages are reused at another address: its own range
   * waits for the belt, so its pages need not wait at all */
  if (LF.strategy == QM_STRATEGY_NONE || (b->chunk.flags & F_BELT))
    return true;
  uint64_t bytes, frees = qm__rec_clock(&bytes);
  return frees - b->chunk.seq >= qm__opt.quarantine_min_frees &&
         bytes - b->q.mark >= qm__opt.quarantine_min_mb << 20;
}

void qm__q_age(void) {
  for (; Q.age < Q.fifo.n; Q.age++) {
    uint32_t i = qm_q_fifo_at(Q.age);
    if (i == QM_AGE_EMPTY)
      continue;
    block_t *b = B(i);
    if (!aged(b))
      break;
    /* a chunk BUSY being dropped is binned when it comes back */
    if (!(b->chunk.flags & F_NOREUSE) && b->chunk.state == B_QUAR)
      qm__q_bin_insert(i);
  }
}

void qm__q_dropped(uint32_t i) {
  if (!(B(i)->chunk.flags & F_NOREUSE) && aged(B(i))) /* q_age may have passed it */
    qm__q_bin_insert(i);
}

/* Puts a chunk, its range retired and now QUAR, into the quarantine
 * (under S.lock); returns the mappings the records hold now. Its window
 * counts from now: the frees counted (chunk.seq, stamped by the secondary
 * under the same hold) and their bytes. */
size_t qm__q_enter(uint32_t i) {
  block_t *b = B(i);
  qm__rec_clock(&b->q.mark);
  size_t maps = qm__set_vmas(b, LF.strategy == QM_STRATEGY_NONE);
  q_append(i);
  return maps;
}

#ifdef QM_TEST_HOOKS
void qm__q_fifo(uint32_t *cap, uint32_t *head, uint32_t *n) {
  qm_lock(&S.lock);
  *cap = Q.cap;
  *head = Q.fifo.head;
  *n = Q.fifo.n;
  qm_unlock(&S.lock);
}
#endif
