/* stats.c: qm_stats(), mallinfo2() and malloc_stats(): counters gathered
 * from the OS layer, the primary, the thread caches and the secondary.
 * Reading them takes each module's lock briefly; they are never on a fast
 * path. Option stats_at_exit prints one block of them as the process ends.
 */
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cache.h"
#include "describe.h"
#include "fault.h"
#include "fmt.h"
#include "guarded.h"
#include "init.h"
#include "life.h"
#include "meta.h"
#include "options.h"
#include "os.h"
#include "out.h"
#include "primary.h"
#include "probe.h"
#include "qmalloc.h"
#include "report.h"
#include "secondary.h"
#include "smallstate.h"

/* qm_stats and malloc_trim take the registry's and the classes' locks:
 * marked busy, so that a signal handler's free landing in them takes the
 * nested path, applied as they leave (a thread that never mallocs has no
 * refill to apply it at). Unmarked, a handler's free on a thread with no
 * cache yet made one, and waited on the registry lock the interrupted call
 * held. */
QM_EXPORT void qm_stats(qm_stats_t *s) {
  uintptr_t was = qm_busy_enter();
  memset(s, 0, sizeof *s);
  qm__init();
  s->sys_mmap = atomic_load(&qm__os_counts.mmap);
  s->sys_munmap = atomic_load(&qm__os_counts.munmap);
  s->sys_mprotect = atomic_load(&qm__os_counts.mprotect);
  s->sys_madvise = atomic_load(&qm__os_counts.madvise);
  s->sys_mremap = atomic_load(&qm__os_counts.mremap);
  s->sys_skipped = atomic_load(&qm__os_counts.skipped);
  s->locked_remaps = atomic_load(&qm__os_counts.remapped);
  qm__large_stats(s);
  qm__guarded_stats(s);
  qm_primary_stats_t p;
  qm__primary_stats(&p);
  size_t cached = qm__life_held_bytes();
  s->small_reserved = p.reserved;
  s->small_committed = p.committed;
  s->small_free = p.central_free + cached;
  s->small_in_use = p.carved > s->small_free ? p.carved - s->small_free : 0;
  s->small_purged = p.purged_bytes;
  s->threads = qm__life_threads();
  qm__busy_leave_applying(was);
}

QM_EXPORT struct mallinfo2 qm_mallinfo2(void) {
  qm_stats_t s;
  qm_stats(&s);
  struct mallinfo2 m;
  memset(&m, 0, sizeof m);
  m.arena = s.small_committed;
  m.ordblks = s.quarantine_chunks;
  m.hblks = s.large_live_chunks;
  m.hblkhd = s.large_mapped_bytes;
  /* in use: small chunks whole, large and guarded ones by the bytes asked
   * for (a sampled chunk was missing: the fuzzer's sum of requests then
   * came out above it) */
  m.uordblks = s.small_in_use + s.large_live_bytes + s.guarded_live_bytes;
  m.fordblks = s.small_free;
  m.keepcost = s.quarantine_resident_bytes;
  return m;
}

QM_EXPORT int qm_malloc_trim(size_t pad) {
  (void)pad;
  uintptr_t was = qm_busy_enter();
  qm__init();
  qm__life_flush_self();
  qm__life_release_spares();
  size_t released = qm__primary_purge_all();
  released += qm__large_trim();
  qm__busy_leave_applying(was);
  return released != 0;
}

static void line(qm_buf_t *b, const char *name, uint64_t v) {
  qm_buf_str(b, "qmalloc: ");
  qm_buf_str(b, name);
  size_t mark = b->n;
  qm_buf_dec(b, v);
  qm_buf_pad_from(b, mark, 36 - (mark > 36 ? 36 : strlen(name)));
  qm_buf_str(b, "\n");
  qm__out(b);
}

QM_EXPORT void qm_malloc_stats(void) {
  qm_stats_t s;
  qm_stats(&s);
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: strategy ");
  qm_buf_str(&b, s.strategy ? qm_strategy_name(s.strategy) : "(not chosen yet)");
  qm_buf_str(&b, "\n");
  qm__out(&b);
  line(&b, "small bytes in use", s.small_in_use);
  line(&b, "small bytes free (cached)", s.small_free);
  line(&b, "small bytes committed", s.small_committed);
  line(&b, "small bytes advised back", s.small_purged);
  line(&b, "large chunks live", s.large_live_chunks);
  line(&b, "large bytes live", s.large_live_bytes);
  line(&b, "large bytes mapped", s.large_mapped_bytes);
  line(&b, "quarantine chunks", s.quarantine_chunks);
  line(&b, "quarantine bytes", s.quarantine_bytes);
  line(&b, "quarantine bytes resident", s.quarantine_resident_bytes);
  line(&b, "large allocs", s.large_allocs);
  line(&b, "large frees", s.large_frees);
  line(&b, "reuses", s.reuses);
  line(&b, "fresh mappings", s.fresh_maps);
  line(&b, "unmaps", s.unmaps);
  line(&b, "page drops", s.drops);
  line(&b, "faults avoided", s.faults_avoided);
  line(&b, "realloc in place", s.realloc_in_place);
  line(&b, "realloc moved", s.realloc_moved);
  line(&b, "mappings (estimate)", s.mappings_estimate);
  line(&b, "mappings budget", s.mappings_budget);
  line(&b, "sampled chunks live", s.guarded_live_chunks);
  line(&b, "sampled chunks quarantined", s.guarded_quarantine_chunks);
  line(&b, "sampled allocs", s.guarded_allocs);
  line(&b, "sampled allocs not guarded", s.guarded_skipped);
  line(&b, "sampled mappings (estimate)", s.guarded_mappings_estimate);
  line(&b, "syscalls mmap", s.sys_mmap);
  line(&b, "syscalls munmap", s.sys_munmap);
  line(&b, "syscalls mprotect", s.sys_mprotect);
  line(&b, "syscalls madvise", s.sys_madvise);
  line(&b, "syscalls mremap", s.sys_mremap);
  line(&b, "no-op changes skipped", s.sys_skipped);
  line(&b, "page drops remapped (locked)", s.locked_remaps);
  line(&b, "window breaks", s.window_breaks);
  line(&b, "belt reserved bytes", s.belt_reserved_bytes);
  line(&b, "belt window bytes", s.belt_window_bytes);
  line(&b, "belt mappings (estimate)", s.belt_mappings);
  line(&b, "belt chunks carved fresh", s.belt_fresh);
  line(&b, "belt reuses by moving pages", s.belt_moves);
  line(&b, "belt frees pooled (way move)", s.belt_pooled);
  line(&b, "belt reuses gathered from pieces", s.belt_gathers);
  line(&b, "belt pieces gathered", s.belt_pieces);
  line(&b, "threads with a cache", s.threads);
}

QM_EXPORT int qm_describe(const void *addr, char *buf, size_t cap) {
  qm_place_t pl;
  bool ok = qm__describe((uintptr_t)addr, &pl);
  if (!cap)
    return ok;
  qm_buf_t out;
  out.n = 0;
  if (ok) {
    qm_buf_str(&out, qm__access_name(pl.access));
    qm_buf_str(&out, ": ");
    qm_buf_mem(&out, pl.words.s, pl.words.n);
  } else {
    qm_buf_str(&out, "not in memory qmalloc manages");
  }
  size_t n = out.n < cap - 1 ? out.n : cap - 1;
  memcpy(buf, out.s, n);
  buf[n] = 0;
  return ok;
}

/* "qmalloc:   <label> <v>" with up to three more "<name> <v>" pairs. */
static void row(const char *label, uint64_t v, const char *n1, uint64_t v1, const char *n2,
                uint64_t v2, const char *n3, uint64_t v3) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc:   ");
  qm_buf_str(&b, label);
  qm_buf_str(&b, " ");
  qm_buf_dec(&b, v);
  const char *names[3] = {n1, n2, n3};
  uint64_t vals[3] = {v1, v2, v3};
  for (int k = 0; k < 3 && names[k]; k++) {
    qm_buf_str(&b, ", ");
    qm_buf_str(&b, names[k]);
    qm_buf_str(&b, " ");
    qm_buf_dec(&b, vals[k]);
  }
  qm_buf_str(&b, "\n");
  qm__out(&b);
}

static void probe_row(const qm_probe_result_t *r) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc:   strategy ");
  qm_buf_str(&b, qm_strategy_name(r->strategy));
  qm_buf_str(&b, r->measured ? " (probe measured: " : " (probe forced: ");
  qm_buf_str(&b, r->fast_dirty == 1 ? "mprotect fast path" : "no mprotect fast path");
  qm_buf_str(&b, r->guard_regions == 1 ? ", guard regions" : ", no guard regions");
  qm_buf_str(&b, ", kernel ");
  qm_buf_str(&b, r->kernel);
  qm_buf_str(&b, "): ");
  qm_buf_str(&b, r->reason);
  qm_buf_str(&b, "\n");
  qm__out(&b);
  qm_buf_str(&b, "qmalloc:   belt way ");
  qm_buf_str(&b, qm_belt_way_name(r->belt_way));
  qm_buf_str(&b, ": ");
  qm_buf_str(&b, r->belt_reason);
  qm_buf_str(&b, "\n");
  qm__out(&b);
}

/* After the program's own exit handlers (destructors run last), so the
 * counters are the process's whole life. */
__attribute__((destructor)) static void stats_at_exit(void) {
  if (!__atomic_load_n(&qm__init_done, __ATOMIC_ACQUIRE) || !qm__opt.stats_at_exit)
    return;
  qm_stats_t s;
  qm_stats(&s);
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru))
    memset(&ru, 0, sizeof ru);
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: stats at exit of pid ");
  qm_buf_dec(&b, (uint64_t)getpid());
  qm_buf_str(&b, "\n");
  qm__out(&b);
  if (s.strategy)
    probe_row(qm_probe_result());
  row("large allocations", s.large_allocs, "from quarantine", s.reuses, "fresh mappings",
      s.fresh_maps, "realloc in place", s.realloc_in_place);
  row("large frees", s.large_frees, "realloc moves", s.realloc_moved, NULL, 0, NULL, 0);
  row("quarantine chunks", s.quarantine_chunks, "bytes", s.quarantine_bytes, "resident bytes",
      s.quarantine_resident_bytes, NULL, 0);
  row("quarantine unmapped", s.unmaps, "pages dropped", s.drops, NULL, 0, NULL, 0);
  /* the window's promise, and what it rides on (zero breaks is the promise kept) */
  row("window breaks", s.window_breaks, "belt bytes", s.belt_reserved_bytes, "window bytes",
      s.belt_window_bytes, NULL, 0);
  row("faults avoided", s.faults_avoided, NULL, 0, NULL, 0, NULL, 0);
  row("mappings", s.mappings_estimate, "peak", qm__large_mappings_peak(), "budget",
      s.mappings_budget, NULL, 0);
  row("small bytes in use", s.small_in_use, "free", s.small_free, "committed", s.small_committed,
      "advised back", s.small_purged);
  /* free_delay's promise, as the window's: zero is every chunk waited */
  if (qm__opt.free_delay)
    row("delayed frees let go early: ring full", qm__cache_delay_early(), "over free_delay_kb",
        qm__cache_delay_over_count(), NULL, 0, NULL, 0);
  row("guarded allocations", s.guarded_allocs, "frees", s.guarded_frees, "reuses", s.guarded_reuses,
      "skipped", s.guarded_skipped);
  row("guarded live chunks", s.guarded_live_chunks, "bytes", s.guarded_live_bytes,
      "quarantine chunks", s.guarded_quarantine_chunks, "resident bytes",
      s.guarded_quarantine_resident_bytes);
  row("peak resident KiB", (uint64_t)ru.ru_maxrss, "threads with a cache", s.threads, NULL, 0, NULL,
      0);
  row("syscalls mmap", s.sys_mmap, "munmap", s.sys_munmap, "mprotect", s.sys_mprotect, "madvise",
      s.sys_madvise);
}
