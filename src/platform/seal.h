/* seal.h: the sealing of the allocator's global state that is fixed once
 * init is done (options, class table and keys, region bases, the secret, the
 * page size): defined together in the section qm_ro (sealed.c, the front's,
 * which knows every owner's types; the pages fixed later here), made
 * read-only when init ends, so a write primitive in the program cannot
 * redirect the allocator. Each owner declares its sealed globals in its own
 * header.
 */
#ifndef QM_SEAL_H
#define QM_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Makes the pages read-only (end of init). */
void qm__ro_seal(void);

/* State fixed after init, once a part that starts lazily is set up (the
 * secondary at the first large chunk, the guarded slots at the first
 * sample): each on a page of its own, mapped by init between guard pages
 * and reached through a pointer in the sealed section, made read-only by
 * its owner as soon as it is set, never writable again. A write primitive
 * in the program cannot turn the quarantine off, point the record table at
 * a forged copy, or move the guarded slots. Before init the pointers reach
 * zeroed read-only copies (nothing is set up: no strategy, no slots). */
struct block;
struct belt_seg;
typedef struct qm_large_fixed {
  int strategy;      /* how quarantined ranges are retired */
  bool fast;         /* the kernel keeps protect-strategy reuse fault-free */
  unsigned frames;   /* option stack_frames */
  struct block *blk; /* the record table, blk_max records reserved */
  size_t blk_max;    /* 0 until the table is reserved */
  /* the large quarantine's FIFO (quarantine.c): blk_max entries, reserved
   * with the table */
  uint32_t *qring;
  size_t map_budget; /* mappings the large quarantine may add */
  size_t thp_size;   /* PMD size where THP can be had, else 0 */
  /* the belt (belt.c): its span, 0 without one (the whole it may grow to;
   * the part in use is the belt's own state); its segments; the pool's
   * mirror of it (belt_way=move), 0 without one */
  uintptr_t belt_base, belt_mirror;
  size_t belt_len, belt_nseg;
  struct belt_seg *belt_seg;
  int belt_way; /* qm_belt_way_t in force */
} qm_large_fixed_t;
struct gslot;
#define QM_GUARDED_CLASSES 8 /* slot classes of 1 .. 128 pages */
typedef struct qm_gclass_fixed {
  uintptr_t base;       /* the region: leading guard page, then slots */
  size_t pages, stride; /* data pages per slot; bytes per slot, guard included */
  uint32_t nslots;      /* slots */
  struct gslot *slot;   /* nslots records */
  uint32_t *ring;       /* quarantine FIFO, nslots entries */
} qm_gclass_fixed_t;
typedef struct qm_guarded_fixed {
  uintptr_t base;           /* the slots' reservation, 0 until set up */
  size_t span;              /* its length */
  int strategy;             /* how freed slots retire */
  bool markers;             /* MADV_GUARD_INSTALL works */
  size_t map_budget;        /* mappings the slots may add */
  unsigned ncls, reg_shift; /* slot classes, and log2 of each one's region */
  qm_gclass_fixed_t cls[QM_GUARDED_CLASSES];
} qm_guarded_fixed_t;
extern __attribute__((visibility("hidden"))) qm_large_fixed_t *qm__lfix;
extern __attribute__((visibility("hidden"))) qm_guarded_fixed_t *qm__gfix;
/* Maps the two pages (in init, before qm__ro_seal). */
void qm__late_init(void);
/* Makes the page holding fixed read-only: its owner has set it. */
void qm__late_seal(const void *fixed);
#ifdef QM_TEST_HOOKS
/* Test hooks: writable again (the tests' option hooks, which re-parse
 * options after init); [lo, hi) of the pages, for the tests' maps check. */
void qm__ro_unseal(void);
void qm__ro_range(void **lo, void **hi);
#endif
/* The section's start and end alignment: the largest page size of the
 * kernels qmalloc runs on (arm64's 64 KiB; x86-64's and most arm64 kernels'
 * 4 KiB, 16 KiB on some), so that sealing covers whole pages of the
 * section's own whatever the page size the process finds at run time. */
#define QM_RO_ALIGN 65536
/* What puts a definition in the section (sealed.c and seal.c only: the
 * link keeps their order, with sealed_end.c's padding last). */
#define QM_SEALED __attribute__((section("qm_ro")))
/* The padding that ends the section (sealed_end.c). */
extern __attribute__((visibility("hidden"))) char qm__ro_end[QM_RO_ALIGN];

#endif
