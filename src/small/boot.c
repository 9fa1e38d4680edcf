/* boot.c: the start-up arena, which serves the requests made while init
 * reads the options (a qmalloc_default_options() that allocates): bump
 * allocation in its own guarded mapping, a chunk never reused, every free
 * checked against a table of chunk starts. alloc.c serves from it while
 * init.c reads the options (qm__booting); it calls only os.c and the reports.
 */
#include "boot.h"

#include <errno.h>
#include <stdint.h>

#include "os.h"
#include "report.h"

/* The bootstrap arena: its own mapping between guard pages (so no overflow
 * reaches the allocator's globals, nor they it), bump-allocated in 16-byte
 * granules, never reused: a chunk stays valid for as long as the program
 * keeps the pointer. What is a chunk and whether it was freed is kept out
 * of band, per granule (0: no chunk starts here; else the requested size
 * plus one, with BOOT_FREED once freed), so that a free of anything but a
 * live chunk's start is reported, never silently ignored. The base is
 * sealed with the rest of init's state (sealed.c); the table stays writable:
 * the most a write to it does is make one free of a start-up chunk pass. */
#define BOOT_BYTES ((size_t)64 << 10)
#define BOOT_FREED ((uint32_t)1 << 31)
static uint32_t boot_chunk[BOOT_BYTES / 16];
static size_t boot_used;

void *qm__boot_alloc(size_t n) {
  if (!qm__boot_base) {
    void *p;
    if (qm_os_map_guarded(BOOT_BYTES, QM_PROT_RW, &p)) {
      errno = ENOMEM;
      return NULL;
    }
    qm__boot_base = (uintptr_t)p;
  }
  size_t need = qm_align_up(n ? n : 1, 16);
  if (n > BOOT_BYTES || need > BOOT_BYTES - boot_used) {
    errno = ENOMEM;
    return NULL;
  }
  size_t at = boot_used;
  boot_used += need;
  boot_chunk[at / 16] = (uint32_t)n + 1;
  return (void *)(qm__boot_base + at);
}

bool qm__boot_on_guard(uintptr_t a) {
  return qm__boot_base &&
         (a - (qm__boot_base - qm__page) < qm__page || a - (qm__boot_base + BOOT_BYTES) < qm__page);
}

bool qm__boot_describe_guard(uintptr_t a, qm_place_t *pl) {
  if (!qm__boot_on_guard(a))
    return false;
  pl->access = QM_ACC_GUARD;
  qm_buf_str(&pl->words, "guard page of qmalloc's start-up arena");
  return true;
}

bool qm__boot_owns(const void *p) {
  return (uintptr_t)p - qm__boot_base < BOOT_BYTES && qm__boot_base;
}

/* The live chunk at p, as its entry; reports anything else as `op`, as
 * the arena describes it (an address in it is the arena's alone). */
static uint32_t boot_entry(const void *p, qm_op_t op) {
  size_t off = (uintptr_t)p - qm__boot_base;
  uint32_t e = off % 16 ? 0 : __atomic_load_n(&boot_chunk[off / 16], __ATOMIC_ACQUIRE);
  if (!e || (e & BOOT_FREED)) {
    qm_place_t pl;
    qm__report_pointer(op, p, qm__boot_describe((uintptr_t)p, qm_place_empty(&pl)) ? &pl : NULL,
                       NULL);
  }
  return e;
}

bool qm__boot_describe(uintptr_t a, qm_place_t *pl) {
  qm_buf_t *d = &pl->words;
  if (!qm__boot_owns((const void *)a))
    return false;
  size_t off = a - qm__boot_base, g = off / 16;
  while (g && !__atomic_load_n(&boot_chunk[g], __ATOMIC_ACQUIRE))
    g--;
  uint32_t e = __atomic_load_n(&boot_chunk[g], __ATOMIC_ACQUIRE);
  size_t n = e ? (e & ~BOOT_FREED) - 1 : 0;
  if (!e || off >= g * 16 + qm_align_up(n ? n : 1, 16)) {
    pl->access = QM_ACC_WILD;
    pl->plain = true;
    qm_buf_str(d, "unused part of qmalloc's start-up arena");
    return true;
  }
  pl->access = e & BOOT_FREED ? QM_ACC_UAF : QM_ACC_LIVE;
  pl->chunk = pl->plain = true;
  pl->kind = QM_CK_BOOT;
  pl->user = qm__boot_base + g * 16;
  pl->size = n;
  qm_buf_str(d, "offset ");
  qm_buf_dec(d, off - g * 16);
  qm_buf_str(d, e & BOOT_FREED ? " in freed start-up chunk of " : " in start-up chunk of ");
  qm_buf_dec(d, n);
  qm_buf_str(d, " bytes at ");
  qm_buf_hex(d, qm__boot_base + g * 16);
  return true;
}

size_t qm__boot_size(const void *p, qm_op_t op) { return (boot_entry(p, op) & ~BOOT_FREED) - 1; }

void qm__boot_free(void *p) {
  size_t off = (uintptr_t)p - qm__boot_base;
  uint32_t e = boot_entry(p, QM_OP_FREE);
  /* two threads freeing one chunk at once: one of them sees it freed */
  if (!__atomic_compare_exchange_n(&boot_chunk[off / 16], &e, e | BOOT_FREED, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    (void)boot_entry(p, QM_OP_FREE);
}
