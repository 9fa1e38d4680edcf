/* os.h: the contract of the OS layer, the only code that maps, unmaps,
 * protects or advises memory. Ranges are page-aligned; every function
 * returns 0 or an errno. ENOMEM (out of memory, address space or mappings)
 * always goes back to the caller, who must degrade (EAGAIN, memory that
 * RLIMIT_MEMLOCK does not let be locked under mlockall, counts as ENOMEM); EINVAL goes back only
 * from the calls that probe optional kernel features (guard regions,
 * MREMAP_DONTUNMAP), and EFAULT only from qm_os_move; any other errno is a
 * fatal report. A zero-length call,
 * or a protection change to the state the range is already in, is not made.
 */
#ifndef QM_OS_H
#define QM_OS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { QM_PROT_NONE = 0, QM_PROT_RW = 1 } qm_prot_t;

/* Syscalls made, by kind, and calls that were skipped as no-ops; remapped:
 * ranges whose pages were dropped by mapping them afresh (locked pages). */
typedef struct qm_os_counters {
  atomic_ulong mmap, munmap, mprotect, madvise, mremap, skipped, remapped;
} qm_os_counters_t;
extern __attribute__((visibility("hidden"))) qm_os_counters_t qm__os_counts;

/* Fresh anonymous private mapping of len bytes, aligned to align (a power of
 * two; 0 means the page size). No MAP_NORESERVE: a PROT_NONE mapping is not
 * charged to the commit limit anyway, and without the flag a later
 * mprotect(RW) is, so strict overcommit yields ENOMEM, not the OOM killer. */
int qm_os_map(size_t len, size_t align, qm_prot_t prot, void **out);
int qm_os_unmap(void *p, size_t len);
/* A PROT_NONE MAP_NORESERVE reservation of len bytes (address space only),
 * and the same mapped afresh over [p, p+len) of one: its pages are gone,
 * its page tables freed where whole, and it merges with the reservation
 * around it into one mapping. */
int qm_os_reserve(size_t len, void **out);
int qm_os_reserve_fixed(void *p, size_t len);
/* The layout: one stretch of address space at a random base well below
 * where the kernel puts mappings of its own choosing (os_layout.c), out of which
 * every reservation that may grow large (class regions and their tables,
 * the belt, large records, guarded slots, the zero-size region) takes a
 * span at set-up, an address range only: nothing is mapped until it is
 * claimed, in steps, as it is used. So the process holds address space in
 * proportion to its use, and a limit lowered after start (RLIMIT_AS) meets
 * the allocator's next step, an ENOMEM, never its start-up.
 * qm_os_span: len bytes (a page multiple) at an address aligned to align
 * (a power of two, at least the page size), at a random distance after the
 * last span; 0 when the layout is exhausted. Lock-free. */
/* Bytes of the layout qm_os_span takes spans from (it depends on the
 * address space: 1 to 32 TiB with 47 bits, 4 to 256 GiB with 39). */
size_t qm_os_layout_bytes(void);
uintptr_t qm_os_span(size_t len, size_t align);
/* In a fork child: the layout's gaps drawn afresh, so that two children's
 * next spans do not land at one address. */
void qm_os_fork_child(void);
/* Maps [p, p+len) with prot only where nothing is mapped (MAP_FIXED_NOREPLACE,
 * Linux 4.17): never over another mapping. 0, or ENOMEM where something is
 * there already (EEXIST) or a limit refuses. A PROT_NONE claim is address
 * space only (MAP_NORESERVE, as qm_os_reserve). */
int qm_os_claim(void *p, size_t len, qm_prot_t prot);
/* A span of the layout claimed PROT_NONE from its start as it grows, so
 * that it is committed (qm_os_protect) inside what is claimed. With guards,
 * a PROT_NONE page before base and one after base + len are claimed with
 * the first and the last step, so nothing lands next to it. Changed under
 * its owner's lock. */
typedef struct qm_os_grow {
  uintptr_t base; /* the first usable byte; 0: no span */
  size_t len;     /* usable bytes it may grow to */
  uintptr_t top;  /* claimed up to here (guard below included) */
  bool guards;
} qm_os_grow_t;
/* Takes the span of len bytes (page multiple) from the layout, aligned to
 * align; ENOMEM when the layout has no room. Nothing claimed yet. */
int qm_os_grow_span(qm_os_grow_t *g, size_t len, size_t align, bool guards);
/* [base, base + upto) claimed (upto <= len): by a step of at least a MiB
 * and at least doubling what is held, so that the steps are few, clipped to
 * what the span holds; 0 or ENOMEM (the span stays as it was). */
int qm_os_grow(qm_os_grow_t *g, size_t upto);
/* Bytes of the span claimed (its guard pages left out). */
size_t qm_os_grown(const qm_os_grow_t *g);

/* The same with protection prot: with QM_PROT_RW, a part of a reservation
 * opened as one mapping whatever lies under it. mprotect(RW) over a part
 * made of several mappings (pieces whose anon_vma differ, left by earlier
 * chunks, cannot merge) leaves it several, and Linux 5.10 and 5.15 refuse
 * one mremap() across several (EFAULT). The new mapping has no madvise
 * flags (VM_HUGEPAGE, VM_NOHUGEPAGE): the caller gives it its advice. */
int qm_os_map_fixed(void *p, size_t len, qm_prot_t prot);

/* The same between two PROT_NONE guard pages, for metadata: nothing mapped
 * next to it, user memory above all, can reach it by a linear overflow or
 * underflow, nor can the kernel merge it with a neighbour. *out is the
 * first usable byte; unmap with qm_os_unmap_guarded (same len). */
int qm_os_map_guarded(size_t len, qm_prot_t prot, void **out);
int qm_os_unmap_guarded(void *p, size_t len);
/* Changes the protection of [p, p+len) from `from` to `to`; no syscall when
 * they are equal or len is 0. */
int qm_os_protect(void *p, size_t len, qm_prot_t from, qm_prot_t to);
/* Pages dropped now; zero on refault. prot: the range's protection now. On
 * locked pages (mlock, mlockall), where madvise is refused, the range is
 * mapped afresh with prot instead (counted in remapped): it stays ours, and
 * may split off from its neighbours as a VMA of its own. */
int qm_os_dontneed(void *p, size_t len, qm_prot_t prot);
/* MADV_FREE: dropped under pressure; as qm_os_dontneed on locked pages. */
int qm_os_free_lazy(void *p, size_t len, qm_prot_t prot);
int qm_os_nohugepage(void *p, size_t len);
int qm_os_hugepage(void *p, size_t len);
/* MADV_POPULATE_WRITE (Linux 5.14): faults the pages of an RW range in, in
 * one call; where it is absent (EINVAL) by a write to each page that
 * changes nothing. An optimisation only: any other error is returned, never
 * reported; the pages then fault in at first touch. */
int qm_os_populate(void *p, size_t len);
#ifdef QM_TEST_HOOKS
/* Test hook: on, MADV_POPULATE_WRITE is taken to be absent, as before 5.14. */
void qm__os_no_populate(bool on);
#endif
/* MADV_GUARD_INSTALL / MADV_GUARD_REMOVE (Linux 6.13): EINVAL where absent. */
int qm_os_guard_install(void *p, size_t len);
int qm_os_guard_remove(void *p, size_t len);
/* Moves the pages of [old, old+len) to [to, to+len), which must be mapped and
 * is replaced. With dontunmap (MREMAP_DONTUNMAP, Linux 5.7) the old range
 * stays mapped, empty; EINVAL where the kernel lacks it; EFAULT where the
 * range is several VMAs and the kernel moves one only (5.10, 5.15: see
 * qm_os_move_spans_vmas), the destination then maybe unmapped. */
int qm_os_move(void *old, size_t len, void *to, bool dontunmap);
/* Whether one qm_os_move() may take a range made of several VMAs. Tested
 * once, on scratch pages; false until a test could be made. */
bool qm_os_move_spans_vmas(void);
#ifdef QM_TEST_HOOKS
/* Test hook: on, qm_os_move() refuses a range of several VMAs as 5.10 and
 * 5.15 do (the destination unmapped, EFAULT), and qm_os_move_spans_vmas()
 * says no; qm__os_refused_moves() counts the moves refused so. */
void qm__os_one_vma_moves(bool on);
size_t qm__os_refused_moves(void);
/* Test hook: ranges given to mmap, munmap, mprotect, madvise or mremap
 * that were not whole pages (qm__page) since the start. */
size_t qm__os_off_page(void);
#endif

/* Whether a mapping of span bytes, rw of them writable, could be granted
 * once `held` bytes of the process's mappings are unmapped: false where the
 * kernel refuses it whatever is freed (past a 47-bit address space, past
 * RLIMIT_AS, more writable memory than RAM and swap unless overcommit is
 * unconditional). A syscall or two: for paths that already failed. */
bool qm_os_could_map(size_t span, size_t rw, size_t held);

/* Pages of [p, p+len) resident now (mincore); -1 on error. */
long qm_os_resident_pages(void *p, size_t len);

/* Reads up to cap-1 bytes of a (proc) file into buf, NUL-terminated; returns
 * the length or -1. No allocation: safe during init. */
long qm_os_read_file(const char *path, char *buf, size_t cap);
/* Parses the first unsigned decimal number of a small proc file; -1 if none. */
long long qm_os_read_number(const char *path);
/* Lines of /proc/self/maps: the mappings the process holds now. -1 if
 * unreadable. */
long qm_os_count_mappings(void);

#endif
