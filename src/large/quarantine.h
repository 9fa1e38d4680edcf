/* quarantine.h: the large chunks' quarantine (quarantine*.c), asked by the
 * secondary alone, under S.lock unless said: the FIFO of freed chunks, the
 * bins of aged ones, the reuse choice and the gathering of pooled pages,
 * the limits and the chunks chosen to go when one is passed.
 */
#ifndef QM_QUARANTINE_H
#define QM_QUARANTINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "large.h"

/* Empties the FIFO and the bins (the secondary's set-up). */
void qm__q_init(void);
/* Resident pages a live chunk holds past its RW part (tail_pages) count
 * against the resident budget: added when it is handed out or resized,
 * taken off when it is freed or resized. */
void qm__q_tail_add(size_t pages);
void qm__q_tail_sub(size_t pages);
/* The bytes live large chunks were asked for, as they change (under
 * S.lock): the resident budget follows them (quarantine_live_pct). */
void qm__q_live(size_t bytes);
/* A chunk left the window early (window_breaks): a freed one unmapped
 * before its window passed, or one the belt should carry mapped on its own. */
void qm__q_window_broken(void);
/* Its counts: chunks, bytes, resident bytes, window breaks. */
struct qm_stats;
void qm__q_stats(struct qm_stats *s);
void qm__q_age(void);
void qm__q_unlink(uint32_t i);
/* The aged chunk that serves `need` pages, or NIL; *whole: its resident
 * pages cover the request (its reuse takes no fault). */
uint32_t qm__q_fit(size_t need, size_t align, bool *whole);

/* One piece of a gathered chunk: the last n of the resident pages pooled
 * chunk i held when it was chosen, from page `off` of its usable range (or
 * its place in the mirror). */
typedef struct piece {
  uint32_t i;
  size_t off, n;
  unsigned vmas; /* the mappings it is */
} piece_t;
#define MAX_PIECES 6      /* a gathered chunk's pieces: mremap calls */
#define MAX_GATHER_VMAS 8 /* the mappings a gathered chunk's pages may be */
/* Chooses pooled belt chunks whose resident pages fill `need` pages, at
 * most `max` pieces, under S.lock: each chosen chunk is out of the bins
 * (the caller marks it BUSY), its resident count lowered by what it gives,
 * its place in the FIFO kept. Returns the
 * pieces, in the order they go in, and in *got the pages they hold: fewer
 * than need if the pool held fewer, more (at most cap) where a chunk with
 * a few pages to spare was taken whole; in *all, whether they are all the
 * quarantine can give and it held fewer than need pages in all: the
 * request may then take them and open the rest afresh. */
unsigned qm__q_gather(size_t need, size_t cap, bool huge, piece_t *p, unsigned max, size_t *got,
                      bool *all);
/* After the pieces moved (under S.lock): a chunk that gave all its pages
 * leaves the quarantine (the caller buries it); one that has pages left
 * goes back to the bins (the caller marks it QUAR again). Returns whether
 * the chunk left. */
bool qm__q_settle(uint32_t i);
/* The pieces given back unmoved (under S.lock; the caller marks their
 * chunks QUAR again). */
void qm__q_ungather(const piece_t *p, unsigned n);
/* Puts a chunk that left the user, its range retired, marked QUAR and
 * stamped (its rw and dirty pages as they are now, chunk.seq the frees
 * counted now), at the FIFO's tail; returns the mappings the records hold
 * now, for qm__q_over_maps. */
size_t qm__q_enter(uint32_t i);
/* Whether the quarantine is past one of its limits with the records
 * holding `maps` mappings (the caller enforces them). */
bool qm__q_over_maps(size_t maps);
/* Whether the quarantine is past one of its limits: chunk cap, mapping
 * budget, resident budget (its chunks' pages and live chunks' tails). */
bool qm__q_over(void);

/* Chunks the quarantine lets go, chosen under S.lock for the secondary to
 * work on without it: unmap[] leave it (unmapped, and forgotten by the
 * hash already; belt chunks are buried instead), drop[] lose their pages
 * (a belt chunk, buried, left the FIFO; another stays in it, out of the
 * bins, until qm__q_dropped). The quarantine changes no chunk's state:
 * the caller marks each chosen chunk BUSY before it lets go of S.lock. */
#define VICTIMS 32
typedef struct victims {
  uint32_t unmap[VICTIMS], drop[VICTIMS];
  unsigned nunmap, ndrop;
} victims_t;
/* What must go so that the quarantine keeps its limits, with extra_maps
 * mappings about to be added; true when v is full (choose again once it
 * is worked on). */
bool qm__q_choose(victims_t *v, size_t extra_maps);
/* Quarantined chunks to unmap: the aged ones, or with unaged_too any (the
 * window given up, counted), at most VICTIMS. */
void qm__q_choose_all(victims_t *v, bool unaged_too);
/* Quarantined chunks with pages resident, to drop their pages
 * (malloc_trim), at most VICTIMS; returns the bytes they hold. */
size_t qm__q_choose_resident(victims_t *v);
/* A drop victim that stayed in the FIFO, its pages gone and marked QUAR
 * again: binned again (cold) if aged. */
void qm__q_dropped(uint32_t i);
/* Address space the quarantine holds (mappings, guards included). */
size_t qm__q_mapped_bytes(void);
/* Warns, once per process, if a window chunk was ever given up. Without
 * S.lock. */
void qm__q_breach_warn(void);

#ifdef QM_TEST_HOOKS
/* Test hook: the FIFO's shape (positions in use, its oldest entry's, its
 * entries, empty ones included), under S.lock. */
void qm__q_fifo(uint32_t *cap, uint32_t *head, uint32_t *n);
#endif

#endif
