/* belt.h: the address space of large chunks (belt.c): one PROT_NONE
 * reservation that chunks are carved from in address order, like goods on a
 * conveyor belt, and that a freed chunk's range goes back to only once the
 * belt has moved on by the window. It knows ranges, never chunks: the
 * secondary tells it when a range it carved is dead (no page of a chunk will
 * be in it again) and when the chunk in it was freed.
 */
#ifndef QM_BELT_H
#define QM_BELT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strategy.h"

/* Takes the belt's span of the layout, as window_gb asks (at the
 * secondary's set-up, under its init lock), and with mirror the pool's
 * mirror of it: address space only, claimed as the head enters it, so
 * RLIMIT_AS does not shrink it. Nothing if window_gb is 0, or where the
 * layout has not even room for a small one. */
void qm__belt_init(bool mirror);
/* Faults the segment table in at once (the secondary's prefill, once the
 * program churns large chunks): else the head faults a page of it in every
 * 2 GiB it carves. */
void qm__belt_prefill(void);
/* Whether new chunks come from the belt now (window_gb may change). */
bool qm__belt_on(void);
/* Carves a range: a guard page (and a random few more), usable_len bytes
 * from an address aligned to align, a guard page. The range is PROT_NONE,
 * no page in it, and its only segments never held a chunk or last held one
 * freed at least a window ago (in bytes carved since and in `frees`, the
 * large frees counted so far). *evict_lo/hi: the addresses of segments it
 * entered, whose dead records must be forgotten now. Any alignment up to
 * a quarter of the belt. Where a lap finds no room, the belt grows, up to
 * its span; where a limit refuses the address space, dead segments are
 * given back first. False when no room fits even so: the chunk cannot keep
 * the window (the caller counts it, or fails under hardening=max). */
bool qm__belt_carve(size_t usable_len, size_t align, uint64_t frees, qm_range_t *out,
                    uintptr_t *evict_lo, uintptr_t *evict_hi);
/* The bytes carved so far: the clock a range's window is read on. */
uint64_t qm__belt_odometer(void);
/* A carved range is dead: its chunk was freed when the odometer read
 * free_odo after free_seq large frees, and its pages are gone (moved or
 * dropped). clean: it was mapped afresh already (qm__belt_clean). Returns
 * whether qm__belt_tidy() has work to do. */
bool qm__belt_release(uintptr_t base, size_t span, uint64_t free_odo, uint64_t free_seq,
                      bool clean);
/* Maps a dead range afresh PROT_NONE, its pages and page tables gone; 0 or
 * ENOMEM (at the mapping cap: the range stays as it was). */
int qm__belt_clean(uintptr_t base, size_t span);
/* Where the pages of the chunk at a in the belt wait while it is pooled
 * (belt_way=move): the same offset in the mirror. */
uintptr_t qm__belt_shadow(uintptr_t a);
/* The same as qm__belt_clean, for a range's place in the mirror: its
 * pooled pages go. (qm__belt_tidy maps both afresh.) */
int qm__belt_clean_shadow(uintptr_t base, size_t span);
/* Maps the dead ranges and segments waiting for it afresh, so that the
 * belt holds a bounded number of mappings however many chunks died in it.
 * Syscalls: call without the secondary's lock. */
void qm__belt_tidy(void);
/* Whether a is in the belt; *ever: in a segment that held chunks. Lock-free,
 * for reports. */
bool qm__belt_holds(uintptr_t a, bool *ever);
/* The belt in use, the window in force, and the mappings the belt's dead
 * ranges may hold now (an upper bound). */
void qm__belt_stats(uint64_t *reserved, uint64_t *window, uint64_t *maps);

void qm__belt_fork_prepare(void);
void qm__belt_fork_parent(void);
void qm__belt_fork_child(void);

#endif
