/* shim.c: implements shim.h over qmalloc's internal headers and a few
 * syscalls the tests use to observe the allocator from outside (faults,
 * residency, mappings). Compiled as C, linked into every test binary.
 */
#include "shim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "age.h"
#include "alloc.h"
#include "belt.h"
#include "cache.h"
#include "guarded.h"
#include "init.h"
#include "large_record.h"
#include "life.h"
#include "meta.h"
#include "optparse.h"
#include "os.h"
#include "out.h"
#include "primary.h"
#include "qmalloc.h"
#include "quarantine.h"
#include "report.h"
#include "seal.h"
#include "secondary.h"
#include "smallstate.h"
#include "smallstate_int.h"
#include "zero.h"

/* the options are sealed read-only after init: open them around a change */
void qmt_options_reset(void) {
  qm__ro_unseal();
  qm__options_reset();
  qm__ro_seal();
}
int qmt_options_apply(const char *s) {
  qm__ro_unseal();
  int r = qm__options_apply("QMALLOC_OPTIONS", s);
  qm__ro_seal();
  return r;
}
void qmt_options_init(void) {
  qm__ro_unseal();
  qm__options_init();
  qm__ro_seal();
}

uint64_t qmt_option(const char *name) {
#define QM_OPT(n, kind, def, min, max, choices, doc)                                               \
  if (!strcmp(name, #n))                                                                           \
    return qm__opt.n;
#include "options.def"
#undef QM_OPT
  return UINT64_MAX;
}

void qmt_quarantine_flush(void) { qm__large_flush(); }
void qmt_log_forget(void) { qm__out_log_forget(); }
uint32_t qmt_sample_left(void) { return qm__sample_left; }
size_t qmt_zero_cap(size_t slots) { return qm__zero_cap(slots); }
size_t qmt_delay_early(void) { return qm__cache_delay_early(); }
size_t qmt_delay_over(void) { return qm__cache_delay_over_count(); }
size_t qmt_delay_bytes(void) { return qm__delay_bytes; }
bool qmt_delay_counts_agree(void) {
  size_t sum = 0;
  for (unsigned c = 0; c < QM_DELAY_CB_N; c++) {
    size_t ring = c < QM_NCLASS ? (size_t)qm__cc[c].q.n * qm__class[c].size : 0;
    if (qm__delay_cb[c] != ring)
      return false;
    sum += ring;
  }
  return sum == qm__delay_bytes;
}
size_t qmt_limbo_bytes(void) { return qm__central_limbo_bytes(); }
size_t qmt_spare_bytes(void) { return qm__life_spare_bytes(); }
void qmt_set_making_hook(void (*hook)(void)) { qm__life_making_hook = hook; }
size_t qmt_inbox_waiting(unsigned id) { return qm__state_inbox_waiting(id); }
void qmt_set_leaving_hook(void (*hook)(void)) { qm__busy_leaving_hook = hook; }
void qmt_set_fork_hook(void (*hook)(void)) { qm__fork_hook = hook; }
void qmt_lock_watch(bool on) { qm__lock_watch(on); }
uintptr_t qmt_freeing_mark(void) { return qm__freeing; }
uintptr_t qmt_free_marked(void *p) {
  uintptr_t was = qm__freeing, off = (uintptr_t)p - qm__pbase;
  qm_freeing_set((uintptr_t)p);
  if (off < qm__pspan)
    qm__zero_free(p, QM_OP_FREE);
  else
    qm__free_outside(p);
  uintptr_t m = qm__freeing;
  qm_freeing_restore(was);
  return m;
}
void qmt_free_in_fast_path(void *p) {
  uintptr_t was = qm__freeing;
  qm_freeing_set(QM_BUSY);
  qm_free(p);
  qm_freeing_restore(was);
}
unsigned qmt_lock_unmarked(const char **file, int *line) { return qm__lock_unmarked(file, line); }

static qm_aged_t age_ring[8];
static qm_age_t age_q;
static uint32_t age_cap;
void qmt_age_reset(uint32_t cap) {
  age_q = (qm_age_t){0, 0};
  age_cap = cap;
}
uintptr_t qmt_age_push(uintptr_t item, uint32_t at) {
  uintptr_t out = 0;
  if (qm_age_full(&age_q, age_cap))
    out = age_ring[qm_age_pop(&age_q, age_cap)].item;
  age_ring[qm_age_push(&age_q, age_cap)] = (qm_aged_t){item, at};
  return out;
}
uintptr_t qmt_age_pop_due(uint32_t now, uint32_t d) {
  if (!qm_age_due(&age_q, age_ring, now, d))
    return 0;
  return age_ring[qm_age_pop(&age_q, age_cap)].item;
}

/* The queue with entries that leave from within, as the large quarantine
 * drives it: positions kept per item, a mark, a full queue compacted or
 * grown (fewer than half its entries empty) up to max. */
static uint32_t age32_ring[64], age32_pos[256], age32_cap, age32_max, age32_mark;
static qm_age_t age32_q;
void qmt_age32_reset(uint32_t cap, uint32_t max) {
  age32_q = (qm_age_t){0, 0};
  age32_cap = cap;
  age32_max = max < 64 ? max : 64;
  age32_mark = 0;
}
static uint32_t age32_live(void) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < age32_q.n; k++)
    n += age32_ring[qm_age_at(&age32_q, k, age32_cap)] != QM_AGE_EMPTY;
  return n;
}
static void age32_moved(uint32_t item, uint32_t at) { age32_pos[item] = at; }
void qmt_age32_push(uint32_t item) {
  if (qm_age_full(&age32_q, age32_cap)) {
    uint32_t cap = age32_cap, newcap = cap;
    if (age32_live() >= cap / 2 && cap * 2 <= age32_max)
      newcap = cap * 2;
    qm_age_compact(&age32_q, age32_ring, cap, newcap, &age32_mark, age32_moved);
    age32_cap = newcap;
  }
  uint32_t at = qm_age_push(&age32_q, age32_cap);
  age32_ring[at] = item;
  age32_pos[item] = at;
}
void qmt_age32_leave(uint32_t item) {
  age32_ring[age32_pos[item]] = QM_AGE_EMPTY;
  qm_age_skip(&age32_q, age32_ring, age32_cap, &age32_mark);
}
/* The entries from the oldest, QM_AGE_EMPTY where one left, into out[]
 * (their positions checked against the items' own); returns n. */
uint32_t qmt_age32_entries(uint32_t *out, bool *pos_ok) {
  *pos_ok = true;
  for (uint32_t k = 0; k < age32_q.n; k++) {
    uint32_t at = qm_age_at(&age32_q, k, age32_cap);
    out[k] = age32_ring[at];
    if (out[k] != QM_AGE_EMPTY && age32_pos[out[k]] != at)
      *pos_ok = false;
  }
  return age32_q.n;
}
uint32_t qmt_age32_cap(void) { return age32_cap; }
uint32_t qmt_age32_mark(void) { return age32_mark; }
void qmt_age32_set_mark(uint32_t m) { age32_mark = m; }

unsigned qmt_nclasses(void) { return QM_NCLASS; }
unsigned qmt_class_of(size_t n) { return qm_class_of_calc(n); }
unsigned qmt_vec(void) { return qm__vec; }
void qmt_vec_set(unsigned v) {
  qm__ro_unseal();
  qm__vec = (uint8_t)v;
  qm__ro_seal();
}
size_t qmt_class_user_size(unsigned c) { return qm__class[c].size - QM_CANARY; }
size_t qmt_class_chunk_size(unsigned c) { return qm__class[c].size; }
uintptr_t qmt_region(unsigned c) { return qm_region(c); }
/* The table entry of the chunk of a class region that holds p. */
static uint64_t *entry_of(const void *p) {
  uintptr_t off = (uintptr_t)p - qm__pbase;
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t roff = off & (((uintptr_t)1 << qm__rshift) - 1);
  return qm_entry_at(c, qm_chunk_index(roff, c));
}
qmt_entry_t qmt_entry(const void *p) {
  uint64_t w = qm_entry_load(entry_of(p));
  return (qmt_entry_t){qm_e_state(w), qm_e_owner(w), (unsigned)qm_e_gen(w), qm_e_size(w),
                       qm_e_offset(w)};
}
uintptr_t qmt_entry_line(const void *p) {
  if ((uintptr_t)p < qm__pbase || (uintptr_t)p >= qm__pbase + qm__pspan)
    return 0; /* not in a class region: a sampled slot, say */
  return (uintptr_t)entry_of(p) / 64;
}
void qmt_free_interrupting(uintptr_t mark, void *q) {
  uintptr_t was = qm__freeing;
  qm_freeing_set(mark);
  qm_free(q);
  qm__freeing = was;
}
uintptr_t qmt_malloc_interrupting(uintptr_t mark, size_t n, void **out) {
  uintptr_t was = qm__freeing;
  qm_freeing_set(mark);
  *out = qm_malloc(n);
  uintptr_t left = qm__freeing;
  qm__freeing = was;
  return left;
}
uintptr_t qmt_realloc_mark(const void *p) { return (uintptr_t)p | QM_REALLOCING; }
void qmt_owner_store_freed(void *p) {
  uint64_t *e = entry_of(p);
  qm_entry_store(e, qm_e_freed(qm_entry_load(e)));
}
unsigned qmt_bin_count(unsigned c) { return qm__bin[c].count; }
int qmt_cache_checked(void) { return qm__cache_checked; }
extern struct central *qm__central;
uintptr_t qmt_steering_state(unsigned which, uintptr_t *pointer_at) {
  switch (which) {
  case 0:
    *pointer_at = (uintptr_t)&qm__smeta;
    return (uintptr_t)qm__smeta;
  case 1:
    *pointer_at = (uintptr_t)&qm__central;
    return (uintptr_t)qm__central;
  default:
    *pointer_at = (uintptr_t)&qm__committed;
    return (uintptr_t)qm__committed;
  }
}
void qmt_owner_lock(unsigned id, int take) {
  if (take)
    qm_lock(qm__state_owner_lock(id));
  else
    qm_unlock(qm__state_owner_lock(id));
}
unsigned qmt_owner_id(void) {
  return qm__me == QM_E_NOBODY ? 0 : (unsigned)(qm__me >> QM_E_OWNER_SHIFT) & 0xffff;
}
void qmt_guards(size_t *made, size_t *missed, int *markers) {
  bool m;
  qm__primary_guards(made, missed, &m);
  *markers = m;
}
uintptr_t qmt_committed_end(unsigned c) {
  return qm__pbase + ((uintptr_t)c << qm__rshift) + atomic_load(&qm__committed[c]);
}
int qmt_is_small(const void *p) { return (uintptr_t)p - qm__pbase < qm__pspan; }
int qmt_is_guarded(const void *p) { return qm_guarded_owns(p); }

void qmt_one_vma_moves(int on) { qm__os_one_vma_moves(on); }
size_t qmt_refused_moves(void) { return qm__os_refused_moves(); }
int qmt_move_spans_vmas(void) { return qm_os_move_spans_vmas(); }
void qmt_no_populate(int on) { qm__os_no_populate(on); }
size_t qmt_off_page_ranges(void) { return qm__os_off_page(); }
size_t qmt_lib_page(void) { return qm__page; }
long qmt_minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

size_t qmt_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

int qmt_mincore(const void *p, size_t len, size_t *resident) {
  size_t pg = qmt_page();
  uintptr_t a = (uintptr_t)p & ~(pg - 1);
  size_t n = ((uintptr_t)p + len - a + pg - 1) / pg, res = 0;
  unsigned char vec[4096];
  *resident = 0;
  for (size_t done = 0; done < n;) {
    size_t k = n - done < sizeof vec ? n - done : sizeof vec;
    if (mincore((void *)(a + done * pg), k * pg, vec))
      return errno;
    for (size_t i = 0; i < k; i++)
      res += vec[i] & 1;
    done += k;
  }
  *resident = res * pg;
  return 0;
}

long qmt_mappings(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return -1;
  long n = 0;
  int c;
  while ((c = fgetc(f)) != EOF)
    n += c == '\n';
  fclose(f);
  return n;
}

void qmt_mappings_in_belt(long *belt, long *mirror) {
  *belt = *mirror = 0;
  const qm_large_fixed_t *l = qm__lfix;
  FILE *f = l && l->belt_base ? fopen("/proc/self/maps", "r") : NULL;
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *e;
    uintptr_t lo = strtoul(line, &e, 16), hi = strtoul(e + 1, NULL, 16);
    *belt += lo < l->belt_base + l->belt_len && hi > l->belt_base;
    *mirror += l->belt_mirror && lo < l->belt_mirror + l->belt_len && hi > l->belt_mirror;
    if (!strchr(line, '\n')) /* a longer line: its rest */
      for (int c; (c = fgetc(f)) != EOF && c != '\n';)
        ;
  }
  fclose(f);
}

uint64_t qmt_belt_odometer(void) { return qm__belt_odometer(); }

int qmt_large_rw(const void *p, uintptr_t *lo, uintptr_t *hi, unsigned *bound) {
  uint32_t i = qm__rec_find((uintptr_t)p);
  if (i == NIL)
    return 0;
  const block_t *b = B(i);
  *lo = b->map.usable;
  *hi = b->map.usable + (b->map.rw << qm__page_shift);
  *bound = b->chunk.flags & F_SPLIT ? b->chunk.extra_vmas + 1u : 1u; /* one, unless F_SPLIT */
  return 1;
}

int qmt_large_range(const void *p, uintptr_t *base, uintptr_t *end) {
  uint32_t i = qm__rec_find((uintptr_t)p);
  if (i == NIL)
    return 0;
  *base = B(i)->map.base;
  *end = B(i)->map.base + B(i)->map.span;
  return 1;
}

/* The lines of /proc/self/maps that overlap [from, to) and whose
 * protection `want` accepts: how many, and the bytes of them inside. */
static unsigned maps_in(uintptr_t from, uintptr_t to, bool (*want)(const char *prot),
                        size_t *bytes) {
  unsigned n = 0;
  *bytes = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char prot[5];
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, prot) == 3 && hi > from && lo < to && want(prot)) {
      n++;
      *bytes += (hi < to ? hi : to) - (lo > from ? lo : from);
    }
  }
  fclose(f);
  return n;
}
static bool readable(const char *prot) { return prot[0] == 'r'; }
static bool any(const char *prot) { return prot != NULL; }
static bool inaccessible(const char *prot) {
  return prot[0] == '-' && prot[1] == '-' && prot[2] == '-';
}

unsigned qmt_rw_mappings_in(uintptr_t from, uintptr_t to) {
  size_t bytes;
  return maps_in(from, to, readable, &bytes);
}

unsigned qmt_mappings_in(uintptr_t from, uintptr_t to) {
  size_t bytes;
  return maps_in(from, to, any, &bytes);
}

int qmt_mincore_mapped(const void *p, size_t len, int readable_only, size_t *resident,
                       size_t *unseen) {
  uintptr_t from = (uintptr_t)p, to = from + len, r[1024][2];
  size_t n = 0;
  *resident = *unseen = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return errno;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char prot[5];
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, prot) != 3 || hi <= from || lo >= to)
      continue;
    lo = lo > from ? lo : from;
    hi = hi < to ? hi : to;
    if (readable_only && !readable(prot)) {
      *unseen += hi - lo;
    } else if (n == sizeof r / sizeof r[0]) {
      fclose(f);
      return E2BIG;
    } else {
      r[n][0] = lo;
      r[n++][1] = hi;
    }
  }
  fclose(f);
  for (size_t i = 0; i < n; i++) {
    size_t res;
    int err = qmt_mincore((void *)r[i][0], r[i][1] - r[i][0], &res);
    if (err)
      return err;
    *resident += res;
  }
  return 0;
}

size_t qmt_inaccessible_pages(uintptr_t from, uintptr_t to) {
  size_t bytes;
  maps_in(from, to, inaccessible, &bytes);
  return bytes / qm__page;
}
void qmt_prot_of(const void *p, char out[5]) {
  out[0] = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char prot[5];
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, prot) == 3 && (uintptr_t)p >= lo &&
        (uintptr_t)p < hi) {
      memcpy(out, prot, 5);
      break;
    }
  }
  fclose(f);
}

long qmt_read_file(const char *path, char *buf, size_t cap) {
  return qm_os_read_file(path, buf, cap);
}

size_t qmt_metadata(uintptr_t (*out)[2], size_t cap) {
  size_t n = qm__meta_ranges(out, cap);
  n += qm__primary_tables(out + n, cap - n);
  return n + qm__large_metadata(out + n, cap - n);
}

size_t qmt_large_table(uintptr_t *lo, uintptr_t *hi) { return qm__large_table(lo, hi); }

void qmt_large_records(size_t *made, size_t *committed) { qm__large_records(made, committed); }

/* The record of the chunk whose user pointer is p (under S.lock), or NULL. */
static block_t *large_rec_of(const void *p, uint32_t *idx) {
  uint32_t i = LF.blk ? qm__tab_find((uintptr_t)p) : NIL;
  *idx = i;
  return i == NIL ? NULL : B(i);
}

int qmt_large_record(const void *p, qmt_large_rec_t *r) {
  qm_lock(&S.lock);
  uint32_t i;
  const block_t *b = large_rec_of(p, &i);
  if (b)
    *r = (qmt_large_rec_t){.idx = i,
                           .qpos = b->q.pos,
                           .dpos = b->rec.dpos,
                           .quarantined = b->chunk.state == B_QUAR,
                           .dead = b->chunk.state == B_DEAD};
  qm_unlock(&S.lock);
  return b != NULL;
}

void qmt_q_fifo(uint32_t *cap, uint32_t *head, uint32_t *n) { qm__q_fifo(cap, head, n); }

long qmt_q_stale_copy(uint32_t idx) {
  uint32_t cap, head, n;
  qm__q_fifo(&cap, &head, &n);
  for (uint32_t at = 0; at < cap; at++)
    if (LF.qring[at] == idx && (at + cap - head) % cap >= n)
      return at;
  return -1;
}

void qmt_large_set_qpos(const void *p, uint32_t pos) {
  qm_lock(&S.lock);
  uint32_t i;
  block_t *b = large_rec_of(p, &i);
  if (b)
    b->q.pos = pos;
  qm_unlock(&S.lock);
}

void qmt_large_set_dpos(const void *p, uint32_t place) {
  qm_lock(&S.lock);
  uint32_t i;
  block_t *b = large_rec_of(p, &i);
  if (b)
    b->rec.dpos = (uint16_t)place;
  qm_unlock(&S.lock);
}

void qmt_q_set_entry(uint32_t pos, uint32_t idx) { LF.qring[pos] = idx; }

void qmt_large_set_anext(const void *p, uint32_t link) {
  qm_lock(&S.lock);
  uint32_t i;
  block_t *b = large_rec_of(p, &i);
  if (b)
    b->rec.anext = link;
  qm_unlock(&S.lock);
}

uint32_t qmt_dead_max(void) { return DEAD_MAX; }

void qmt_primary_span(uintptr_t *lo, uintptr_t *hi) {
  *lo = qm__pbase;
  *hi = qm__pbase + qm__pspan;
}

void qmt_ro_range(uintptr_t *lo, uintptr_t *hi) {
  void *a, *b;
  qm__ro_range(&a, &b);
  *lo = (uintptr_t)a;
  *hi = (uintptr_t)b;
}

void qmt_fixed_state(uintptr_t vars[2], uintptr_t pages[2]) {
  vars[0] = (uintptr_t)&qm__lfix;
  vars[1] = (uintptr_t)&qm__gfix;
  pages[0] = (uintptr_t)qm__lfix;
  pages[1] = (uintptr_t)qm__gfix;
}
void qmt_poke_large_strategy(void) { *(volatile int *)&qm__lfix->strategy = 0; }
void qmt_poke_large_table(void) { *(struct block *volatile *)&qm__lfix->blk = NULL; }
void qmt_poke_guarded_base(void) { *(volatile uintptr_t *)&qm__gfix->base = 0; }
void qmt_poke_options(void) { *(volatile uint64_t *)&qm__opt.verbose = 1; }
void qmt_poke_class_key(void) { *(volatile uint64_t *)&qm__class[3].key ^= 1; }

unsigned qmt_thread_group(void) { return qm__cache_group(); }
unsigned qmt_groups(void) { return QM_GROUPS; }
size_t qmt_group_free(size_t n, unsigned g) { return qm__central_group_free(qm_class_of(n), g); }
size_t qmt_steal_min_chunks(size_t n) { return QM_STEAL_MIN / qm__class[qm_class_of(n)].size; }
size_t qmt_small_carved(void) {
  qm_primary_stats_t s;
  qm__primary_stats(&s);
  return s.carved;
}
void qmt_flush_thread_cache(void) { qm__life_flush_self(); }

void qmt_central_give(void *p) {
  uintptr_t ch = (uintptr_t)p;
  qm__central_give((unsigned)((ch - qm__pbase) >> qm__rshift), qm__cache_group(), &ch, 1);
}
