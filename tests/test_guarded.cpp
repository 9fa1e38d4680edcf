// test_guarded.cpp: guarded slots for small chunks. Under guard_all=1
// (suites AllGuarded*) and sample_rate=1 (Sampled*), each in its own process
// (tests/meson.build): use-after-free read and write fault with the report,
// 1-byte overflows fault or are caught at free, realloc moves leave the old
// address faulting, sizes and double frees, a multithreaded run with
// cross-thread frees. SampleRate* runs with the default options.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util.h"

namespace {

qm_stats_t stats() {
  qm_stats_t s;
  qm_stats(&s);
  return s;
}

// kind: one of report.re's QM_K_*
std::string fault_regex(const char *kind, const char *rw, const std::string &where, size_t n) {
  std::string re = qm_fill("^" QM_LINE_AT("@K@", "@RW@", "@D@") "\n" QM_FAULT_END, "@K@", kind);
  re = qm_fill(re, "@RW@", rw);
  return qm_fill(re, "@D@",
                 where + "sampled small chunk of " + std::to_string(n) + " bytes at " HEX);
}

// The checks both suites make; `suite` only names them.
class Guarded : public testing::TestWithParam<size_t> {
protected:
  // a thread's first small malloc only arms the sampling countdown
  void SetUp() override { qm_free(qm_malloc(1)); }
  void TearDown() override { qmt_options_init(); }
};

void expect_guarded(void *p) {
  // a guarded chunk lives outside the small-chunk heap, on its own pages
  EXPECT_FALSE(qmt_is_small(p));
  char prot[5];
  qmt_prot_of(p, prot);
  EXPECT_STREQ(prot, "rw-p");
}

void check_use_after_free(size_t n) {
  for (bool write : {false, true})
    for (int cycles : {0, 16})
      EXPECT_EXIT(use_after_free(n, cycles, write, n / 2), testing::KilledBySignal(SIGSEGV),
                  fault_regex(QM_K_UAF, write ? "write" : "read",
                              "offset " + std::to_string(n / 2) + " in freed ", n))
          << "cycles " << cycles;
}

void check_overflow(size_t n) {
  char *p = static_cast<char *>(qm_malloc(n));
  expect_guarded(p);
  if (n % 16 == 0) { // flush against the guard
    EXPECT_EXIT(poke(p, n), testing::KilledBySignal(SIGSEGV),
                fault_regex(QM_K_OVERFLOW, "write", "1 byte past the end of ", n));
  } else { // 16-aligned: the slack before the guard is checked at free
    EXPECT_DEATH(
        {
          poke(p, n);
          qm_free(p);
        },
        qm_fill("^" QM_LINE(QM_K_SMALL_OVERFLOW, "@D@") "\n" QM_END, "@D@",
                "sampled small chunk, " + std::to_string(n) +
                    " bytes, written past the end at offset " + std::to_string(n)));
    EXPECT_EXIT(poke(p, (n + 15) / 16 * 16), testing::KilledBySignal(SIGSEGV),
                fault_regex(QM_K_OVERFLOW, "write",
                            std::to_string((n + 15) / 16 * 16 - n + 1) + " bytes past the end of ",
                            n));
  }
  qm_free(p);
  // guard_align=0: every chunk flush, whatever its size
  ASSERT_EQ(qmt_options_apply("guard_align=0"), 0);
  p = static_cast<char *>(qm_malloc(n));
  EXPECT_EXIT(poke(p, n), testing::KilledBySignal(SIGSEGV),
              fault_regex(QM_K_OVERFLOW, "write", "1 byte past the end of ", n));
  EXPECT_EXIT((void)peek(p, n), testing::KilledBySignal(SIGSEGV),
              fault_regex(QM_K_OVERFLOW, "read", "1 byte past the end of ", n));
  qm_free(p);
}

void check_realloc_moves(size_t n) {
  char *p = static_cast<char *>(qm_malloc(n));
  for (size_t i = 0; i < n; i++)
    p[i] = static_cast<char>(i * 7);
  char *q = static_cast<char *>(qm_realloc(p, n + 1));
  ASSERT_NE(q, p);
  expect_guarded(q);
  for (size_t i = 0; i < n; i++)
    ASSERT_EQ(q[i], static_cast<char>(i * 7)) << i;
  EXPECT_EXIT(poke(p, 0), testing::KilledBySignal(SIGSEGV),
              fault_regex(QM_K_UAF, "write", "offset 0 in freed ", n));
  char *r = static_cast<char *>(qm_realloc(q, n / 2 + 1));
  ASSERT_NE(r, q);
  EXPECT_EXIT((void)peek(q, 0), testing::KilledBySignal(SIGSEGV),
              fault_regex(QM_K_UAF, "read", "offset 0 in freed ", n + 1));
  qm_free(r);
}

void check_sizes_and_frees(size_t n) {
  char *p = static_cast<char *>(qm_malloc(n));
  EXPECT_EQ(qm_malloc_usable_size(p), n);
  EXPECT_EQ(qm_malloc_object_size(p), n);
  EXPECT_EQ(qm_malloc_object_size(p + 3), n - 3);
  EXPECT_EQ(qm_malloc_object_size(p + n), 0u);
  char buf[256];
  ASSERT_EQ(qm_describe(p, buf, sizeof buf), 1);
  EXPECT_NE(std::string(buf).find("sampled small chunk of " + std::to_string(n)), std::string::npos)
      << buf;
  EXPECT_DEATH(qm_free(p + 1), qm_fill("^" QM_LINE_OF(QM_K_INVALID_FREE, "@D@") "\n" QM_END, "@D@",
                                       "offset 1 in sampled small chunk of " + std::to_string(n) +
                                           " bytes at " HEX));
  EXPECT_DEATH(qm_free_sized(p, n + 1),
               qm_fill("^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_sized"), "@D@") "\n" QM_END, "@D@",
                       "passed " + std::to_string(n + 1) + " bytes, sampled small chunk holds " +
                           std::to_string(n)));
  qm_free_sized(p, n);
  EXPECT_EQ(qm_malloc_object_size(p), 0u);
  EXPECT_DEATH(qm_free(p), qm_fill("^" QM_LINE_OF(QM_K_DOUBLE_FREE, "@D@") "\n" QM_END, "@D@",
                                   "sampled small chunk, " + std::to_string(n) + " bytes"));
  EXPECT_DEATH(qm_malloc_usable_size(p),
               qm_fill("^" QM_LINE_OF(QM_K_USABLE_SIZE, "@D@") "\n" QM_END, "@D@",
                       "sampled small chunk, " + std::to_string(n) + " bytes, already freed"));
  // calloc is zero even in a reused slot
  for (int i = 0; i < 64; i++) {
    char *q = static_cast<char *>(qm_malloc(n));
    std::memset(q, 0x5a, n);
    qm_free(q);
  }
  char *z = static_cast<char *>(qm_calloc(1, n));
  EXPECT_TRUE(all_bytes(z, n, 0));
  qm_free(z);
}

// Threads allocate and hand their chunks to the next thread, which checks
// and frees them: every free crosses threads.
void cross_thread_stress() {
  constexpr int T = 4, N = 20000;
  std::mutex mu[T];
  std::vector<char *> box[T];
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < T; t++)
    ts.emplace_back([&, t] {
      uint64_t rng = 0x9e3779b97f4a7c15ull * (t + 1);
      for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 1 + (rng >> 33) % 2000;
        char *p = static_cast<char *>(qm_malloc(n));
        if (!p) {
          bad++;
          continue;
        }
        p[0] = p[n - 1] = static_cast<char>(n);
        std::vector<char *> mine;
        {
          std::lock_guard<std::mutex> g(mu[(t + 1) % T]);
          box[(t + 1) % T].push_back(p);
        }
        {
          std::lock_guard<std::mutex> g(mu[t]);
          mine.swap(box[t]);
        }
        for (char *q : mine) {
          size_t m = qm_malloc_usable_size(q);
          if (q[0] != static_cast<char>(m) || q[m - 1] != static_cast<char>(m))
            bad++;
          qm_free(q);
        }
      }
    });
  for (auto &th : ts)
    th.join();
  for (auto &b : box)
    for (char *q : b)
      qm_free(q);
  EXPECT_EQ(bad.load(), 0);
}

// ---- guard_all=1 ----

using AllGuardedDeathTest = Guarded;

TEST_P(AllGuardedDeathTest, UseAfterFreeFaults) { check_use_after_free(GetParam()); }
TEST_P(AllGuardedDeathTest, OneByteOverflow) { check_overflow(GetParam()); }
TEST_P(AllGuardedDeathTest, ReallocMovesAndTheOldAddressFaults) { check_realloc_moves(GetParam()); }
TEST_P(AllGuardedDeathTest, SizesAndFrees) { check_sizes_and_frees(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Sizes, AllGuardedDeathTest, testing::Values(8, 64, 1000));

TEST(AllGuarded, EveryAllocationIsGuarded) {
  qm_stats_t s0 = stats();
  std::vector<void *> v;
  for (size_t n : {0, 1, 15, 16, 100, 4096, 4097, 65536, 100000})
    v.push_back(qm_malloc(n));
  v.push_back(qm_aligned_alloc(64, 100));
  v.push_back(qm_aligned_alloc(8192, 100));
  v.push_back(qm_calloc(10, 10));
  for (void *p : v)
    expect_guarded(p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v[9]) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v[10]) % 8192, 0u);
  EXPECT_EQ(stats().guarded_allocs - s0.guarded_allocs, v.size());
  for (void *p : v)
    qm_free(p);
  EXPECT_EQ(stats().guarded_frees - s0.guarded_frees, v.size());
}

// Many live chunks: markers keep the slots in use one VMA, so the mapping
// count stays far below one per chunk.
TEST(AllGuarded, ManyLiveChunksNeedFewMappings) {
  if (!stats().guarded_markers) {
    qm_free(qm_malloc(1));
    if (!stats().guarded_markers)
      GTEST_SKIP() << "no MADV_GUARD_INSTALL (Linux 6.13+): each slot in use is its own VMA";
  }
  long m0 = qmt_mappings();
  std::vector<void *> v(100000);
  for (auto &p : v)
    p = qm_malloc(32);
  long m1 = qmt_mappings();
  EXPECT_LT(m1 - m0, 100) << "mappings before " << m0 << ", after " << m1;
  for (void *p : v)
    qm_free(p);
}

TEST(AllGuarded, CrossThreadFreesComplete) { cross_thread_stress(); }

// A mapping budget of 16: no crash, every request served, the estimate
// within the budget (guard markers once it is spent).
TEST(AllGuardedTinyBudget, DegradesAndNeverFails) {
  std::vector<void *> v;
  for (int i = 0; i < 3000; i++) {
    void *p = qm_malloc(48);
    ASSERT_NE(p, nullptr);
    v.push_back(p);
  }
  for (void *p : v)
    qm_free(p);
  for (int i = 0; i < 3000; i++)
    qm_free(qm_malloc(48));
  qm_stats_t s = stats();
  EXPECT_LE(s.guarded_mappings_estimate, s.guarded_mappings_budget);
  cross_thread_stress();
}

// ---- sample_rate=1 ----

using SampledDeathTest = Guarded;

TEST_P(SampledDeathTest, UseAfterFreeFaults) { check_use_after_free(GetParam()); }
TEST_P(SampledDeathTest, OneByteOverflow) { check_overflow(GetParam()); }
TEST_P(SampledDeathTest, ReallocMovesAndTheOldAddressFaults) { check_realloc_moves(GetParam()); }
TEST_P(SampledDeathTest, SizesAndFrees) { check_sizes_and_frees(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Sizes, SampledDeathTest, testing::Values(8, 64, 1000));

TEST(Sampled, CrossThreadFreesComplete) { cross_thread_stress(); }

// mallinfo2 counts a sampled chunk's bytes as in use: every malloc here
// takes a guarded slot, so the bytes asked for are all in guarded slots
TEST(Sampled, MallinfoCountsGuardedChunksInUse) {
  size_t before = qm_mallinfo2().uordblks;
  std::vector<void *> v;
  for (int i = 0; i < 8; i++)
    v.push_back(qm_malloc(3000));
  ASSERT_GE(stats().guarded_live_chunks, 8u) << "every malloc sampled (sample_rate=1)";
  EXPECT_GE(qm_mallinfo2().uordblks, before + 8 * 3000);
  for (void *p : v)
    qm_free(p);
}

// ---- default options ----

// About 1 in N small mallocs is sampled.
// In a new thread: its first malloc arms the countdown under the new rate
// (one armed with sampling off would not run out in this test).
TEST(SampleRate, OneInNAreGuarded) {
  ASSERT_EQ(qmt_options_apply("sample_rate=64"), 0);
  uint64_t got = 0;
  std::thread([&] {
    qm_free(qm_malloc(24));
    qm_stats_t s0 = stats();
    constexpr int K = 64 * 2000;
    for (int i = 0; i < K; i++)
      qm_free(qm_malloc(24));
    got = stats().guarded_allocs - s0.guarded_allocs;
  }).join();
  EXPECT_GT(got, 2000u * 8 / 10);
  EXPECT_LT(got, 2000u * 12 / 10);
  qmt_options_init();
}

// malloc(0) stays a zero-size slot when its malloc is the sampled one: every
// malloc is at sample_rate=1, in a new thread whose first malloc arms it.
TEST(SampleRate, MallocOfZeroIsNeverSampled) {
  ASSERT_EQ(qmt_options_apply("sample_rate=1"), 0);
  uint64_t guarded = 0;
  std::vector<void *> zero;
  std::thread([&] {
    qm_free(qm_malloc(24));
    qm_stats_t s0 = stats();
    for (int i = 0; i < 100; i++)
      zero.push_back(qm_malloc(0));
    guarded = stats().guarded_allocs - s0.guarded_allocs;
    void *p = qm_malloc(24); // and the next malloc is sampled again
    EXPECT_EQ(stats().guarded_allocs - s0.guarded_allocs, 1u);
    qm_free(p);
  }).join();
  EXPECT_EQ(guarded, 0u);
  for (void *p : zero) {
    char buf[256];
    qm_describe(p, buf, sizeof buf);
    EXPECT_NE(std::string(buf).find("zero"), std::string::npos) << buf;
    qm_free(p);
  }
  qmt_options_init();
}

TEST(SampleRate, OffMeansNone) {
  ASSERT_EQ(qmt_options_apply("sample_rate=0"), 0);
  for (int i = 0; i < 3000000; i++) // past any countdown armed before
    qm_free(qm_malloc(24));
  qm_stats_t s0 = stats();
  for (int i = 0; i < 100000; i++)
    qm_free(qm_malloc(24));
  EXPECT_EQ(stats().guarded_allocs, s0.guarded_allocs);
  qmt_options_init();
}

// The guarded slots' base, span, strategy and budget: sealed once set up,
// as the secondary's are (Large.FixedStateIsSealed).
TEST(Sampled, FixedStateIsSealed) {
  qm_free(qm_malloc(64));
  qm_free(qm_malloc(64)); // sampled: the slots are set up
  ASSERT_TRUE(stats().guarded_allocs > 0);
  uintptr_t lo, hi, vars[2], pages[2];
  qmt_ro_range(&lo, &hi);
  qmt_fixed_state(vars, pages);
  EXPECT_TRUE(vars[1] >= lo && vars[1] < hi) << "the pointer is not in the sealed section";
  char prot[5];
  qmt_prot_of(reinterpret_cast<void *>(pages[1]), prot);
  EXPECT_STREQ(prot, "r--p");
  EXPECT_EXIT(qmt_poke_guarded_base(), ::testing::KilledBySignal(SIGSEGV), "");
}

} // namespace
