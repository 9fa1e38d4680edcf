/* meta.c: a bump allocator over 1 MiB mappings for internal metadata. Memory
 * is zero when handed out (fresh mappings) and never freed back to it:
 * owners recycle their objects through their own free lists. Each mapping
 * sits between PROT_NONE guard pages, so no user chunk is adjacent to the
 * chunk addresses kept here.
 */
#include "meta.h"

#include <stdint.h>

#include "os.h"
#include "qm.h"

#define META_CHUNK ((size_t)1 << 20)

qm_lock_t qm__meta_lock = QM_LOCK_INIT;
static uintptr_t cur, end;
static uintptr_t made[64][2]; /* the first 64 mappings, for the tests */
static size_t nmade;

void *qm__meta_alloc(size_t size) {
  size = qm_align_up(size, 64);
  qm_lock(&qm__meta_lock);
  if (cur + size > end) {
    size_t len = size > META_CHUNK ? qm_page_up(size) : META_CHUNK;
    void *p;
    if (qm_os_map_guarded(len, QM_PROT_RW, &p)) {
      qm_unlock(&qm__meta_lock);
      return NULL;
    }
    cur = (uintptr_t)p;
    end = cur + len;
    if (nmade < 64) {
      made[nmade][0] = cur;
      made[nmade++][1] = end;
    }
  }
  void *r = (void *)cur;
  cur += size;
  qm_unlock(&qm__meta_lock);
  return r;
}

#ifdef QM_TEST_HOOKS
size_t qm__meta_ranges(uintptr_t (*out)[2], size_t cap) {
  qm_lock(&qm__meta_lock);
  size_t n = nmade < cap ? nmade : cap;
  for (size_t i = 0; i < n; i++) {
    out[i][0] = made[i][0];
    out[i][1] = made[i][1];
  }
  qm_unlock(&qm__meta_lock);
  return n;
}
#endif
