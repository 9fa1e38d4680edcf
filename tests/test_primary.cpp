// test_primary.cpp: small chunks: the class table, the state table and the
// reports (double free, interior pointer, overflow), cross-thread frees,
// thread exit handing caches back, and free pages going back to the kernel.
#include <gtest/gtest.h>

#include <sys/auxv.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "util.h"

namespace {

TEST(Classes, EveryRequestGetsTheSmallestClassThatHoldsIt) {
  unsigned n = qmt_nclasses();
  for (size_t req = 0; req <= 131064; req++) {
    unsigned c = qmt_class_of(req);
    ASSERT_LT(c, n) << req;
    ASSERT_GE(qmt_class_user_size(c), req) << req;
    ASSERT_EQ(qmt_class_chunk_size(c), qmt_class_user_size(c) + 8) << "the canary's 8 bytes";
    if (c) {
      ASSERT_LT(qmt_class_user_size(c - 1), req) << req;
    }
    // bounded internal waste: at most a quarter plus the 16-byte granule
    size_t need = req + 8;
    ASSERT_LE(qmt_class_chunk_size(c), need + need / 4 + 16) << req;
  }
  EXPECT_EQ(qmt_class_chunk_size(0), 16u) << "malloc(8) takes 16 bytes";
  EXPECT_EQ(qmt_class_user_size(n - 1), 131064u);
}

TEST(Primary, EverySmallSizeIsAlignedUsableAndDistinct) {
  std::vector<void *> live;
  std::set<uintptr_t> seen;
  for (size_t n = 0; n < 131072; n += (n < 4096 ? 1 : 97)) {
    void *p = qm_malloc(n);
    ASSERT_NE(p, nullptr) << n;
    if (!qmt_is_guarded(p)) {
      ASSERT_EQ(qmt_is_small(p), n <= 131064) << n;
    }
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << n;
    ASSERT_GE(qm_malloc_usable_size(p), n);
    ASSERT_TRUE(seen.insert(reinterpret_cast<uintptr_t>(p)).second) << n;
    std::memset(p, 0x5a, n);
    live.push_back(p);
  }
  for (void *p : live)
    qm_free(p);
}

TEST(Primary, FreedChunkComesBackFromTheCache) {
  // which free chunk a malloc gets is random, but a freed one is not lost:
  // it is handed out again before the class carves much more
  void *p = qm_malloc(40);
  qm_free(p);
  std::vector<void *> held;
  bool back = false;
  for (int i = 0; i < 4096 && !back; i++) {
    held.push_back(qm_malloc(40));
    back = held.back() == p;
  }
  EXPECT_TRUE(back);
  for (void *q : held)
    qm_free(q);
}

// A bin that runs dry while the class's frees wait in the parked ring is
// filled to half its size, not only with those frees: else it ran dry again
// within a few mallocs, each miss rescanning the ring (python3 with
// PYTHONMALLOC=malloc missed on 1 malloc in 45, 48-byte chunks most).
TEST(Primary, ABinThatRunsDryIsFilledToHalfNotOnlyWithTheParkedFrees) {
  if (!qmt_option("thread_cache") || qmt_cache_checked())
    GTEST_SKIP() << "no bins to fill";
  std::thread t([] {
    const size_t size = 40;
    unsigned c = qmt_class_of(size);
    size_t slots = 32768 / qmt_class_chunk_size(c);
    unsigned half = (unsigned)((slots < 2 ? 2 : slots > 128 ? 128 : slots) + 1) / 2;
    std::vector<void *> v;
    // the first malloc fills the empty bin to half; these empty it
    while (v.empty() || qmt_bin_count(c))
      v.push_back(qm_malloc(size));
    ASSERT_LE(v.size(), (size_t)half + 1);
    for (int i = 0; i < 4; i++) { // parked, fewer than a batch
      qm_free(v.back());
      v.pop_back();
    }
    EXPECT_EQ(qmt_bin_count(c), 0u);
    v.push_back(qm_malloc(size)); // a miss: the 4 parked, then the central list
    EXPECT_EQ(qmt_bin_count(c), half - 1);
    for (void *p : v)
      qm_free(p);
  });
  t.join();
}

// A chunk's state is its table entry: allocated with its size and this
// thread as owner, freed with the next generation. Nothing in or around the
// chunk is read for it.
TEST(Primary, StateLivesInTheTable) {
  if (!qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "no thread caches, or guarded chunks";
  qm_free(qm_malloc(8)); // the thread's cache and owner id exist now
  unsigned char *p = static_cast<unsigned char *>(qm_malloc(48));
  qmt_entry_t e = qmt_entry(p);
  EXPECT_EQ(e.state, 1u);
  EXPECT_EQ(e.size, 48u);
  EXPECT_EQ(e.offset, 0u);
  EXPECT_NE(qmt_owner_id(), 0u);
  EXPECT_EQ(e.owner, qmt_owner_id());
  std::memset(p, 0x41, 48); // every byte the program may write
  qm_free(p);
  qmt_entry_t f = qmt_entry(p);
  EXPECT_EQ(f.state, 2u);
  EXPECT_EQ(f.gen, (e.gen + 1) & 0xffff);
}

// The canary is keyed by chunk and generation: two chunks of one class
// (almost) never share it, and it has a zero byte, so a string read past
// the end stops within it.
TEST(Primary, CanariesDifferPerChunkAndHaveAZeroByte) {
  std::vector<unsigned char *> v;
  std::set<uint64_t> seen;
  for (int i = 0; i < 256; i++) {
    v.push_back(static_cast<unsigned char *>(qm_malloc(40)));
    if (!qmt_is_small(v.back()))
      continue; // a sampled chunk
    uint64_t c;
    std::memcpy(&c, v.back() + 40, 8);
    EXPECT_EQ((c >> 8) & 0xff, 0u) << "byte 1 of the canary is zero";
    EXPECT_NE(c & 0xff, 0u) << "byte 0 is not: an off-by-one NUL changes it";
    seen.insert(c);
  }
  EXPECT_GE(seen.size(), 250u);
  for (unsigned char *p : v)
    qm_free(p);
}

TEST(Primary, ClassRegionsHaveGuardPages) {
  // 8 MiB of one class crosses at least 8 of the default 1 MiB spans, each
  // ending in an inaccessible page
  std::vector<void *> v;
  for (int i = 0; i < 8 * 4096; i++)
    v.push_back(qm_malloc(240));
  size_t made, missed;
  int markers;
  qmt_guards(&made, &missed, &markers);
  EXPECT_GE(made, 8u);
  EXPECT_EQ(missed, 0u);
  std::sort(v.begin(), v.end());
  uintptr_t lo = reinterpret_cast<uintptr_t>(v.front()) & ~(qmt_page() - 1);
  if (!markers) {
    EXPECT_GE(qmt_inaccessible_pages(lo, reinterpret_cast<uintptr_t>(v.back())), 7u)
        << "PROT_NONE guards show in /proc/self/maps";
  }
  for (void *p : v)
    qm_free(p);
}

TEST(PrimaryDeathTest, AnOverflowIntoAClassGuardPageFaults) {
  // spans start at the class region's base: the guard page of the span
  // holding p is the last page below the next MiB from there
  // (a sampled malloc gets a guarded slot outside the class region: only
  // the region's chunks count)
  uintptr_t base = qmt_region(qmt_class_of(240)), p = UINTPTR_MAX;
  for (int i = 0; i < 2 * 4096; i++) {
    uintptr_t a = reinterpret_cast<uintptr_t>(qm_malloc(240));
    if (a >= base && a < qmt_region(qmt_class_of(240) + 1))
      p = std::min(p, a);
  }
  ASSERT_NE(p, UINTPTR_MAX);
  uintptr_t guard = base + ((p - base) | ((1u << 20) - 1)) + 1 - qmt_page();
  ASSERT_LT(guard, qmt_committed_end(qmt_class_of(240)));
  std::string re = qm_fill("^" QM_LINE_AT(QM_K_GUARD, "write", "@D@") "\n" QM_FAULT_END, "@D@",
                           "guard page between runs of small chunks of class " +
                               std::to_string(qmt_class_chunk_size(qmt_class_of(240))) + " bytes");
  EXPECT_EXIT(poke(reinterpret_cast<void *>(guard), 100), testing::KilledBySignal(SIGSEGV), re);
}

TEST(PrimaryDeathTest, DoubleFreeIsReported) {
  void *p = qm_malloc(48);
  qm_free(p);
  EXPECT_DEATH(qm_free(p), "^" QM_LINE_OF(QM_K_DOUBLE_FREE, "small chunk, 48 bytes") "\n" QM_END);
}

// A signal handler's free(q) landing while the thread is inside free(p):
// q changes state at once, so the program's own later free(q) is the
// double free, not a success that hands q out twice once the handler's
// free is applied.
TEST(PrimaryDeathTest, AFreeFromAHandlerInsideAnotherFreeCountsAtOnce) {
  void *p = qm_malloc(48), *q = qm_malloc(48);
  qmt_free_interrupting(reinterpret_cast<uintptr_t>(p), q);
  EXPECT_EQ(qm_malloc_object_size(q), 0u);
  EXPECT_DEATH(qm_free(q), "^" QM_LINE_OF(QM_K_DOUBLE_FREE, "small chunk, 48 bytes") "\n" QM_END);
  qm_free(p);
}

// A handler's free of p while realloc(p) resizes it in place (realloc
// marks it, qmt_realloc_mark): reported, instead of the resize writing
// the entry back live over the free (p then handed out while held).
TEST(PrimaryDeathTest, AFreeFromAHandlerDuringReallocOfItReports) {
  void *p = qm_malloc(200);
  EXPECT_DEATH(qmt_free_interrupting(qmt_realloc_mark(p), p),
               "^" QM_LINE_OF(QM_K_DOUBLE_FREE,
                              "freed from a signal handler during its realloc") "\n" QM_END);
  qm_free(p);
}

// A handler that mallocs while its thread is inside free(p): malloc puts
// back the mark it found, so the handler's later frees still take the
// nested path (cleared, they took the fast path inside the interrupted
// free: a chunk parked twice, handed out twice).
TEST(Primary, MallocFromAHandlerKeepsTheInterruptedFreesMark) {
  void *p = qm_malloc(48), *q = nullptr;
  uintptr_t mark = reinterpret_cast<uintptr_t>(p);
  EXPECT_EQ(qmt_malloc_interrupting(mark, 48, &q), mark);
  ASSERT_NE(q, nullptr);
  EXPECT_DEATH(qmt_free_interrupting(qmt_malloc_interrupting(mark, 48, &q), p),
               "^" QM_LINE_OF(QM_K_DOUBLE_FREE,
                              "freed again from a signal handler during its free") "\n" QM_END);
  qm_free(q);
  qm_free(p);
}

// The owner's free of p and another thread's, racing: the other thread's
// swap (ALLOC -> SENT) lands between the owner's load and its plain store,
// which makes the entry FREE over SENT. The other thread's message reaches
// the owner's inbox; the main thread has no exit hook, and its inbox is
// drained when the program ends, so the double free is reported then.
TEST(PrimaryDeathTest, ARaceOfOwnerAndRemoteFreeIsReportedAtExit) {
  if (qmt_cache_checked())
    GTEST_SKIP() << "checked mode sends no frees";
  qm_free(qm_malloc(32));
  if (!qmt_owner_id())
    GTEST_SKIP() << "no thread cache: no owner, no inbox";
  EXPECT_DEATH(
      {
        void *p = qm_malloc(64);
        std::thread([p] {
          qm_free(qm_malloc(32)); /* an id of its own: p goes to its owner */
          qm_free(p);
        }).join(); /* its exit sends p to this thread's inbox */
        qmt_owner_store_freed(p);
        exit(0);
      },
      "^" QM_LINE_OF(QM_K_DOUBLE_FREE,
                     "small chunk, 64 bytes, freed twice on two threads") "\n" QM_END);
}

// A canary checked at a free is zeroed, and so is the one an in-place
// resize moves: no later, larger request of the chunk finds one in its own
// bytes (a 16-bit generation repeats, so a canary read once would be good
// again 65,536 frees later).
TEST(Primary, NoCanaryIsLeftInsideARequest) {
  if (qmt_cache_checked())
    GTEST_SKIP() << "checked mode zeroes a freed chunk whole";
  ASSERT_EQ(qmt_class_of(24), qmt_class_of(17));
  unsigned char *g = static_cast<unsigned char *>(qm_malloc(17));
  ASSERT_EQ(qm_realloc(g, 24), g) << "grown in place";
  for (int i = 17; i < 24; i++)
    EXPECT_EQ(g[i], 0) << "byte " << i << " held the old canary";
  qm_free(g);
  ASSERT_EQ(qmt_class_of(33), qmt_class_of(40));
  unsigned char *p = static_cast<unsigned char *>(qm_malloc(33));
  qm_free(p);
  qmt_flush_thread_cache(); /* the parked free checked, p in the central list */
  std::vector<void *> got;
  unsigned char *again = nullptr;
  for (int i = 0; i < 100000 && !again; i++) {
    got.push_back(qm_malloc(40));
    if (got.back() == p)
      again = p;
  }
  ASSERT_NE(again, nullptr) << "p not handed out again";
  for (int i = 33; i < 40; i++)
    EXPECT_EQ(again[i], 0) << "byte " << i << " held the canary of p's last allocation";
  for (void *x : got)
    qm_free(x);
}

// The same inside malloc: the handler's free leaves the bin alone (malloc
// may be between its count and its slot), and q comes back at the next
// refill, once.
TEST(Primary, AFreeFromAHandlerInsideMallocLeavesTheBinAlone) {
  if (qmt_cache_checked())
    GTEST_SKIP() << "checked mode keeps no bins";
  unsigned c = qmt_class_of(48);
  void *q = qm_malloc(48);
  unsigned before = qmt_bin_count(c);
  qmt_free_interrupting(1, q);
  EXPECT_EQ(qmt_bin_count(c), before);
  EXPECT_EQ(qmt_entry(q).state, 3u) << "SENT until the refill";
  qmt_flush_thread_cache();
  std::vector<void *> got;
  size_t seen = 0;
  for (int i = 0; i < 4096; i++) {
    got.push_back(qm_malloc(48));
    seen += got.back() == q;
  }
  EXPECT_EQ(seen, 1u);
  for (void *x : got)
    qm_free(x);
}

TEST(PrimaryDeathTest, InteriorPointerIsAnInvalidFree) {
  char *p = static_cast<char *>(qm_malloc(100));
  EXPECT_DEATH(qm_free(p + 8), "^" QM_LINE_OF(QM_K_INVALID_FREE,
                                              "offset 8 in small chunk of 100 bytes \\(class 112 "
                                              "bytes\\) at " HEX) "\n" QM_END);
  qm_free(p);
}

// There is no header: the 16 bytes before a chunk are its neighbour's, and
// writing a freed chunk's old word back there (a replay) changes no state:
// the second free still aborts.
static void replay_then_free_twice() {
  // the higher of two: the bytes below it are in the region
  uint64_t *p =
      std::max(static_cast<uint64_t *>(qm_malloc(64)), static_cast<uint64_t *>(qm_malloc(64)));
  uint64_t saved[2];
  std::memcpy(saved, p - 2, 16);
  qm_free(p);
  std::memcpy(p - 2, saved, 16);
  qm_free(p);
}
TEST(PrimaryDeathTest, ReplayBeforeAChunkForgesNoState) {
  EXPECT_DEATH(replay_then_free_twice(),
               "^" QM_LINE_OF(QM_K_DOUBLE_FREE, "small chunk, 64 bytes") "\n" QM_END);
}

// chunks are carved in shuffled order, but a run's chunks sit next to each
// other: take enough to hold whole runs and find two neighbours
static void neighbours(size_t n, char **lo, char **hi) {
  size_t step = qmt_class_chunk_size(qmt_class_of(n));
  std::vector<char *> c;
  for (int i = 0; i < 256; i++)
    c.push_back(static_cast<char *>(qm_malloc(n)));
  std::sort(c.begin(), c.end());
  *lo = *hi = nullptr;
  for (size_t i = 1; i < c.size() && !*lo; i++)
    if (c[i] - c[i - 1] == static_cast<ptrdiff_t>(step))
      *lo = c[i - 1], *hi = c[i];
}

// The report of an overflow past a small chunk: under hardening=max the
// free of its next neighbour checks its live neighbours
// and finds it first; in the default profile the chunk's own free (or its
// parked check) does: found at its parked check, the report names the free
// that parked it first (one frame), then the call that found the damage.
static std::string overflow_re(const char *detail) {
  std::string d = detail;
  const char *freed = "";
  if (qmt_option("hardening")) // the death test's child lays its heap out afresh
    d += ", found at the free of its next neighbour " QM_HEX;
  else
    freed = "(" QM_SMALL_FREED_HEAD "\n" QM_FRAME "\n)?";
  return qm_fill(std::string("^" QM_LINE(QM_K_SMALL_OVERFLOW, "@D@") "\n") + freed + QM_END, "@D@",
                 d);
}

// Writing past the first one's end runs through its canary into the second
// one's bytes: the second one's state is out of band and its free succeeds
// (under hardening=max it checks its neighbours and reports the first);
// the first one's free reports the first bad byte.
TEST(PrimaryDeathTest, NeighbourOverflowIsCaughtAtFree) {
  char *lo, *hi;
  neighbours(3000, &lo, &hi);
  ASSERT_NE(lo, nullptr) << "no two chunks of a run are neighbours";
  EXPECT_DEATH(
      {
        std::memset(lo, 'A', qmt_class_chunk_size(qmt_class_of(3000)) + 16);
        qm_free(hi);
        qm_free(lo);
        qmt_flush_thread_cache(); // a free's canary check may wait 16 frees
      },
      overflow_re("3000 bytes, written past the end at offset 3000"));
}

TEST(PrimaryDeathTest, NeverAllocatedChunkIsAnInvalidFree) {
  char *p = static_cast<char *>(qm_malloc(32));
  // the chunk after the ones carved so far: in the heap, but never handed out
  char *q = p + 48 * 1000;
  EXPECT_DEATH(qm_free(q), "^" QM_LINE_OF(QM_K_INVALID_FREE, ".+"));
  qm_free(p);
}

// A bad pointer just past a class's committed memory: reported, never a
// stray read of the PROT_NONE page behind it.
TEST(PrimaryDeathTest, PointerAtTheCommittedEndIsReportedNotFaulted) {
  void *p = qm_malloc(32);
  uintptr_t end = qmt_committed_end(qmt_class_of(32));
  for (uintptr_t bad : {end + 9, end + 16, end - 7}) {
    EXPECT_DEATH(qm_free(reinterpret_cast<void *>(bad)), "^" QM_LINE_OF(QM_K_INVALID_FREE, ".+"));
  }
  qm_free(p);
}

TEST(Primary, OverAlignedZeroSizeStaysInItsChunk) {
  for (size_t align = 32; align <= 4096; align *= 2) {
    void *p = qm_memalign(align, 0);
    void *q = nullptr;
    ASSERT_EQ(qm_posix_memalign(&q, align, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u);
    qm_free(p); // reported "invalid free" when the pointer sat on the next chunk
    qm_free(q);
  }
}

TEST(PrimaryDeathTest, ForeignPointerIsAnInvalidFree) {
  static char not_heap[64];
  EXPECT_DEATH(qm_free(not_heap + 16),
               "^" QM_LINE_OF(QM_K_INVALID_FREE, "not allocated by qmalloc") "\n" QM_END);
}

TEST(Primary, AlignedSmallChunks) {
  for (size_t align = 32; align <= 65536; align *= 2) {
    for (size_t n : {1ul, 100ul, 1000ul, 5000ul}) {
      void *p = qm_memalign(align, n);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u) << align << " " << n;
      if (!qmt_is_guarded(p)) {
        EXPECT_EQ(qmt_is_small(p), n + align < 131072) << "small class, offset in the table";
      }
      EXPECT_GE(qm_malloc_usable_size(p), n);
      std::memset(p, 1, n);
      qm_free(p);
    }
  }
}

TEST(Primary, FreesFromOtherThreadsAreCorrect) {
  constexpr int N = 100000;
  std::vector<void *> ptrs(N);
  std::thread producer([&] {
    for (int i = 0; i < N; i++) {
      ptrs[i] = qm_malloc(16 + i % 500);
      std::memset(ptrs[i], i & 0xff, 16);
    }
  });
  producer.join();
  std::thread consumer([&] {
    for (int i = 0; i < N; i++) {
      ASSERT_EQ(static_cast<unsigned char *>(ptrs[i])[15], i & 0xff);
      qm_free(ptrs[i]);
    }
  });
  consumer.join();
  // the chunks went back through the other thread's cache: allocate them again
  std::vector<void *> again;
  for (int i = 0; i < N; i++)
    again.push_back(qm_malloc(16 + i % 500));
  for (void *p : again)
    qm_free(p);
}

// A thread that frees what another allocated takes an owner id (and its
// cache) at that first free, though it never mallocs: it then batches its
// frees and keeps spare batches of its own instead of taking the shared
// lock and sending a batch of one per free. The chunk is SENT at once. In
// checked mode too (max-primary), where the free checks the chunk at once.
TEST(Primary, AFreeOnlyThreadTakesAnIdAtItsFirstRemoteFree) {
  if (!qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "no thread caches, or guarded chunks";
  void *p = qm_malloc(48);
  ASSERT_NE(qmt_owner_id(), 0u);
  unsigned before = 0, after = 0, state = 0;
  std::thread([&] {
    before = qmt_owner_id();
    qm_free(p);
    after = qmt_owner_id();
    state = qmt_entry(p).state;
  }).join();
  EXPECT_EQ(before, 0u);
  EXPECT_NE(after, 0u);
  EXPECT_NE(after, qmt_owner_id());
  EXPECT_EQ(state, 3u) << "SENT at the free itself";
}

// A thread that frees a batch of another thread's large small chunks and
// then blocks sends them on at 64 KiB, whatever their count: they waited
// in its outbox, up to 61 of them, until it freed again (2.8 MiB of 48 KiB
// chunks in a review's test). The default profile parks the last 16 for
// their canary check first.
TEST(Primary, AThreadThatBlocksAfterItsFreesHoldsLittleFromTheirOwner) {
  if (!qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "no thread caches, or guarded chunks";
  const size_t N = 40, n = 16000;
  std::vector<void *> v;
  for (size_t i = 0; i < N; i++)
    v.push_back(qm_malloc(n));
  size_t sent = 0, size = qmt_class_chunk_size(qmt_class_of(n));
  for (void *q : v)
    sent += !qmt_is_guarded(q);
  std::atomic<int> step{0};
  std::thread w([&] {
    for (void *q : v)
      qm_free(q);
    step = 1;
    while (step != 2) // blocked, as on its next job
      std::this_thread::yield();
  });
  while (step != 1)
    std::this_thread::yield();
  size_t waiting = qmt_inbox_waiting(qmt_owner_id());
  step = 2;
  w.join();
  size_t parked = qmt_cache_checked() ? 0 : 16, held = (64 << 10) / size;
  EXPECT_GE(waiting + parked + held, sent)
      << "of " << sent << " chunks of " << size << " bytes, sent to their owner";
}

// In checked mode a free-only thread takes an id no chunk carries, not an
// exited thread's: with that thread's id it was sent what others freed of
// the exited thread's chunks, held for as long as it blocked (4 MiB in a
// review's test); with its own, the id stays closed and those frees are
// applied by their senders (max-primary).
TEST(Primary, InCheckedModeAFreeOnlyThreadTakesAnIdNoChunkCarries) {
  if (!qmt_cache_checked() || !qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "checked mode with thread caches only";
  std::vector<void *> left;
  unsigned x_id = 0, f_id = 0;
  void *p = qm_malloc(48); // this thread's id first: not the exited one's
  std::thread([&] {
    for (int i = 0; i < 200; i++)
      left.push_back(qm_malloc(200));
    x_id = qmt_owner_id();
  }).join();
  std::atomic<int> step{0};
  std::thread f([&] {
    qm_free(p); // the first act of a thread that only frees
    f_id = qmt_owner_id();
    step = 1;
    while (step != 2)
      std::this_thread::yield();
  });
  while (step != 1)
    std::this_thread::yield();
  for (void *q : left)
    qm_free(q);
  size_t waiting = qmt_inbox_waiting(f_id);
  step = 2;
  f.join();
  ASSERT_NE(x_id, 0u);
  EXPECT_NE(f_id, 0u) << "it takes an id, so that its frees are batched";
  EXPECT_NE(f_id, x_id) << "not the exited thread's";
  EXPECT_EQ(waiting, 0u) << "frees of the exited thread's chunks sent to the free-only thread";
  // the id of a free-only thread that exited carries no chunk either: the
  // next such thread takes it (ids are not used up by such threads)
  unsigned g_id = 0;
  void *p2 = qm_malloc(48);
  std::thread([&] {
    qm_free(p2);
    g_id = qmt_owner_id();
  }).join();
  EXPECT_EQ(g_id, f_id) << "the exited free-only thread's id, taken again";
}

// ... but not for an exited thread's chunk: those are applied under the
// closed id's lock whether the freeing thread has an id or not, and a
// thread starting with such frees (a successor, larson's threads) took a
// fresh id and registration each time (peak RSS 2.38x jemalloc's, from
// 1.33, on larson under max).
TEST(Primary, InCheckedModeAFreeOfAnExitedThreadsChunkTakesNoId) {
  if (!qmt_cache_checked() || !qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "checked mode with thread caches only";
  void *p = nullptr;
  std::thread([&] { p = qm_malloc(48); }).join();
  unsigned id = 1;
  std::thread([&] {
    qm_free(p);
    id = qmt_owner_id();
  }).join();
  EXPECT_EQ(id, 0u);
}

// ... and an id that went onto chunks without a refill is not taken again:
// a free-only thread's bins fill with chunks no thread owns (malloc'd where
// a thread had no cache: late in a key destructor), and its mallocs hand
// them out under its id, malloc(0) first (no refill). Counted only at
// refills, the id stayed "carries none", and the next free-only thread
// took it with the chunks (120 sent to it here; a review's test).
static void *late_chunks[640];
static void late_mallocs(void *) {
  for (void *&q : late_chunks)
    q = qm_malloc(40);
}
TEST(Primary, InCheckedModeAnIdHandedOutWithoutARefillIsNotTakenAgain) {
  if (!qmt_cache_checked() || !qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "checked mode with thread caches only";
  pthread_key_t key;
  ASSERT_EQ(pthread_key_create(&key, late_mallocs), 0);
  void *m1 = qm_malloc(48), *m2 = qm_malloc(48);
  std::thread([&] {
    qm_free(qm_malloc(16));
    pthread_setspecific(key, (void *)1); // mallocs after its cache is gone
  }).join();
  pthread_key_delete(key);
  ASSERT_EQ(qmt_entry(late_chunks[0]).owner, 0u) << "no thread owns them";
  std::vector<void *> carried;
  unsigned u_id = 0, f_id = 0;
  std::thread([&] {
    qm_free(m1); // free-only: an id no chunk carries
    u_id = qmt_owner_id();
    qm_free(qm_malloc(0)); // no refill
    for (void *q : late_chunks)
      qm_free(q); // into its own bins
    for (int i = 0; i < 120; i++)
      carried.push_back(qm_malloc(40));
  }).join();
  size_t carry = 0;
  for (void *q : carried)
    carry += qmt_entry(q).owner == u_id;
  std::thread([&] {
    qm_free(m2);
    f_id = qmt_owner_id();
  }).join();
  for (void *q : carried)
    qm_free(q);
  ASSERT_GT(carry, 0u) << "the first free-only thread's id went onto chunks";
  EXPECT_NE(f_id, u_id) << "the next free-only thread took an id " << carry << " live chunks carry";
}

// A thread whose first act is to free what an exited thread allocated (a
// successor in a hand-off) takes that thread's id, though another exited
// later: the chunks are its own, freed as the owner frees them, not each
// sent to whichever thread took the id.
TEST(Primary, ASuccessorInheritsTheIdOfTheExitedOwnerItFreesFor) {
  if (!qmt_option("thread_cache") || qmt_option("guard_all") || qmt_cache_checked())
    GTEST_SKIP() << "no thread caches, guarded chunks, or checked mode";
  std::vector<void *> left;
  unsigned a_id = 0, c_id = 0, b_id = 0, state = 0;
  std::atomic<int> step{0};
  std::thread a([&] {
    for (int i = 0; i < 8; i++)
      left.push_back(qm_malloc(48));
    a_id = qmt_owner_id();
    step = 1;
    while (step != 2)
      std::this_thread::yield();
  });
  std::thread c([&] { // both live at once: two ids; c exits last, its id the first spare
    while (step != 1)
      std::this_thread::yield();
    qm_free(qm_malloc(48));
    c_id = qmt_owner_id();
    step = 2;
    while (step != 3)
      std::this_thread::yield();
  });
  a.join();
  step = 3;
  c.join();
  std::thread([&] {
    qm_free(left[0]);
    b_id = qmt_owner_id();
    state = qmt_entry(left[0]).state;
    for (size_t i = 1; i < left.size(); i++)
      qm_free(left[i]);
  }).join();
  ASSERT_NE(a_id, c_id);
  EXPECT_EQ(b_id, a_id);
  EXPECT_EQ(state, 2u) << "FREE at once: its own chunk";
}

// A thread that only frees takes back, as it frees, what other threads
// sent it: such a thread (one that took over an exited thread's id and
// its chunks, or a producer turned consumer) has no refill to take it at,
// and what others freed of its chunks stayed in use until it malloc'd or
// exited. Whether it frees its own chunks (the fast path's batch) or
// others' (the path that sends them; checked mode's paths too).
TEST(Primary, AThreadThatOnlyFreesTakesBackWhatOthersSentIt) {
  if (!qmt_option("thread_cache") || qmt_option("guard_all"))
    GTEST_SKIP() << "no thread caches, or guarded chunks";
  const int N = 1000, M = 200;
  for (int others = 0; others < 2; others++) {
    std::vector<void *> got, mine;
    size_t sent = 0; // sampled chunks are guarded ones: not sent
    for (int i = 0; i < M; i++)
      mine.push_back(qm_malloc(1000));
    std::atomic<int> step{0};
    unsigned b_id = 0;
    std::thread b([&] {
      for (int i = 0; i < N + M; i++)
        got.push_back(qm_malloc(1000));
      b_id = qmt_owner_id();
      step = 1;
      while (step != 2)
        std::this_thread::yield();
      for (int i = 0; i < M; i++) // no malloc, no refill
        qm_free(others ? mine[i] : got[N + i]);
      step = 3;
      while (step != 4)
        std::this_thread::yield();
    });
    while (step != 1)
      std::this_thread::yield();
    for (int i = 0; i < N; i++) { // sent to b
      sent += !qmt_is_guarded(got[i]);
      qm_free(got[i]);
    }
    qm_malloc_trim(0); // this thread's outbox out
    size_t waiting = qmt_inbox_waiting(b_id);
    step = 2;
    while (step != 3)
      std::this_thread::yield();
    size_t left = qmt_inbox_waiting(b_id);
    step = 4;
    b.join();
    if (!others)
      for (int i = 0; i < M; i++)
        qm_free(mine[i]);
    ASSERT_NE(b_id, 0u);
    EXPECT_EQ(waiting, sent) << "sent to b before it frees";
    EXPECT_EQ(left, 0u) << "of " << N << " frees sent to a thread that then freed " << M << " of "
                        << (others ? "another thread's" : "its own") << " chunks";
  }
}

// Two frees of one chunk on a thread that does not own it: the first makes
// it SENT at once, the second reports at once.
TEST(PrimaryDeathTest, ASecondFreeOnAnotherThreadIsReportedAtOnce) {
  void *p = qm_malloc(48);
  EXPECT_DEATH(std::thread([&] {
                 qm_free(p);
                 qm_free(p);
               }).join(),
               "^" QM_LINE_OF(QM_K_DOUBLE_FREE, "small chunk, 48 bytes") "\n" QM_END);
}

// An overflow past a chunk another thread frees: its canary is checked
// before the chunk goes back to its owner (within 16 frees on that thread,
// or at its exit), so it is reported, never handed out again.
TEST(PrimaryDeathTest, AnOverflowIsCaughtAtAFreeOnAnotherThread) {
  unsigned char *p = static_cast<unsigned char *>(qm_malloc(40));
  std::vector<void *> others;
  for (int i = 0; i < 64; i++)
    others.push_back(qm_malloc(40));
  // the overflow in the death test's child only: a broken canary left in
  // this process would be reported at the free of a neighbour by a later
  // test under hardening=max
  EXPECT_DEATH(
      {
        p[42] = 'x';
        std::thread([&] {
          qm_free(p);
          for (void *q : others)
            qm_free(q);
        }).join();
      },
      "^" QM_LINE(QM_K_SMALL_OVERFLOW, "40 bytes, written past the end at offset 42") "\n" QM_END);
  qm_free(p);
  for (void *q : others)
    qm_free(q);
}

// The same on the main thread, which has no exit hook: its last frees of
// other threads' chunks are checked when the program ends.
TEST(PrimaryDeathTest, AnOverflowFreedOnTheMainThreadIsCaughtAtExit) {
  EXPECT_DEATH(
      {
        qm_free(qm_malloc(8)); // this thread's id
        std::atomic<unsigned char *> p{nullptr};
        std::thread([&] { // its owner lives on: the free is sent, not adopted
          p = static_cast<unsigned char *>(qm_malloc(40));
          for (;;)
            pause();
        })
            .detach();
        while (!p)
          std::this_thread::yield();
        p[42] = 'x';
        qm_free(p);
        exit(0);
      },
      "^" QM_LINE(QM_K_SMALL_OVERFLOW, "40 bytes, written past the end at offset 42") "\n" QM_END);
}

bool groups_apply() {
  // no caches, or no small chunks: every thread takes from the same lists
  return qmt_option("thread_cache") && !qmt_option("guard_all");
}

// A thread's cache gives back to and takes from its own group's stack, so
// the chunks one thread handed back are not what a thread of another group
// gets while they are few: carving keeps two threads' chunks out of each
// other's cache lines. (One shared stack gave the second thread all of them.)
TEST(Primary, ChunksAThreadGaveBackStayWithItsGroup) {
  if (!groups_apply())
    GTEST_SKIP() << "no thread caches or guard_all=1";
  const size_t size = 1000, n = qmt_steal_min_chunks(size) / 2;
  std::set<void *> freed;
  std::atomic<int> step{0};
  unsigned ga = 0, gb = 0;
  size_t overlap = 0;
  std::thread a([&] {
    // first what earlier tests left in its group's stack, held until the
    // end, then n chunks freed at once: its stack holds at most those
    std::vector<void *> hold;
    hold.push_back(qm_malloc(size));
    ga = qmt_thread_group();
    while (qmt_group_free(size, ga) && hold.size() < 100000)
      hold.push_back(qm_malloc(size));
    std::vector<void *> v(n);
    for (void *&p : v)
      freed.insert(p = qm_malloc(size));
    for (void *p : v)
      qm_free(p);
    qmt_flush_thread_cache(); // to its group's stack
    step = 1;
    while (step != 2)
      std::this_thread::yield();
    for (void *p : hold)
      qm_free(p);
  });
  while (step != 1)
    std::this_thread::yield();
  std::thread b([&] {
    std::vector<void *> v(n);
    for (void *&p : v)
      overlap += freed.count(p = qm_malloc(size));
    gb = qmt_thread_group();
    for (void *p : v)
      qm_free(p);
  });
  b.join();
  step = 2;
  a.join();
  ASSERT_NE(ga, gb) << "a thread's cache joins the group with the fewest live caches";
  EXPECT_EQ(overlap, 0u);
}

// ... and once a group holds many, another takes them before it carves
// more, so a thread that only frees what others allocate leaves no pile
// that grows without bound.
TEST(Primary, AnotherGroupTakesAPileBeforeCarving) {
  if (!groups_apply())
    GTEST_SKIP() << "no thread caches or guard_all=1";
  if (qmt_option("free_delay"))
    GTEST_SKIP() << "free_delay: the exited thread's last frees wait out their delay first";
  const size_t size = 1000, steal_min = qmt_steal_min_chunks(size), n = 4 * steal_min;
  std::thread a([&] {
    std::vector<void *> v(n);
    for (void *&p : v)
      p = qm_malloc(size);
    for (void *p : v)
      qm_free(p);
  }); // its exit hands its cache back to its group's stack
  a.join();
  size_t carved = 0;
  std::thread b([&] {
    std::vector<void *> v(n);
    size_t before = qmt_small_carved();
    for (void *&p : v)
      p = qm_malloc(size);
    carved = qmt_small_carved() - before;
    for (void *p : v)
      qm_free(p);
  });
  b.join();
  // b carves only once a's pile is down to steal_min (its cache takes 16
  // chunks of this class at a time); without taking it, all n
  EXPECT_LE(carved, (steal_min + 32) * (size + 16 + 32));
}

// Two threads of different groups, carving by turns and then taking what
// the other's group holds, never hold chunks whose table entries share a
// line: every malloc and free writes its chunk's entry, and a shared line
// moved between their cores at every op (34-38% of the lines in use in
// two-thread small churn, which ran no faster than one thread). Own
// process (unit-table-lines).
TEST(Primary, TwoGroupsChunksNeverShareATableLine) {
  if (!groups_apply())
    GTEST_SKIP() << "no thread caches or guard_all=1";
  const size_t size = 600, n = 4 * qmt_steal_min_chunks(size);
  std::vector<void *> va, vb;
  std::atomic<int> turn{0};
  unsigned ga = 0, gb = 0;
  // by turns, a few chunks at a time: their caches take from the class's
  // central list alternately (a take is under 64 chunks in this class)
  auto run = [&](int me, std::vector<void *> &v, unsigned &g) {
    for (int round = 0; round < 40; round++) {
      while (turn % 2 != me)
        std::this_thread::yield();
      for (int i = 0; i < 30; i++)
        v.push_back(qm_malloc(size));
      turn++;
    }
    g = qmt_thread_group();
  };
  std::thread a(run, 0, std::ref(va), std::ref(ga));
  std::thread b(run, 1, std::ref(vb), std::ref(gb));
  a.join();
  b.join();
  ASSERT_NE(ga, gb);
  std::set<uintptr_t> la;
  for (void *p : va)
    la.insert(qmt_entry_line(p));
  la.erase(0); // sampled chunks (sample_rate=0 in its process, though)
  size_t shared = 0;
  for (void *p : vb)
    shared += la.count(qmt_entry_line(p));
  EXPECT_EQ(shared, 0u) << "carved by turns";
  for (void *p : va)
    qm_free(p);
  for (void *p : vb)
    qm_free(p);
  // a pile in one group past steal_min, part of it back in use by its
  // thread; a thread of another group takes from the pile: whole lines only
  std::vector<void *> live_a(200), got(2 * n);
  std::atomic<int> step{0};
  unsigned g1 = 0, g2 = 0;
  std::thread a2([&] {
    std::vector<void *> pile(n);
    for (void *&p : pile)
      p = qm_malloc(size);
    for (void *p : pile)
      qm_free(p);
    qmt_flush_thread_cache(); // to its group's pile
    for (void *&p : live_a)
      p = qm_malloc(size);
    g1 = qmt_thread_group();
    step = 1;
    while (step != 2)
      std::this_thread::yield();
  });
  while (step != 1)
    std::this_thread::yield();
  std::thread b2([&] {
    for (void *&p : got)
      p = qm_malloc(size);
    g2 = qmt_thread_group();
  });
  b2.join();
  std::set<uintptr_t> lines_a;
  for (void *p : live_a)
    lines_a.insert(qmt_entry_line(p));
  lines_a.erase(0);
  shared = 0;
  for (void *p : got)
    shared += lines_a.count(qmt_entry_line(p));
  step = 2;
  a2.join();
  ASSERT_NE(g1, g2);
  EXPECT_EQ(shared, 0u) << "taken from another group's pile";
  for (void *p : got)
    qm_free(p);
  for (void *p : live_a)
    qm_free(p);
}

// A thread that starts once another has exited joins, among the groups with
// the fewest live caches, the one holding the most free memory: it takes
// over its predecessor's chunks instead of carving while they sit idle (a
// server handing its work to a new thread; going round the groups left
// each predecessor's chunks idle and the hand-off bench's RSS 30% above
// jemalloc's).
TEST(Primary, ASuccessorThreadJoinsTheGroupItsPredecessorLeftMemoryIn) {
  if (!groups_apply())
    GTEST_SKIP() << "no thread caches or guard_all=1";
  const size_t size = 1000, n = 20000; // 20 MB: more than earlier tests left idle
  unsigned ga = 0, gb = 0;
  std::thread a([&] {
    std::vector<void *> v(n);
    for (void *&p : v)
      p = qm_malloc(size);
    ga = qmt_thread_group();
    for (void *p : v)
      qm_free(p);
  }); // its exit hands its cache back to its group's stack
  a.join();
  std::thread b([&] {
    void *p = qm_malloc(size);
    gb = qmt_thread_group();
    qm_free(p);
  });
  b.join();
  EXPECT_EQ(gb, ga);
}

TEST(Primary, ThreadExitHandsItsCacheBack) {
  if (!qmt_option("thread_cache"))
    GTEST_SKIP() << "thread_cache=0: no caches to hand back";
  qm_stats_t before, during, after;
  qm_stats(&before);
  std::atomic<bool> go{false};
  std::thread t([&] {
    std::vector<void *> v;
    for (int i = 0; i < 5000; i++)
      v.push_back(qm_malloc(64));
    for (void *p : v)
      qm_free(p);
    qm_stats(&during);
    go = true;
  });
  t.join();
  qm_stats(&after);
  EXPECT_EQ(during.threads, before.threads + 1);
  EXPECT_EQ(after.threads, before.threads);
  // nothing leaked: what the thread allocated is free again
  EXPECT_LE(after.small_in_use, before.small_in_use + 4096);
}

// An exiting thread's bins stay with its registration (up to a bound). A
// successor that inherits its id (its first act frees a chunk the exited
// thread allocated) takes them as they are: no chunk is checked into the
// central lists at the exit and out again at the successor's first
// mallocs. Any other thread that takes the registration gives them to the
// central lists first (layout-handoff measures what that keeps).
// malloc_trim gives back what is kept.
TEST(Primary, ASuccessorTakesTheExitedThreadsBinsWithItsId) {
  if (!qmt_option("thread_cache"))
    GTEST_SKIP() << "thread_cache=0: no bins";
  if (qmt_option("free_delay") || qmt_option("guard_all") || qmt_option("zero_on_free"))
    GTEST_SKIP() << "checked mode (no thread inherits an id there), free_delay or guard_all";
  const size_t size = 200, n = 40; // fewer than the class's bin holds
  for (int inherit = 1; inherit >= 0; inherit--) {
    qm_malloc_trim(0); // what earlier threads left
    ASSERT_EQ(qmt_spare_bytes(), 0u);
    std::set<void *> freed;
    void *handed = nullptr;
    std::thread a([&] {
      handed = qm_malloc(size); // live at a's exit, freed by b
      std::vector<void *> v(n);
      for (void *&p : v)
        if (!qmt_is_guarded(p = qm_malloc(size))) // a sampled one is no bin's
          freed.insert(p);
      for (void *p : v)
        qm_free(p);
    });
    a.join();
    size_t kept = qmt_spare_bytes();
    EXPECT_GE(kept, freed.size() * size);
    size_t got = 0, left = 0, binned = 0, central = 0;
    std::thread b([&] {
      void *first = nullptr;
      if (inherit)
        qm_free(handed); // b's first act: it inherits a's id
      else
        first = qm_malloc(4 * size); // another class: b's cache, a's registration
      binned = qmt_bin_count(qmt_class_of(size));
      central = qmt_group_free(size, qmt_thread_group());
      left = qmt_spare_bytes();
      std::vector<void *> v(2 * n); // past what a's bin held
      for (void *&p : v)
        got += freed.count(p = qm_malloc(size));
      for (void *p : v)
        qm_free(p);
      if (!inherit)
        qm_free(handed);
      qm_free(first);
    });
    b.join();
    EXPECT_EQ(left, 0u) << "b took a's registration and what it held";
    if (inherit) {
      EXPECT_GE(binned, freed.size()) << "a's bin is b's";
      EXPECT_EQ(got, freed.size()) << "b's first mallocs drew every chunk a freed from it";
    } else {
      EXPECT_EQ(binned, 0u) << "b never draws from the bins of a thread it does not succeed";
      EXPECT_GE(central, freed.size()) << "a's bins went to the central lists";
    }
    EXPECT_GT(qmt_spare_bytes(), 0u) << "b's exit kept its own";
  }
  qm_malloc_trim(0);
  EXPECT_EQ(qmt_spare_bytes(), 0u);
}

// A signal handler's free that lands in mallinfo2 (qm_stats: the registry
// and class locks) on a thread with no cache yet: it takes the nested path.
// Unmarked, the free made the thread's cache and waited for the registry
// lock the interrupted call held (6 trials of 300 in the default profile).
static void *stats_victim;
static std::atomic<bool> stats_freed;
static void free_victim(int) {
  qm_free(stats_victim);
  stats_freed = true;
}
TEST(Primary, AHandlersFreeInsideStatsDoesNotWaitForItsLocks) {
  // qemu-user: 1 run in 3 of the deferred-free test hung there (main and
  // the signalled thread both waiting on the large side's lock word; never
  // natively, 30 of 30 runs and every suite); the hook tests cover the
  // same windows under emulation
  QMT_SKIP_IF_EMULATED("real signals at a thread in emulated lock waits");
  struct sigaction sa = {}, old = {};
  sa.sa_handler = free_victim;
  ASSERT_EQ(sigaction(SIGRTMIN + 3, &sa, &old), 0);
  for (int i = 0; i < 200; i++) {
    stats_victim = qm_malloc(40);
    stats_freed = false;
    std::atomic<bool> done{false};
    std::thread t([&] {
      size_t sink = 0;
      while (!stats_freed)
        sink += qm_mallinfo2().arena;
      done = true;
      (void)sink;
    });
    usleep(200 + i % 7 * 37);
    pthread_kill(t.native_handle(), SIGRTMIN + 3);
    for (int ms = 0; ms < 3000 && !done; ms++)
      usleep(1000);
    if (!done) {
      t.detach();
      FAIL() << "trial " << i << ": the thread in mallinfo2 waits for good";
    }
    t.join();
  }
  sigaction(SIGRTMIN + 3, &old, nullptr);
}

// The same for the calls outside malloc's slow path that take the large
// side's lock: a large calloc, aligned_alloc and realloc (a shrink to a
// small chunk included), malloc_usable_size and sized frees. Marked busy, a
// handler's free of a large chunk landing in them is deferred; unmarked, it
// waited for good on the lock the interrupted call held (the calloc and
// aligned_alloc hung within seconds so; the realloc's shrink 1 run in 10,
// on its lookup: Api.EveryCallTakesItsLocksMarkedBusy holds every call to
// it without signals).
static void *volatile large_slot;
static void free_large_slot(int) {
  void *p = large_slot;
  large_slot = nullptr;
  qm_free(p);
}
TEST(Primary, AHandlersFreeInsideALargeCallOtherThanMallocDoesNotWaitForItsLock) {
  QMT_SKIP_IF_EMULATED("real signals at a thread in emulated lock waits");
  struct sigaction sa = {}, old = {};
  sa.sa_handler = free_large_slot;
  ASSERT_EQ(sigaction(SIGRTMIN + 4, &sa, &old), 0);
  std::atomic<bool> done{false}, quit{false};
  std::thread t([&] {
    void *r = nullptr;
    for (long i = 0; i < 60000; i++) {
      // 100,000 to 175,000 bytes: the realloc moves between large and
      // small chunks (below 128 KiB)
      size_t n = 100000 + (size_t)i % 50000;
      void *p = i % 3 == 0   ? qm_calloc(1, n)
                : i % 3 == 1 ? qm_aligned_alloc(4096, n)
                             : (r = qm_realloc(r, n + 4096 * (size_t)(i % 7)));
      if (i % 3 == 2)
        continue;
      if (qm_malloc_usable_size(p) < n)
        ADD_FAILURE() << "usable size below the request";
      if (!large_slot)
        large_slot = p;
      else if (i % 3 == 0)
        qm_free_sized(p, n);
      else
        qm_free(p);
    }
    qm_free(r);
    done = true;
    while (!quit)
      std::this_thread::yield();
  });
  for (int ms = 0; ms < 20000 && !done; ms++)
    for (int k = 0; k < 10 && !done; k++) {
      pthread_kill(t.native_handle(), SIGRTMIN + 4);
      usleep(100);
    }
  bool finished = done;
  quit = true;
  if (!finished) {
    t.detach();
    FAIL() << "the thread in a large call waits for good";
  }
  t.join();
  qm_free(large_slot);
  large_slot = nullptr;
  sigaction(SIGRTMIN + 4, &old, nullptr);
}

// A handler's free landing in malloc's or free's fast path is deferred,
// and the fast path leaves its mark without looking: a thread that then
// only frees its own small chunks applied it at no refill, and a large
// chunk so freed stayed in use as long. It is applied at the next batch
// of parked frees (in checked mode, the next free; with no thread cache,
// the next free too).
TEST(Primary, AFreeAHandlerDeferredInAFastPathIsAppliedByLaterFrees) {
  std::atomic<int> step{0};
  std::thread t([&] {
    std::vector<void *> small;
    for (int i = 0; i < 64; i++)
      small.push_back(qm_malloc(48));
    void *large = qm_malloc(300000);
    step = 1;
    while (step != 2)
      std::this_thread::yield();
    qmt_free_in_fast_path(large);
    step = 3;
    while (step != 4)
      std::this_thread::yield();
    for (void *p : small)
      qm_free(p);
    step = 5;
    while (step != 6) // its exit applies it too
      std::this_thread::yield();
  });
  auto large_live = [] {
    qm_stats_t s;
    qm_stats(&s);
    return s.large_live_chunks;
  };
  while (step != 1)
    std::this_thread::yield();
  size_t before = large_live();
  step = 2;
  while (step != 3)
    std::this_thread::yield();
  EXPECT_EQ(large_live(), before) << "deferred, not applied inside the fast path";
  step = 4;
  while (step != 5)
    std::this_thread::yield();
  EXPECT_EQ(large_live(), before - 1) << "the deferred free of a large chunk is applied once the "
                                         "thread has freed 64 small chunks";
  step = 6;
  t.join();
}

// The frees a handler's free deferred there (the thread marked busy) are
// applied before mallinfo2 returns: on a thread that never mallocs there
// is no refill to apply them at, and a large chunk freed so stayed in use.
TEST(Primary, AHandlersFreeDeferredInsideStatsIsAppliedWhenItReturns) {
  // qemu-user: 1 run in 3 of the deferred-free test hung there (main and
  // the signalled thread both waiting on the large side's lock word; never
  // natively, 30 of 30 runs and every suite); the hook tests cover the
  // same windows under emulation
  QMT_SKIP_IF_EMULATED("real signals at a thread in emulated lock waits");
  struct sigaction sa = {}, old = {};
  sa.sa_handler = free_victim;
  ASSERT_EQ(sigaction(SIGRTMIN + 3, &sa, &old), 0);
  int left = 0;
  for (int i = 0; i < 50; i++) {
    stats_victim = qm_malloc(200000); // a large chunk: freed where the handler's free is applied
    qm_stats_t before;
    qm_stats(&before);
    stats_freed = false;
    std::thread t([&] {
      size_t sink = 0;
      while (!stats_freed)
        sink += qm_mallinfo2().arena;
      (void)sink;
    });
    usleep(200 + i % 7 * 37);
    pthread_kill(t.native_handle(), SIGRTMIN + 3);
    t.join();
    qm_stats_t after;
    qm_stats(&after);
    left += after.large_live_chunks != before.large_live_chunks - 1;
  }
  sigaction(SIGRTMIN + 3, &old, nullptr);
  EXPECT_EQ(left, 0) << "of 50 large chunks freed by a handler inside mallinfo2";
}

// A handler's free landing after the leaving call's last look at the
// deferred frees and before its mark is cleared is deferred too: the look
// is made again once the mark is clear (it stayed in use, 1 trial of 50 of
// the test above under qemu-user). The hook runs there, as the handler
// would.
static void leaving_frees() {
  qmt_set_leaving_hook(nullptr); // once
  free_victim(0);
}
TEST(Primary, AHandlersFreeAsStatsLeavesItsMarkIsApplied) {
  for (int trim = 0; trim < 2; trim++) {
    stats_victim = qm_malloc(200000);
    qm_stats_t before, after;
    qm_stats(&before);
    std::thread t([&] {
      qmt_set_leaving_hook(leaving_frees);
      if (trim)
        qm_malloc_trim(0);
      else
        (void)qm_mallinfo2();
    });
    t.join();
    qm_stats(&after);
    EXPECT_EQ(after.large_live_chunks, before.large_live_chunks - 1)
        << (trim ? "malloc_trim" : "mallinfo2") << " left the handler's free deferred";
  }
}

// A free of a large chunk, and realloc's move of one, apply what handlers
// deferred as they leave; by then the chunk is back in the heap and another
// thread's malloc may have its address: the mark they apply under is a
// plain busy one, not the pointer's (a handler's free of that other
// thread's chunk was reported as a double free of the freed one).
static uintptr_t mark_seen;
static void leaving_reads_mark() {
  qmt_set_leaving_hook(nullptr); // once
  mark_seen = qmt_freeing_mark();
}
TEST(Primary, WhatAFreeOfALargeChunkAppliesAsItLeavesIsNotUnderItsMark) {
  std::thread t([] {
    for (int realloc_move = 0; realloc_move < 2; realloc_move++) {
      void *p = qm_malloc(200000);
      mark_seen = 0;
      qmt_set_leaving_hook(leaving_reads_mark);
      if (realloc_move)
        qm_free(qm_realloc(p, 50000000)); // moved: too large to grow in place
      else
        qm_free(p);
      qmt_set_leaving_hook(nullptr);
      EXPECT_EQ(mark_seen, (uintptr_t)1) << (realloc_move ? "realloc" : "free") << " of " << p;
    }
  });
  t.join();
}

// The same as a free past the fast path leaves its mark: on a thread with
// no cache (thread_cache=0, or no id left) it is the last place such a
// thread looks, with no exit hook after it, and a handler's free landing
// after its look stayed deferred for good (a large chunk in use, a second
// free of it unreported). It looks again once the mark is clear.
TEST(Primary, AHandlersFreeAsAFreeLeavesItsMarkIsApplied) {
  stats_victim = qm_malloc(200000);
  stats_freed = false;
  qm_stats_t before, after;
  qm_stats(&before);
  void *remote = qm_malloc(64);
  std::thread t([remote] {
    qm_free(qm_malloc(64));
    // its next leave: this free's with no cache or in checked mode (the
    // thread's last call), else its exit hook's (parked remote frees)
    qmt_set_leaving_hook(leaving_frees);
    qm_free(remote); // another thread's: past the fast path
  });
  t.join();
  qmt_set_leaving_hook(nullptr);
  ASSERT_TRUE(stats_freed);
  qm_stats(&after);
  EXPECT_EQ(after.large_live_chunks, before.large_live_chunks - 1)
      << "a large chunk freed by a handler as a free left its mark";
}

// The side that frees a zero-size, sampled or large chunk turns the mark
// naming it into a plain busy one as it makes the chunk the heap's, under
// its lock: after that, and before the free returns (a munmap, say),
// another thread's malloc may have the address, and a handler's free of
// that chunk was reported as a second free of this one (the review's
// stale_storm: every run with the quarantine off).
TEST(Primary, AFreeMarkedWithItsPointerLeavesAPlainMarkOnceTheChunkIsTheHeaps) {
  void *sampled = nullptr;
  std::vector<void *> plain;
  for (int i = 0; i < 100000 && !sampled; i++) {
    void *p = qm_malloc(100);
    if (qmt_is_guarded(p))
      sampled = p;
    else
      plain.push_back(p);
  }
  for (void *p : plain)
    qm_free(p);
  void *kinds[] = {qm_malloc(0), qm_malloc(300000), qm_malloc(20000000), sampled};
  for (void *p : kinds) {
    if (p) {
      EXPECT_EQ(qmt_free_marked(p), (uintptr_t)1) << p;
    }
  }
}

// The same for a small chunk that a free past the fast path puts where
// another thread may take it before the free returns (the central lists
// with no thread cache, its owner in checked mode): the review's
// small_storm under thread_cache=0 reported a double free within 50 ms.
TEST(Primary, ASmallChunkGivenAwayIsNotNamedByTheMarkAsItsFreeLeaves) {
  void *remote = qm_malloc(64);
  mark_seen = 0;
  std::thread t([remote] {
    qm_free(qm_malloc(64));
    qmt_set_leaving_hook(leaving_reads_mark); // this free's leave, or its exit's
    qm_free(remote);
  });
  t.join();
  qmt_set_leaving_hook(nullptr);
  EXPECT_NE(mark_seen, (uintptr_t)remote) << "the mark named the chunk given away";
  EXPECT_EQ(mark_seen, (uintptr_t)1);
}

// The same as a thread's exit hook leaves its mark: a handler's free
// deferred after the hook's drain was lost with the thread (a large chunk
// stayed in use for good, a small one SENT, and its second free went
// unreported). Applied as the hook leaves, through the closed path.
TEST(Primary, AHandlersFreeAsAThreadExitsIsApplied) {
  if (!qmt_option("thread_cache"))
    GTEST_SKIP() << "no thread has a cache, hence an exit hook";
  stats_victim = qm_malloc(200000);
  stats_freed = false;
  qm_stats_t before, after;
  qm_stats(&before);
  std::thread t([] {
    qm_free(qm_malloc(64));              // a cache, hence an exit hook
    qmt_set_leaving_hook(leaving_frees); // its next leave is the exit hook's
  });
  t.join();
  qmt_set_leaving_hook(nullptr);
  ASSERT_TRUE(stats_freed) << "the exit hook left its mark without looking";
  qm_stats(&after);
  EXPECT_EQ(after.large_live_chunks, before.large_live_chunks - 1)
      << "a large chunk freed by a handler as its thread exits";
}

// A signal handler's malloc that lands in the making of a thread's cache
// takes the central lists: made a second time, nested, the cache took a
// second registration, and the outer making then set its bins' counts over
// the nested one's slot arrays (the same chunks in a bin and in a central
// set: two mallocs returned one chunk). The hook runs where the handler
// would, after the bins are placed and before they are live.
static std::vector<void *> making_got;
static void making_mallocs() {
  qmt_set_making_hook(nullptr); // once
  for (int i = 0; i < 64; i++)
    making_got.push_back(qm_malloc(200));
}
TEST(Primary, AMallocInTheMakingOfACacheTakesTheCentralLists) {
  if (!qmt_option("thread_cache"))
    GTEST_SKIP() << "thread_cache=0: no caches to make";
  const size_t size = 200, n = 40;
  for (int inherit = 1; inherit >= 0; inherit--) {
    // exited threads' registrations keeping chunks of the class
    void *handed = nullptr;
    for (int t = 0; t < 2; t++)
      std::thread([&] {
        handed = qm_malloc(size);
        std::vector<void *> v(n);
        for (void *&p : v)
          p = qm_malloc(size);
        for (void *p : v)
          qm_free(p);
      }).join();
    making_got.clear();
    making_got.reserve(64);
    std::vector<void *> got(4 * n);
    qmt_set_making_hook(making_mallocs);
    std::thread([&] {
      // inherit: its successor, made in this free (in checked mode, which
      // inherits no id, at the first malloc); else any new thread
      if (inherit)
        qm_free(handed);
      for (void *&p : got)
        p = qm_malloc(size);
    }).join();
    qmt_set_making_hook(nullptr);
    ASSERT_EQ(making_got.size(), 64u);
    std::set<void *> all(making_got.begin(), making_got.end());
    for (void *p : got)
      EXPECT_TRUE(all.insert(p).second) << p << " handed out twice";
    EXPECT_EQ(all.size(), making_got.size() + got.size());
    for (void *p : all)
      qm_free(p);
    if (!inherit)
      qm_free(handed);
    qm_malloc_trim(0); // a chunk in two places: "given back twice"
  }
}

// What exited threads keep is bounded: many threads that exit together
// with full bins strand at most 4 MiB; the rest give theirs back at exit.
TEST(Primary, WhatExitedThreadsKeepIsBounded) {
  if (!qmt_option("thread_cache"))
    GTEST_SKIP() << "thread_cache=0: no bins";
  qm_malloc_trim(0);
  std::vector<std::thread> t;
  std::atomic<int> ready{0}, go{0};
  const int threads = 12;
  for (int i = 0; i < threads; i++)
    t.emplace_back([&] {
      // about 1 MiB in each bin's worth of every size up to 1 KiB
      std::vector<void *> v;
      for (size_t size = 16; size <= 1024; size += 16)
        for (int k = 0; k < 64; k++)
          v.push_back(qm_malloc(size));
      for (void *p : v)
        qm_free(p);
      ready++;
      while (!go)
        std::this_thread::yield();
    });
  while (ready != threads)
    std::this_thread::yield();
  go = 1;
  for (std::thread &x : t)
    x.join();
  size_t kept = qmt_spare_bytes();
  // checked mode keeps nothing (no thread inherits an id there)
  if (!qmt_option("free_delay") && !qmt_option("zero_on_free")) {
    EXPECT_GT(kept, 0u);
  }
  EXPECT_LE(kept, (size_t)4 << 20);
  qm_malloc_trim(0);
  EXPECT_EQ(qmt_spare_bytes(), 0u);
}

// n small chunks of `size` bytes, each written whole so its pages are resident.
std::vector<void *> written_chunks(size_t n, size_t size) {
  std::vector<void *> v(n);
  for (void *&p : v) {
    p = qm_malloc(size);
    std::memset(p, 7, size);
  }
  return v;
}

TEST(Primary, TrimGivesFreePagesBack) {
  constexpr size_t N = 64 * 1024; // 64 Ki chunks of 1 KiB: 64 MiB
  std::vector<void *> v = written_chunks(N, 1000);
  size_t full = rss_bytes();
  for (void *p : v)
    qm_free(p);
  EXPECT_EQ(qm_malloc_trim(0), 1);
  size_t trimmed = rss_bytes();
  EXPECT_LT(trimmed + (48u << 20), full) << full << " -> " << trimmed;
  qm_stats_t s;
  qm_stats(&s);
  EXPECT_GE(s.small_purged, 48u << 20);
  // the pages come back (zeroed) when used again
  for (size_t i = 0; i < N; i++)
    v[i] = qm_malloc(1000);
  for (void *p : v)
    qm_free(p);
}

// Resident bytes of qmalloc's metadata (its meta mappings, the state tables
// and the free sets' bitmaps). Their reserved parts are PROT_NONE: under
// qemu-user, which cannot be asked about those (qmt_resident_mapped), the
// readable parts only, where the lists and bitmaps grow.
size_t metadata_resident() {
  uintptr_t r[256][2];
  size_t n = qmt_metadata(r, 256), bytes = 0;
  for (size_t i = 0; i < n; i++)
    bytes += qmt_resident_mapped(reinterpret_cast<void *>(r[i][0]), r[i][1] - r[i][0]);
  return bytes;
}

// The central free lists keep a bit per chunk, not an address: a program
// that frees its many small objects at once (python3 at exit) gains no
// memory for the lists that hold them. With 8-byte addresses in batches,
// the 256 Ki chunks below took 2 MiB more. Own process (unit-free-lists):
// the other groups' words a give reads count as resident once those groups
// hold chunks of the class.
TEST(Primary, FreeListsTakeABitAChunk) {
  if (qmt_option("guard_all"))
    GTEST_SKIP() << "guard_all=1: every chunk in a guarded slot";
  constexpr size_t N = 256 * 1024; // 16 MiB of 64-byte chunks
  std::vector<void *> v(N);
  for (void *&p : v)
    p = qm_malloc(48);
  size_t before = metadata_resident();
  for (void *p : v)
    qm_free(p);
  qmt_flush_thread_cache();
  size_t after = metadata_resident();
  EXPECT_LT(after, before + N / 2) << before << " -> " << after; // 4 bits a chunk
}

// A refill takes the lowest free chunks of its class: after a program has
// freed its chunks in any order, the ones it allocates again gather at the
// low end of the region and the pages above are wholly free, for the purge
// to give back. Taken last-freed first, they were spread over every page.
// Measured from the RSS with every chunk in use: where the run is slow
// (ThreadSanitizer, a loaded machine), the release interval passes during
// the frees and the purge gives the pages back before malloc_trim does.
TEST(Primary, ChunksComeBackLowestFirst) {
  if (qmt_option("guard_all"))
    GTEST_SKIP() << "guard_all=1: every chunk in a guarded slot";
  constexpr size_t N = 64 * 1024; // 64 Ki chunks of 1 KiB: 64 MiB
  std::vector<void *> v = written_chunks(N, 1000);
  size_t full = rss_bytes();
  std::mt19937 rng(7);
  std::shuffle(v.begin(), v.end(), rng);
  for (void *p : v)
    qm_free(p);
  qmt_flush_thread_cache();
  for (size_t i = 0; i < N / 4; i++) {
    v[i] = qm_malloc(1000);
    std::memset(v[i], 7, 1000);
  }
  EXPECT_EQ(qm_malloc_trim(0), 1);
  size_t trimmed = rss_bytes();
  // the upper three quarters (48 MiB) are free pages
  EXPECT_LT(trimmed + (40u << 20), full) << full << " -> " << trimmed;
  for (size_t i = 0; i < N / 4; i++)
    qm_free(v[i]);
}

// A chunk given back to the central lists while it is there already (a
// cache holding it twice), or an address that is not a chunk of its class,
// is reported, never set as a bit of the free set.
TEST(PrimaryDeathTest, AChunkGivenBackTwiceIsReported) {
  if (qmt_option("guard_all") || qmt_cache_checked())
    GTEST_SKIP() << "guarded slots, or checked mode's delayed frees";
  void *p = qm_malloc(48);
  qm_free(p);
  qmt_flush_thread_cache();
  EXPECT_DEATH(qmt_central_give(p),
               "^" QM_LINE(QM_K_BAD_ENTRY, "chunk given back twice, class 64 bytes") "\n" QM_END);
  EXPECT_DEATH(qmt_central_give(static_cast<char *>(p) + 16),
               "^" QM_LINE(QM_K_BAD_ENTRY, "not a chunk of its class, class 64 bytes") "\n" QM_END);
}

// Run with release_interval_ms=0 (meson test "unit-purge"): free pages go
// back as the frees happen, with no malloc_trim.
TEST(PurgeEnv, FreePagesGoBackWithoutTrim) {
  ASSERT_EQ(qmt_option("release_interval_ms"), 0u);
  std::vector<void *> v = written_chunks(32 * 1024, 2000);
  size_t full = rss_bytes();
  for (void *p : v)
    qm_free(p);
  size_t after = rss_bytes();
  EXPECT_LT(after + (40u << 20), full) << full << " -> " << after;
}

} // namespace

// No writable metadata page is adjacent to anything: each metadata mapping
// (chunk addresses of free lists and caches, large-chunk records, the hash)
// has a PROT_NONE page on both sides, and so has the primary's reservation
// below its first class. Read from /proc/self/maps.
TEST(Primary, MetadataIsFencedByGuardPages) {
  void *small = qm_malloc(24), *large = qm_malloc(300000);
  uintptr_t r[64][2];
  size_t n = qmt_metadata(r, 64);
  ASSERT_GE(n, 3u) << "meta chunks, record table, hash table";
  size_t pg = qmt_page();
  for (size_t i = 0; i < n; i++) {
    char below[5], above[5];
    qmt_prot_of(reinterpret_cast<void *>(r[i][0] - pg), below);
    qmt_prot_of(reinterpret_cast<void *>(r[i][1]), above);
    EXPECT_STREQ(below, "---p") << "below metadata mapping " << i;
    EXPECT_STREQ(above, "---p") << "above metadata mapping " << i;
  }
  uintptr_t lo, hi;
  qmt_primary_span(&lo, &hi);
  char below[5];
  qmt_prot_of(reinterpret_cast<void *>(lo - pg), below);
  EXPECT_STREQ(below, "---p") << "below the first class region";
  qm_free(small);
  qm_free(large);
}

// The steering state of frees between threads (every owner's inbox, the
// spare message batches) is in a metadata mapping between guard pages, and
// the pointer to it sealed: not in writable data beside the library's.
TEST(Primary, SteeringStateIsInGuardedMetadata) {
  qm_free(qm_malloc(24));
  uintptr_t lo, hi;
  qmt_ro_range(&lo, &hi);
  uintptr_t r[64][2];
  size_t n = qmt_metadata(r, 64);
  // the owners' inboxes, the central lists, the committed counts
  for (unsigned which = 0; which < 3; which++) {
    uintptr_t at, s = qmt_steering_state(which, &at);
    ASSERT_NE(s, 0u) << which;
    EXPECT_TRUE(at >= lo && at < hi) << which << ": the pointer to it is sealed";
    bool in = false;
    for (size_t i = 0; i < n; i++)
      in |= s >= r[i][0] && s < r[i][1];
    EXPECT_TRUE(in) << which << ": in a metadata mapping (fenced by guard pages)";
  }
}

// Options, class table, keys and region bases are read-only once init is
// done: a write primitive cannot turn a check off or learn to forge keys.
TEST(Primary, GlobalStateIsReadOnly) {
  qm_free(qm_malloc(8)); // init done
  uintptr_t lo, hi;
  qmt_ro_range(&lo, &hi);
  ASSERT_LT(lo, hi);
  for (uintptr_t a = lo; a < hi; a += qmt_page()) {
    char prot[5];
    qmt_prot_of(reinterpret_cast<void *>(a), prot);
    EXPECT_STREQ(prot, "r--p") << "page " << (a - lo) / qmt_page();
  }
}

// The sealed section starts and ends on a 64 KiB boundary (QM_RO_ALIGN),
// a page boundary on 4, 16 and 64 KiB kernels alike, so sealing it changes
// no page of other data whatever page size the process runs with; and
// every range qmalloc gave the kernel, after small, aligned, large and
// guarded chunks, was whole pages of the page size it runs with.
TEST(Primary, SealedSectionAndMappingsFollowThePageSize) {
  std::vector<void *> keep;
  for (size_t n : {8ul, 100ul, 4000ul, 40000ul, 300000ul, 5000000ul})
    keep.push_back(qm_malloc(n));
  for (size_t a : {64ul, 4096ul, 16384ul, 65536ul})
    keep.push_back(qm_aligned_alloc(a, 3 * a));
  keep.push_back(qm_realloc(qm_malloc(200000), 900000));
  for (void *p : keep) {
    ASSERT_NE(p, nullptr);
    qm_free(p);
  }
  uintptr_t lo, hi;
  qmt_ro_range(&lo, &hi);
  EXPECT_EQ(lo % 65536, 0u) << "the sealed section's start";
  EXPECT_EQ(hi % 65536, 0u) << "the sealed section's end";
  EXPECT_EQ(qmt_lib_page(), static_cast<size_t>(getauxval(AT_PAGESZ))) << "qmalloc's page size";
  EXPECT_EQ(qmt_off_page_ranges(), 0u) << "ranges not whole pages of " << qmt_page() << " bytes";
}

TEST(PrimaryDeathTest, WritingTheSealedStateFaults) {
  qm_free(qm_malloc(8));
  EXPECT_EXIT(qmt_poke_options(), ::testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT(qmt_poke_class_key(), ::testing::KilledBySignal(SIGSEGV), "");
}

// hardening=max (its own process, unit-max): a thread's ring of delayed
// frees of a class holds 2 * free_delay chunks; freeing more with no malloc
// between pushes the oldest out early, one for each chunk past that, and
// counts them. The mallocs first tick the class's clock past free_delay, so
// the ring starts empty; sampled chunks (guarded slots) never enter it.
TEST(MaxDelay, AFullRingPushesItsOldestOutEarly) {
  size_t d = qmt_option("free_delay");
  ASSERT_GE(d, 256u);
  std::vector<void *> v(2 * d + 100);
  for (void *&p : v)
    p = qm_malloc(48);
  size_t delayed = 0;
  for (void *p : v)
    delayed += !qmt_is_guarded(p);
  ASSERT_GT(delayed, 2 * d);
  size_t early = qmt_delay_early();
  for (void *p : v)
    qm_free(p);
  EXPECT_EQ(qmt_delay_early() - early, delayed - 2 * d);
}

// hardening=max: what the delay holds is bounded in bytes, free_delay_kb
// for one thread's rings of every class and again for the limbo of exited
// threads' frees: 1000 chunks of 16,000 bytes (16 MB; one class's ring alone
// takes 2 * free_delay = 512 of them, 8 MiB) freed with no malloc between
// leave at most that held, the rest back in use early and counted. Below
// the budget nothing leaves early for it. In fresh threads: their rings
// start empty, and no earlier test used these classes.
TEST(MaxDelay, WhatTheDelayHoldsIsBoundedInBytes) {
  size_t budget = qmt_option("free_delay_kb") << 10;
  ASSERT_GE(budget, 64u << 10);
  // twice, in two classes (the second thread adopts none of the first's):
  // its rings join the first's in the limbo
  for (size_t n : {16000, 24000})
    std::thread([&] {
      size_t size = qmt_class_chunk_size(qmt_class_of(n));
      size_t few = budget / 2 / size; // half the budget
      std::vector<void *> v(1000);
      ASSERT_LT(budget / size, v.size() / 2) << "free_delay_kb is set too high for this test";
      size_t delayed = 0; // guarded slots are quarantined, not delayed
      for (void *&p : v)
        delayed += !qmt_is_guarded(p = qm_malloc(n));
      size_t over = qmt_delay_over();
      for (size_t i = 0; i < few; i++)
        qm_free(v[i]);
      EXPECT_EQ(qmt_delay_over(), over) << "below the budget";
      EXPECT_LE(qmt_delay_bytes(), budget);
      for (size_t i = few; i < v.size(); i++) {
        qm_free(v[i]);
        ASSERT_LE(qmt_delay_bytes(), budget) << "after " << i + 1 << " frees";
      }
      EXPECT_GE(qmt_delay_bytes(), budget / 2); // bounded, not emptied
      EXPECT_GE(qmt_delay_over(), over + delayed - budget / size) << "the rest left early";
    }).join();
  // the threads' rings went to the limbo at their exits: bounded the same
  // way (each brought at least half the budget)
  EXPECT_LE(qmt_limbo_bytes(), budget);
  EXPECT_GT(qmt_limbo_bytes(), 0u);
}

// hardening=max: a thread kept at free_delay_kb by one class (a window of
// 4 KiB buffers: 5 KiB chunks, 256 of them are 1.25 MiB) still gives
// every other class its whole delay: 48-byte chunks come back only after
// free_delay later mallocs of their class. When the freeing class let its
// own oldest go at the budget, they came back after 65.
TEST(MaxDelay, AClassThatKeepsTheThreadAtTheBudgetLeavesOthersTheirDelay) {
  size_t d = qmt_option("free_delay");
  ASSERT_GE(d, 256u);
  long shortest = -1, reuses = 0;
  std::thread([&] {
    std::vector<void *> big(64, nullptr), small(512, nullptr);
    std::vector<std::pair<uintptr_t, long>> freed_at; // 48-byte chunk, malloc count at its free
    long mallocs = 0;
    for (size_t step = 0; step < 6000; step++) {
      size_t b = step % big.size(), s = step % small.size();
      qm_free(big[b]);
      big[b] = qm_malloc(4096);
      if (small[s] && !qmt_is_guarded(small[s]))
        freed_at.emplace_back((uintptr_t)small[s], mallocs);
      qm_free(small[s]);
      small[s] = qm_malloc(48);
      mallocs++;
      for (size_t i = freed_at.size(); i-- > 0;)
        if (freed_at[i].first == (uintptr_t)small[s]) {
          long k = mallocs - freed_at[i].second - 1;
          shortest = shortest < 0 || k < shortest ? k : shortest;
          reuses++;
          freed_at.erase(freed_at.begin() + (long)i);
          break;
        }
      if (freed_at.size() > 4 * d) // never to come back within the window
        freed_at.erase(freed_at.begin());
      if (step % 1000 == 999) {
        EXPECT_TRUE(qmt_delay_counts_agree()) << "the scan's counts, step " << step;
      }
    }
    for (void *p : big)
      qm_free(p);
    for (void *p : small)
      qm_free(p);
    EXPECT_TRUE(qmt_delay_counts_agree()) << "the scan's counts, at the end";
  }).join();
  ASSERT_GT(reuses, 1000) << "the churn reused its 48-byte chunks";
  EXPECT_GE(shortest, (long)d) << "a 48-byte chunk came back " << shortest
                               << " mallocs after its free";
}

// hardening=max's delayed reuse wherever a chunk is freed and whenever its
// thread ends (unit-max, and unit-max-no-thread-cache where no thread has a
// cache): mallocs of the chunk's class, all kept, until the chunk comes
// back; it must not before free_delay of them, and must come back at last
// (a chunk held forever would be a leak, not a delay).
static size_t mallocs_until_back(void *x, size_t n) {
  size_t d = qmt_option("free_delay"), i = 0;
  std::vector<void *> kept;
  for (; i < 64 * d; i++) {
    void *p = qm_malloc(n);
    kept.push_back(p);
    if (p == x)
      break;
  }
  for (void *p : kept)
    qm_free(p);
  return i;
}

// x (n bytes, freed) comes back after at least d mallocs of its class, and
// does come back
static void expect_delayed(void *x, size_t n, size_t d) {
  size_t k = mallocs_until_back(x, n);
  EXPECT_GE(k, d) << n << " bytes: back after " << k << " mallocs";
  EXPECT_LT(k, 64 * d) << n << " bytes: never came back";
  EXPECT_TRUE(qmt_delay_counts_agree()) << "the scan's counts, after chunks adopted and aged";
}

static void *unguarded_malloc(size_t n) {
  void *p;
  while (qmt_is_guarded(p = qm_malloc(n)))
    ; // a guarded slot is quarantined, not delayed
  return p;
}

// hardening=max: a live thread's first early releases for free_delay_kb
// are in the count other threads read (stats, stats_at_exit), not only
// once it has made 1024 of them or exited.
TEST(MaxDelay, ALiveThreadsFirstEarlyReleasesAreCounted) {
  size_t budget = qmt_option("free_delay_kb") << 10, n = 16000;
  size_t size = qmt_class_chunk_size(qmt_class_of(n));
  size_t before = qmt_delay_over(), seen = 0;
  std::atomic<int> step{0};
  std::thread t([&] {
    std::vector<void *> v;
    for (size_t i = 0; i < budget / size + 8; i++)
      v.push_back(unguarded_malloc(n));
    for (void *p : v)
      qm_free(p); // the last few go past the budget
    step = 1;
    while (step != 2)
      std::this_thread::yield();
  });
  while (step != 1)
    std::this_thread::yield();
  seen = qmt_delay_over();
  step = 2;
  t.join();
  EXPECT_GT(seen, before) << "read while the thread lives";
}

// A thread frees a chunk and exits at once: what its ring held waits out
// its delay in the central limbo, not in the lists the next refill takes
// from (before: back after 22-64 mallocs of another thread).
TEST(MaxDelayAcross, ThreadExit) {
  size_t d = qmt_option("free_delay");
  ASSERT_GE(d, 256u);
  for (size_t n : {48ul, 200ul, 3000ul}) {
    void *x = nullptr;
    std::thread([&] {
      x = unguarded_malloc(n);
      qm_free(x);
    }).join();
    expect_delayed(x, n, d);
  }
}

// The limbo filled to free_delay_kb by one class (an exited thread's frees
// of a size nobody mallocs again): another thread's exited free of another
// class still waits out its delay there, the full class making room. It
// came back at once before (the limbo let only the freeing class's own go).
// In its own process (delay-limbo), so that the limbo starts empty.
TEST(DelayLimbo, OneClassFillingItStillDelaysAnother) {
  size_t d = qmt_option("free_delay"), budget = qmt_option("free_delay_kb") << 10;
  if (!d || !qmt_option("thread_cache"))
    GTEST_SKIP() << "no delay, or no thread caches";
  size_t big = 16000, size = qmt_class_chunk_size(qmt_class_of(big));
  ASSERT_EQ(budget % size, 0u) << "the test fills the limbo exactly";
  std::thread([&] {
    std::vector<void *> v;
    for (size_t i = 0; i < 2 * budget / size; i++)
      v.push_back(unguarded_malloc(big));
    for (void *p : v)
      qm_free(p);
  }).join();
  ASSERT_EQ(qmt_limbo_bytes(), budget) << "the limbo is full of one class";
  void *x = nullptr;
  std::thread([&] {
    x = unguarded_malloc(48);
    qm_free(x);
  }).join();
  expect_delayed(x, 48, d);
}

// A chunk whose owner exited, freed by another thread: the free goes to the
// closed id's path, which gives to the central lists; it waits there too.
TEST(MaxDelayAcross, FreeOfAnExitedThreadsChunk) {
  size_t d = qmt_option("free_delay");
  ASSERT_GE(d, 256u);
  for (size_t n : {48ul, 200ul, 3000ul}) {
    void *x = nullptr;
    std::thread([&] { x = unguarded_malloc(n); }).join();
    qm_free(x);
    qm_malloc_trim(0); // sends the free batched for its owner's id now
    expect_delayed(x, n, d);
  }
}

// The calling thread's own free: its ring (or, without a cache, the limbo).
TEST(MaxDelayAcross, OwnFree) {
  size_t d = qmt_option("free_delay");
  ASSERT_GE(d, 256u);
  for (size_t n : {48ul, 200ul, 3000ul}) {
    void *x = unguarded_malloc(n);
    qm_free(x);
    expect_delayed(x, n, d);
  }
}

// hardening=max: a chunk another thread frees is zeroed by that thread at
// the free (all but its canary), and checked zero when its owner takes it
// back: a read after free finds zeros at once, and a write while the
// chunk waits to be sent (in the freeing thread's outbox) is reported by
// the owner, at the write's offset; one to the canary's bytes too. Before,
// the owner zeroed it on arrival: the read found the old bytes, and the
// write was wiped unreported.
TEST(MaxDeathTest, AWriteToAChunkAnotherThreadFreedIsFoundByItsOwner) {
  if (!qmt_cache_checked() || !qmt_option("zero_on_free") || !qmt_option("thread_cache"))
    GTEST_SKIP() << "checked mode with zero_on_free and thread caches only";
  const size_t n = 100, size = qmt_class_chunk_size(qmt_class_of(n));
  for (size_t at : {size_t{0}, n + 3, size - 1}) {
    std::string re;
    if (at >= n && at < n + 8) // the canary, checked as such
      re = QM_ERR QM_K_SMALL_OVERFLOW " .*written past the end at offset " + std::to_string(at);
    else {
      re = "^" QM_LINE(QM_K_WRITE_AFTER_FREE, "@D@") "\n" QM_END;
      std::string d = "class " + std::to_string(size) + " bytes, byte at offset " +
                      std::to_string(at) + " is 0x5a, written while the chunk was free";
      re.replace(re.find("@D@"), 3, d);
    }
    EXPECT_DEATH(
        {
          unsigned char *p = static_cast<unsigned char *>(qm_malloc(n));
          memset(p, 0x77, n);
          unsigned char seen = 1;
          std::thread([&] {
            qm_free(p); // sent to this thread, from the other's outbox at its exit
            seen = p[0];
            p[at] = 0x5a;
          }).join();
          if (seen != 0)
            _exit(3);
          for (int i = 0; i < 64; i++)
            qm_free(qm_malloc(n)); // takes back what was sent to it
          _exit(4);
        },
        re)
        << "offset " << at;
  }
}

// hardening=max: a free re-entered from a signal handler zeroes the chunk
// too (all but its canary), and it is checked zero when the free is
// applied: a write to it in between is reported, whether the chunk is the
// thread's own or another thread's (sent on). Zeroed only when applied, the
// write was wiped unreported. The handler runs where qm_stats clears its
// busy mark (the leaving hook); the write follows it there.
static unsigned char *nested_victim;
static size_t nested_at;
static void nested_frees_then_writes() {
  qmt_set_leaving_hook(nullptr);
  qm_free(nested_victim); // deferred: the thread is marked busy
  nested_victim[nested_at] = 0x5a;
}
TEST(MaxDeathTest, AWriteAfterAHandlersFreeIsFoundWhenTheFreeIsApplied) {
  if (!qmt_cache_checked() || !qmt_option("zero_on_free") || !qmt_option("thread_cache"))
    GTEST_SKIP() << "checked mode with zero_on_free and thread caches only";
  const size_t n = 100, size = qmt_class_chunk_size(qmt_class_of(n));
  for (int remote = 0; remote < 2; remote++) {
    std::string re = "^" QM_LINE(QM_K_WRITE_AFTER_FREE, "@D@") "\n" QM_END;
    std::string d = "class " + std::to_string(size) +
                    " bytes, byte at offset 5 is 0x5a, written while the chunk was free";
    re.replace(re.find("@D@"), 3, d);
    EXPECT_DEATH(
        {
          nested_at = 5;
          std::atomic<int> step{0};
          std::thread owner;
          if (remote) {
            owner = std::thread([&] {
              nested_victim = static_cast<unsigned char *>(qm_malloc(n));
              memset(nested_victim, 0x77, n);
              step = 1;
              while (step != 2)
                std::this_thread::yield();
            });
            while (step != 1)
              std::this_thread::yield();
          } else {
            nested_victim = static_cast<unsigned char *>(qm_malloc(n));
            memset(nested_victim, 0x77, n);
          }
          qmt_set_leaving_hook(nested_frees_then_writes);
          qm_stats_t s;
          qm_stats(&s); // the handler's free applied as it leaves
          _exit(3);
        },
        re)
        << (remote ? "another thread's chunk" : "the thread's own chunk");
  }
}

// hardening=max (its own process, unit-max): a byte written anywhere in a
// freed chunk is found when the chunk is handed out again, at its offset,
// by each width of vector the CPU has (AVX-512F, AVX2, SSE2: the zeroing
// and the check both change with it). The classes take each of their
// ways through a chunk: below 64 bytes (16, 48: one vector, AVX-512's
// masked), below one step of four vectors (80, 112, 128, 240: four that
// overlap), steps and a last four overlapping them (256, 320, 768, 2048,
// 3072), a multiple of the step or not; the places are the first byte,
// one inside and the last one.
TEST(MaxDeathTest, WriteAfterFreeIsFoundAnywhereInTheChunk) {
  for (unsigned vec = qmt_vec() + 1; vec-- > 0;) {
    for (size_t n : {8, 40, 72, 100, 120, 232, 248, 300, 700, 2000, 3000}) {
      size_t size = qmt_class_chunk_size(qmt_class_of(n));
      for (size_t at : {size_t{0}, size / 2 + 3, size - 1}) {
        std::string re = "^" QM_LINE(QM_K_WRITE_AFTER_FREE, "@D@") "\n" QM_END;
        std::string d = "class " + std::to_string(size) + " bytes, byte at offset " +
                        std::to_string(at) + " is 0x5a, written while the chunk was free";
        re.replace(re.find("@D@"), 3, d);
        EXPECT_DEATH(
            {
              qmt_vec_set(vec);
              unsigned char *p = static_cast<unsigned char *>(qm_malloc(n));
              qm_free(p);
              p[at] = 0x5a;
              for (int i = 0; i < 100000; i++)
                qm_free(qm_malloc(n)); // p comes back after free_delay mallocs
            },
            re)
            << n << " bytes, offset " << at << ", vector width " << vec;
      }
    }
  }
}
