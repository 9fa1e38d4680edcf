/* shim.h: the thin C shims through which the C++ tests reach qmalloc's
 * internals (options, classes, the OS-layer counters) without including its
 * C headers. Everything public is reached through qmalloc.h directly.
 */
#ifndef QM_TEST_SHIM_H
#define QM_TEST_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Options: reset to defaults, apply a string, read one value by name. */
void qmt_options_reset(void);
int qmt_options_apply(const char *s);
uint64_t qmt_option(const char *name);
/* Re-reads defaults, qmalloc_default_options() and QMALLOC_OPTIONS. */
void qmt_options_init(void);

/* Small-chunk classes. */
unsigned qmt_nclasses(void);
unsigned qmt_class_of(size_t n);
/* The widest vectors checked mode zeroes and checks freed chunks with (2:
 * AVX-512F, 1: AVX2, 0: 16-byte SSE2 ones), as init found the CPU; set
 * lower, the narrower paths run too on a machine that has the wider. */
unsigned qmt_vec(void);
void qmt_vec_set(unsigned v);
/* The largest request class c serves, and its chunk size (8 more: the
 * canary's bytes). */
size_t qmt_class_user_size(unsigned c);
size_t qmt_class_chunk_size(unsigned c);
uintptr_t qmt_region(unsigned c);
/* The table entry of the small chunk holding p: its state (0 none, 1
 * allocated, 2 free), requested size, owner id and generation. */
typedef struct qmt_entry {
  unsigned state, owner, gen;
  size_t size, offset;
} qmt_entry_t;
qmt_entry_t qmt_entry(const void *p);
/* The 64-byte line of the table that holds that entry (address / 64); 0
 * for a pointer outside the class regions. */
uintptr_t qmt_entry_line(const void *p);
/* free(q) as a signal handler runs it when it interrupts this thread
 * inside free(mark) (mark 1: inside malloc, which changes the cache). */
void qmt_free_interrupting(uintptr_t mark, void *q);
/* malloc(n) as a signal handler runs it when it interrupts this thread
 * inside free(mark); the chunk in *out, and the mark malloc left behind. */
uintptr_t qmt_malloc_interrupting(uintptr_t mark, size_t n, void **out);
/* The mark realloc sets while it resizes p in place (p | QM_REALLOCING). */
uintptr_t qmt_realloc_mark(const void *p);
/* The owner's store of free(p)'s fast path alone (entry made FREE, with
 * nothing else): what the owner writes when another thread's free of p
 * lands between its load and its store. */
void qmt_owner_store_freed(void *p);
/* Chunks in the calling thread's bin of class c (not in checked mode). */
unsigned qmt_bin_count(unsigned c);
/* 1 in checked mode (hardening=max or zero_on_free): bins always empty. */
int qmt_cache_checked(void);
/* The calling thread's owner id (0 while it has no cache). */
unsigned qmt_owner_id(void);
/* Takes (take != 0) or lets go owner id's lock, as a thread applying frees
 * to that id while it is closed holds it. */
void qmt_owner_lock(unsigned id, int take);
/* Guard pages made inside class regions, refused, and whether markers. */
void qmt_guards(size_t *made, size_t *missed, int *markers);
/* The first byte of class c's region that is not committed (PROT_NONE). */
uintptr_t qmt_committed_end(unsigned c);
/* 1 if p lies in the small-chunk heap. */
int qmt_is_small(const void *p);
/* 1 if p is in a guarded slot (sampled: any small malloc may be, about 1 in
 * sample_rate, at random). */
int qmt_is_guarded(const void *p);
/* The calling thread's group of the central lists, their number, the
 * chunks of size n's class in group g's stack, and how many of those
 * another group may take before it carves (QM_STEAL_MIN in chunks). */
unsigned qmt_thread_group(void);
unsigned qmt_groups(void);
size_t qmt_group_free(size_t n, unsigned g);
size_t qmt_steal_min_chunks(size_t n);
/* Empties the calling thread's cache into the central lists. */
void qmt_flush_thread_cache(void);
/* Gives small chunk p to its class's central list as the calling thread's
 * cache would (for the checks a give makes). */
void qmt_central_give(void *p);
/* Bytes carved from all class regions so far. */
size_t qmt_small_carved(void);

/* Caps the zero-size region at slots (SIZE_MAX: none; never below those
 * handed out so far); returns those handed out so far. */
size_t qmt_zero_cap(size_t slots);

/* The aging queue (age.h) over a ring of cap (1..8) stamped entries, as
 * its users drive it: reset empty; push (a full queue's oldest leaves
 * first, and is returned; 0 if none left); pop the oldest if it is older
 * than d by clock now (returned; 0 if none is due). */
void qmt_age_reset(uint32_t cap);
uintptr_t qmt_age_push(uintptr_t item, uint32_t at);
uintptr_t qmt_age_pop_due(uint32_t now, uint32_t d);
void qmt_age32_reset(uint32_t cap, uint32_t max);
void qmt_age32_push(uint32_t item);
void qmt_age32_leave(uint32_t item);
uint32_t qmt_age32_entries(uint32_t *out, bool *pos_ok);
uint32_t qmt_age32_cap(void);
uint32_t qmt_age32_mark(void);
void qmt_age32_set_mark(uint32_t m);

/* Checked mode: chunks that left a delayed-free ring early (it was full). */
size_t qmt_delay_early(void);
/* ... and those that left early because the rings (or the limbo) held
 * free_delay_kb; the bytes the calling thread's rings hold, and the
 * limbo's. */
size_t qmt_delay_over(void);
size_t qmt_delay_bytes(void);
/* Whether the calling thread's per-class delay bytes (the scan's) agree
 * with its rings' counts, and add up to qmt_delay_bytes. */
bool qmt_delay_counts_agree(void);
size_t qmt_limbo_bytes(void);
/* Bytes the bins of exited threads' registrations hold, for the next thread. */
size_t qmt_spare_bytes(void);
/* Runs hook in the making of the next threads' caches (NULL: none), where
 * a signal handler's call may land. */
void qmt_set_making_hook(void (*hook)(void));
/* Frees waiting in owner id's inbox for its thread to take them back. */
size_t qmt_inbox_waiting(unsigned id);
/* Runs hook as qm_stats and malloc_trim leave their busy mark, after they
 * applied the frees deferred under it and before the mark is cleared
 * (NULL: none), where a signal handler's free may land. */
void qmt_set_leaving_hook(void (*hook)(void));
/* Runs hook in fork's prepare handler once it holds every lock (NULL:
 * none), where a signal handler's free may land. */
void qmt_set_fork_hook(void (*hook)(void));
/* From qmt_lock_watch(true) on, the calling thread counts the locks qmalloc
 * takes for it while it is not marked busy (its exit included), where a signal handler's free
 * landing could wait for good on the lock held; qmt_lock_unmarked gives the
 * count and where the first was taken. */
void qmt_lock_watch(bool on);
/* Frees p as a signal handler landing in malloc's or free's fast path
 * does: deferred under the fast path's mark, which that path then leaves
 * without applying it. */
void qmt_free_in_fast_path(void *p);
/* The calling thread's busy mark (0: none; 1: busy; else the pointer a
 * free or realloc of which a signal handler's free would report). */
uintptr_t qmt_freeing_mark(void);
/* Frees p (a zero-size, sampled or large chunk) marked with p, as a free
 * or the drain of deferred frees does, and returns the mark its side left:
 * busy, once the chunk is the heap's (another thread may have its address
 * before the free returns). */
uintptr_t qmt_free_marked(void *p);
unsigned qmt_lock_unmarked(const char **file, int *line);

/* Forgets the log file (option log_path) and any failure to open it. */
void qmt_log_forget(void);

/* The calling thread's sampling countdown: allocations until the next one
 * is sampled into a guarded slot. */
uint32_t qmt_sample_left(void);

/* Unmaps every quarantined large chunk. */
void qmt_quarantine_flush(void);

/* Minor faults of the calling thread so far (getrusage RUSAGE_THREAD). */
long qmt_minflt(void);
/* Moves as on 5.10 and 5.15, whatever the kernel: a range of several VMAs
 * is refused (EFAULT, the destination unmapped), and counted. */
void qmt_one_vma_moves(int on);
size_t qmt_refused_moves(void);
/* qm_os_move_spans_vmas(): one mremap() moves a range of several VMAs (not
 * on 5.10 and 5.15, nor under qmt_one_vma_moves). */
int qmt_move_spans_vmas(void);
/* MADV_POPULATE_WRITE taken to be absent, as before Linux 5.14. */
void qmt_no_populate(int on);
/* The large chunk whose mapping holds p: its RW part [*lo, *hi) and the
 * mappings the secondary counts it may be (extra_vmas + 1 if F_SPLIT,
 * else 1). 0 if none. */
int qmt_large_rw(const void *p, uintptr_t *lo, uintptr_t *hi, unsigned *bound);
/* Mappings of /proc/self/maps that are readable and meet [lo, hi). */
unsigned qmt_rw_mappings_in(uintptr_t lo, uintptr_t hi);
/* Any protection. */
unsigned qmt_mappings_in(uintptr_t lo, uintptr_t hi);
/* The whole range [base, end) of the large chunk at p, guards included;
 * 0 if none. */
int qmt_large_range(const void *p, uintptr_t *base, uintptr_t *end);
/* Resident bytes of [p, p+len) now (mincore) in *resident: 0, or the
 * errno of the mincore that failed (*resident 0 then). The tests call
 * qmt_resident (util.h), which fails the test on an error. */
int qmt_mincore(const void *p, size_t len, size_t *resident);
/* The same over the parts of [p, p+len) that are mapped (an unmapped page
 * holds none); readable_only: only those readable, the bytes of the others
 * in *unseen (qemu-user's mincore refuses PROT_NONE pages). */
int qmt_mincore_mapped(const void *p, size_t len, int readable_only, size_t *resident,
                       size_t *unseen);
/* Lines of /proc/self/maps. */
long qmt_mappings(void);
/* Lines of /proc/self/maps in the belt's reservation and in its mirror
 * (0 without them). */
void qmt_mappings_in_belt(long *belt, long *mirror);
/* Bytes the belt has carved so far, guards and alignment included: the
 * clock its window is read on (0 without a belt). */
uint64_t qmt_belt_odometer(void);
/* Protection of the mapping holding p as /proc/self/maps prints it
 * ("rw-p", "---p"); "" when unmapped. */
void qmt_prot_of(const void *p, char out[5]);
/* Pages of [lo, hi) in PROT_NONE mappings, from one read of /proc/self/maps
 * (a read per page was hours of a 5.10 guest under hardening=max, whose
 * maps has a line per guard page). */
size_t qmt_inaccessible_pages(uintptr_t lo, uintptr_t hi);
size_t qmt_page(void);
/* Ranges qmalloc gave mmap, munmap, mprotect, madvise or mremap that were
 * not whole pages of qmt_page() (qm__os_off_page). */
size_t qmt_off_page_ranges(void);
/* The page size qmalloc read at start (qm__page). */
size_t qmt_lib_page(void);
/* The one check of emulation: the emulator's name ("qemu-user") where the
 * tests run under one, else NULL. From QMT_EMULATED, which tests/meson.build
 * sets for every test of a cross build whose programs run through an
 * exe_wrapper: inside the emulated process nothing tells qemu-user apart
 * reliably (uname, auxv and /proc/self/exe are the guest's). */
static inline const char *qmt_emulated(void) {
  const char *e = getenv("QMT_EMULATED");
  return e && *e ? e : NULL;
}
/* qm_os_read_file: what qmalloc reads proc and sys files with. */
long qmt_read_file(const char *path, char *buf, size_t cap);
/* The metadata mappings qmalloc holds now (meta chunks, record table, hash
 * table), as [lo, hi) pairs into out (up to cap pairs); returns the count. */
size_t qmt_metadata(uintptr_t (*out)[2], size_t cap);
/* The large chunks' record table: its mapping [*lo, *hi) between guard
 * pages, and its records (0: not reserved yet). */
size_t qmt_large_table(uintptr_t *lo, uintptr_t *hi);
/* Its records made so far (an index below holds one) and committed (RW). */
void qmt_large_records(size_t *made, size_t *committed);
/* The record of the large chunk whose user pointer is p, whatever its state
 * (the hash keeps a freed chunk's until its dead record is forgotten): its
 * index, whether it is quarantined or dead, its FIFO position (q.pos) and
 * its place in the ring of dead records (rec.dpos). 0 if there is none. */
typedef struct qmt_large_rec {
  uint32_t idx, qpos, dpos;
  bool quarantined, dead;
} qmt_large_rec_t;
int qmt_large_record(const void *p, qmt_large_rec_t *r);
/* The quarantine's FIFO: its ring's positions in use, the position of its
 * oldest entry, its entries (empty ones included). */
void qmt_q_fifo(uint32_t *cap, uint32_t *head, uint32_t *n);
/* A position of the FIFO's ring outside the queue's entries that holds
 * record idx: a stale copy a compaction left; -1 if there is none. */
long qmt_q_stale_copy(uint32_t idx);
/* Stray writes into the allocator's own metadata, for the checks that must
 * catch them before anything is written through them: the FIFO position
 * and the place in the ring of dead records of the chunk at p, and the
 * FIFO's entry at position pos. */
void qmt_large_set_qpos(const void *p, uint32_t pos);
void qmt_large_set_dpos(const void *p, uint32_t place);
void qmt_q_set_entry(uint32_t pos, uint32_t idx);
/* ... and its link in the address index (a record's index + 1; 0 ends). */
void qmt_large_set_anext(const void *p, uint32_t link);
/* Places in the ring of dead records (DEAD_MAX). */
uint32_t qmt_dead_max(void);
/* The pages sealed read-only after init: [lo, hi). */
void qmt_ro_range(uintptr_t *lo, uintptr_t *hi);
/* Where the small chunks' steering state is, and where the pointer to it
 * is: which = 0 the owners' inboxes and spare batches, 1 the central
 * lists, 2 the committed counts. */
uintptr_t qmt_steering_state(unsigned which, uintptr_t *pointer_at);
/* Writes to the sealed options / a class key: must fault. */
void qmt_poke_options(void);
void qmt_poke_class_key(void);
/* The state fixed once the secondary and the guarded slots are set up:
 * where the pointers to it live (vars) and where it lives (pages), large
 * then guarded; and writes to it, which must fault. */
void qmt_fixed_state(uintptr_t vars[2], uintptr_t pages[2]);
void qmt_poke_large_strategy(void);
void qmt_poke_large_table(void);
void qmt_poke_guarded_base(void);
/* The primary's reservation: [lo, hi). */
void qmt_primary_span(uintptr_t *lo, uintptr_t *hi);

#ifdef __cplusplus
}
#endif

#endif
