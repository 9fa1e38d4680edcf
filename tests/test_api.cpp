// test_api.cpp: the malloc family's contract: calloc overflow, ENOMEM for
// absurd sizes, alignment rules (EINVAL), realloc's edge cases as glibc has
// them, usable sizes, sized frees, mallinfo2, trim and stats.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "util.h"

namespace {

TEST(Api, MallocZeroGivesUniqueFreeablePointers) {
  void *a = qm_malloc(0), *b = qm_malloc(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  qm_free(a);
  qm_free(b);
  qm_free(nullptr);
}

static int overcommit_mode() {
  FILE *f = std::fopen("/proc/sys/vm/overcommit_memory", "r");
  int m = -1;
  if (f) {
    if (std::fscanf(f, "%d", &m) != 1)
      m = -1;
    std::fclose(f);
  }
  return m;
}

TEST(Api, AbsurdSizesAreEnomem) {
  // Under overcommit_memory=1 the kernel grants a 32 TiB mapping; qemu-user
  // 7.2 keeps flags for every page the guest maps, and such a mapping took
  // 24 GiB of the host's memory before the OOM killer
  int mode = overcommit_mode();
  if (mode == 1)
    GTEST_SKIP() << "vm.overcommit_memory=1 grants a 32 TiB mapping";
  qm_free(qm_malloc(size_t{1} << 20)); // the large side's own mappings made
  qm_stats_t before, after;
  qm_stats(&before);
  for (size_t n : {SIZE_MAX, SIZE_MAX / 2, size_t{1} << 47, size_t{1} << 45}) {
    errno = 0;
    EXPECT_EQ(qm_malloc(n), nullptr) << n;
    EXPECT_EQ(errno, ENOMEM) << n;
  }
  // refused before any mapping is tried: the kernel would grant the
  // PROT_NONE reservation and refuse only its RW part
  qm_stats(&after);
  EXPECT_EQ(after.sys_mmap, before.sys_mmap);
  errno = 0;
  EXPECT_EQ(qm_calloc(SIZE_MAX / 2, 3), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(qm_calloc(size_t{1} << 33, size_t{1} << 33), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(Api, CallocZeroesReusedMemory) {
  for (size_t n : {24ul, 1000ul, 100000ul, 300000ul, 3000000ul}) {
    void *p = qm_malloc(n);
    std::memset(p, 0xff, n);
    qm_free(p);
    unsigned char *q = static_cast<unsigned char *>(qm_calloc(1, n));
    ASSERT_NE(q, nullptr);
    EXPECT_TRUE(all_bytes(q, n, 0)) << n;
    qm_free(q);
  }
}

TEST(Api, PosixMemalignRules) {
  void *p = reinterpret_cast<void *>(0x1);
  EXPECT_EQ(qm_posix_memalign(&p, 0, 10), EINVAL);
  EXPECT_EQ(qm_posix_memalign(&p, 3, 10), EINVAL);
  EXPECT_EQ(qm_posix_memalign(&p, 4, 10), EINVAL); // not a multiple of sizeof(void *)
  EXPECT_EQ(qm_posix_memalign(&p, 24, 10), EINVAL);
  EXPECT_EQ(p, reinterpret_cast<void *>(0x1)) << "untouched on failure";
  errno = 0;
  EXPECT_EQ(qm_posix_memalign(&p, 64, SIZE_MAX), ENOMEM);
  EXPECT_EQ(errno, 0) << "posix_memalign reports through its result, not errno";
  for (size_t a = 8; a <= (size_t{1} << 22); a *= 2) {
    for (size_t n : {1ul, 4096ul, 200000ul}) {
      ASSERT_EQ(qm_posix_memalign(&p, a, n), 0) << a << " " << n;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % a, 0u) << a << " " << n;
      std::memset(p, 3, n);
      qm_free(p);
    }
  }
}

TEST(Api, AlignedAllocMemalignVallocPvalloc) {
  errno = 0;
  EXPECT_EQ(qm_aligned_alloc(3, 16), nullptr);
  EXPECT_EQ(errno, EINVAL);
  void *p = qm_aligned_alloc(4096, 4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  qm_free(p);
  p = qm_memalign(48, 10); // glibc rounds the alignment up to a power of two
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  qm_free(p);
  errno = 0;
  EXPECT_EQ(qm_memalign(SIZE_MAX, 10), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // as glibc: EINVAL only past 2^63; an alignment or a size that cannot be
  // served is ENOMEM
  for (size_t a : {size_t(1) << 62, (size_t(1) << 62) + 1, size_t(1) << 63}) {
    errno = 0;
    EXPECT_EQ(qm_memalign(a, 10), nullptr) << a;
    EXPECT_EQ(errno, ENOMEM) << a;
  }
  errno = 0;
  EXPECT_EQ(qm_memalign(64, SIZE_MAX / 2), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  size_t pg = qmt_page();
  p = qm_valloc(10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % pg, 0u);
  qm_free(p);
  p = qm_pvalloc(1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % pg, 0u);
  EXPECT_GE(qm_malloc_usable_size(p), pg);
  qm_free(p);
}

TEST(Api, ReallocEdgeCasesAsGlibc) {
  char *p = static_cast<char *>(qm_realloc(nullptr, 10)); // = malloc
  ASSERT_NE(p, nullptr);
  std::memcpy(p, "123456789", 10);
  p = static_cast<char *>(qm_realloc(p, 5000)); // small -> small, moved
  EXPECT_STREQ(p, "123456789");
  p = static_cast<char *>(qm_realloc(p, 4000)); // shrink in place
  EXPECT_STREQ(p, "123456789");
  char *q = static_cast<char *>(qm_realloc(p, 1 << 20)); // small -> large
  EXPECT_STREQ(q, "123456789");
  p = static_cast<char *>(qm_realloc(q, 100)); // large -> small
  EXPECT_STREQ(p, "123456789");
  EXPECT_TRUE(qmt_is_small(p));
  EXPECT_EQ(qm_realloc(p, 0), nullptr); // glibc: frees and returns NULL
  errno = 0;
  p = static_cast<char *>(qm_malloc(64));
  EXPECT_EQ(qm_realloc(p, SIZE_MAX), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(qm_reallocarray(p, SIZE_MAX / 2, 4), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  p[63] = 1; // still ours after both failures
  qm_free(p);
}

TEST(Api, UsableSizeIsNeverLessThanRequested) {
  EXPECT_EQ(qm_malloc_usable_size(nullptr), 0u);
  for (size_t n = 1; n < (size_t{8} << 20); n = n * 3 / 2 + 1) {
    void *p = qm_malloc(n);
    size_t u = qm_malloc_usable_size(p);
    EXPECT_GE(u, n);
    std::memset(p, 1, u); // the whole usable size is writable
    qm_free(p);
  }
}

TEST(Api, FreeSizedAcceptsTheRightSize) {
  for (size_t n : {10ul, 1000ul, 300000ul}) {
    void *p = qm_malloc(n);
    qm_free_sized(p, n);
    p = qm_aligned_alloc(256, n);
    qm_free_aligned_sized(p, 256, n);
  }
}

TEST(ApiDeathTest, FreeSizedWithTheWrongSizeIsReported) {
  void *p = qm_malloc(100);
  EXPECT_DEATH(qm_free_sized(p, 4096),
               "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_sized"),
                              "passed 4096 bytes, small chunk holds 100") "\n" QM_END);
  void *q = qm_malloc(200000);
  EXPECT_DEATH(
      qm_free_sized(q, 100000),
      "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_sized"),
                     "passed 100000 bytes, large chunk holds 200000") "\n" QM_CALL QM_ALLOCATED);
}

// The exact requested size is known for every chunk: one byte off is wrong.
TEST(ApiDeathTest, FreeSizedChecksTheExactSize) {
  void *p = qm_malloc(100);
  EXPECT_DEATH(qm_free_sized(p, 99),
               "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_sized"),
                              "passed 99 bytes, small chunk holds 100") "\n" QM_END);
  void *q = qm_malloc(200000);
  EXPECT_DEATH(
      qm_free_sized(q, 200001),
      "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_sized"),
                     "passed 200001 bytes, large chunk holds 200000") "\n" QM_CALL QM_ALLOCATED);
  void *r = qm_aligned_alloc(64, 40);
  EXPECT_DEATH(
      qm_free_aligned_sized(r, 64, 48),
      "^" QM_LINE_OF(
          QM_K_SIZE_MISMATCH("free_aligned_sized"),
          "passed 48 bytes, alignment 64, small chunk holds 40 aligned to 64") "\n" QM_END);
  qm_free_sized(p, 100);
  qm_free_sized(q, 200000);
  qm_free_aligned_sized(r, 64, 40);
}

// Every way to get an aligned chunk, small and large, freed with the
// alignment and size it was asked for: accepted (up to 16, any alignment
// names malloc's natural one).
TEST(Api, FreeAlignedSizedAcceptsWhatWasAllocated) {
  for (size_t n : {0ul, 1ul, 40ul, 4096ul, 60000ul, 131000ul, 200000ul, 3000000ul}) {
    for (size_t a = 1; a <= 1 << 20; a *= 2) {
      void *p = qm_aligned_alloc(a, n);
      ASSERT_NE(p, nullptr);
      qm_free_aligned_sized(p, a, n);
      ASSERT_EQ(qm_posix_memalign(&p, a < 8 ? 8 : a, n), 0);
      qm_free_aligned_sized(p, a < 8 ? 8 : a, n);
      p = qm_memalign(a, n);
      qm_free_aligned_sized(p, a, n);
    }
    void *p = qm_malloc(n);
    qm_free_aligned_sized(p, 16, n);
    p = qm_valloc(n);
    qm_free_aligned_sized(p, qmt_page(), n);
  }
}

// free_sized(p, SIZE_MAX) is a size like any other: it names no chunk.
TEST(ApiDeathTest, FreeSizedOfSizeMaxIsReported) {
  void *p = qm_malloc(100);
  EXPECT_DEATH(
      qm_free_sized(p, SIZE_MAX),
      "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_sized"),
                     "passed 18446744073709551615 bytes, small chunk holds 100") "\n" QM_END);
  void *q = qm_malloc(200000);
  EXPECT_DEATH(
      qm_free_sized(q, SIZE_MAX),
      "^" QM_LINE_OF(
          QM_K_SIZE_MISMATCH("free_sized"),
          "passed 18446744073709551615 bytes, large chunk holds 200000") "\n" QM_CALL QM_ALLOCATED);
  void *r = qm_aligned_alloc(64, 40);
  EXPECT_DEATH(qm_free_aligned_sized(r, 64, SIZE_MAX),
               "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_aligned_sized"),
                              "passed 18446744073709551615 bytes, alignment 64, small chunk holds "
                              "40 aligned to 64") "\n" QM_END);
  qm_free_sized(p, 100);
  qm_free_sized(q, 200000);
  qm_free_aligned_sized(r, 64, 40);
}

// The alignment is checked as the chunk was allocated, not only against the
// pointer: a 4096-aligned chunk freed as 64-aligned, and an alignment that is
// not a power of two, are reported, small and large.
TEST(ApiDeathTest, FreeAlignedSizedChecksTheAlignmentItWasAllocatedWith) {
  void *p = qm_aligned_alloc(4096, 4096);
  const char *small = "^" QM_LINE_OF(
      QM_K_SIZE_MISMATCH("free_aligned_sized"),
      "passed 4096 bytes, alignment %zu, small chunk holds 4096 aligned to 4096") "\n" QM_END;
  for (size_t a : {64ul, 48ul, 0ul, 8192ul, 3ul}) {
    char re[512];
    snprintf(re, sizeof re, small, a);
    EXPECT_DEATH(qm_free_aligned_sized(p, a, 4096), re) << a;
  }
  void *q = qm_aligned_alloc(4096, 200000);
  const char *large = "^" QM_LINE_OF(
      QM_K_SIZE_MISMATCH("free_aligned_sized"),
      "passed 200000 bytes, alignment %zu, large chunk holds 200000 aligned to 4096") "\n";
  for (size_t a : {64ul, 48ul, 0ul, 65536ul, 3ul}) {
    char re[512];
    snprintf(re, sizeof re, large, a);
    EXPECT_DEATH(qm_free_aligned_sized(q, a, 200000), re) << a;
  }
  // a chunk of malloc's is not an aligned one, even at a page boundary
  void *r = qm_malloc(200000);
  EXPECT_DEATH(qm_free_aligned_sized(r, 4096, 200000), "alignment 4096, large chunk holds");
  // and realloc hands out malloc's kind of chunk
  void *s = qm_realloc(qm_aligned_alloc(65536, 300000), 310000);
  EXPECT_DEATH(qm_free_aligned_sized(s, 65536, 310000), "alignment 65536, large chunk holds");
  // a malloc(0) chunk was never over-aligned
  void *z = qm_malloc(0);
  EXPECT_DEATH(qm_free_aligned_sized(z, 64, 0), "alignment 64, zero-size chunk holds 0");
  qm_free_aligned_sized(p, 4096, 4096);
  qm_free_aligned_sized(q, 4096, 200000);
  qm_free_sized(r, 200000);
  qm_free_sized(s, 310000);
  qm_free_aligned_sized(z, 16, 0);
}

// The first malloc(n) chunk on a 64-byte boundary (a death test's child
// runs the test again: the search is inside the statement, so the child
// finds its own).
static void *plain_on_64(size_t n) {
  for (int i = 0; i < 4096; i++) {
    void *p = qm_malloc(n);
    if (!((uintptr_t)p % 64))
      return p;
  }
  _exit(3); // none found: the death test fails on the message
}

// The first realloc of an aligned_alloc(64, 40) chunk that stays in place.
static void *realloc_in_place() {
  for (size_t n = 41; n < 200; n++) {
    void *b = qm_aligned_alloc(64, 40), *r = qm_realloc(b, n);
    if (r == b)
      return r;
  }
  _exit(3);
}

// A small chunk remembers the alignment it was asked for: one of malloc's
// that happens to sit on a 64-byte boundary is not an aligned one, one
// asked for 64 is not malloc's, and realloc (in place or moved) hands out
// malloc's kind of chunk, as large chunks do.
TEST(ApiDeathTest, FreeAlignedSizedNamesTheAlignmentASmallChunkWasAskedFor) {
  EXPECT_DEATH(qm_free_aligned_sized(plain_on_64(1024), 64, 1024),
               "^" QM_LINE_OF(QM_K_SIZE_MISMATCH("free_aligned_sized"),
                              "passed 1024 bytes, alignment 64, ([a-z]+ )?small chunk holds "
                              "1024 aligned to 16") "\n");
  void *a = qm_aligned_alloc(64, 40);
  for (size_t wrong : {16ul, 1ul, 32ul, 128ul})
    EXPECT_DEATH(qm_free_aligned_sized(a, wrong, 40),
                 "alignment " + std::to_string(wrong) +
                     ", ([a-z]+ )?small chunk holds 40 aligned to 64\\)")
        << wrong;
  qm_free_aligned_sized(a, 64, 40);
  if (!qmt_option("guard_all")) { // a guarded slot always moves
    EXPECT_DEATH(qm_free_aligned_sized(realloc_in_place(), 64, 0),
                 "alignment 64, ([a-z]+ )?small chunk holds [0-9]+ aligned to 16\\)");
  }
  void *m = qm_realloc(qm_aligned_alloc(64, 40), 2000);
  EXPECT_DEATH(qm_free_aligned_sized(m, 64, 2000),
               "alignment 64, ([a-z]+ )?small chunk holds 2000 aligned to 16\\)");
  qm_free_aligned_sized(m, 16, 2000);
  // every alignment the primary serves, up to 64 KiB, is told apart
  for (size_t al = 32; al <= 65536; al *= 2) {
    void *p = qm_aligned_alloc(al, 24);
    ASSERT_NE(p, nullptr);
    EXPECT_DEATH(qm_free_aligned_sized(p, al / 2, 24), "holds 24 aligned to " + std::to_string(al))
        << al;
    qm_free_aligned_sized(p, al, 24);
  }
}

TEST(Api, UsableSizeIsTheRequestForSmallChunks) {
  for (size_t n : {1ul, 17ul, 100ul, 4000ul}) {
    char *p = static_cast<char *>(qm_malloc(n));
    ASSERT_EQ(qm_malloc_usable_size(p), n) << "the canary starts right after it";
    std::memset(p, 1, qm_malloc_usable_size(p));
    qm_free(p); // and writing all of it is no overflow
  }
}

TEST(Api, MallocZeroIsUniqueAndFreesNormally) {
  void *a = qm_malloc(0), *b = qm_malloc(0), *c = qm_calloc(0, 8);
  ASSERT_TRUE(a && b && c);
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_EQ(qm_malloc_usable_size(a), 0u);
  char prot[5];
  qmt_prot_of(a, prot);
  EXPECT_STREQ(prot, "---p") << "any access faults";
  void *d = qm_realloc(a, 100); // grows into a real chunk
  ASSERT_NE(d, nullptr);
  qm_free(d);
  qm_free(b);
  qm_free(c);
}

// Once malloc(0) has handed out every slot of its region, freed slots come
// back: all of them can be live at once (only the 3,072 waiting in the FIFO
// of freed slots could before), a freed one still not the next handed out.
TEST(Api, MallocZeroReusesEverySlotOnceTheRegionIsFull) {
  const size_t extra = 20000;
  qmt_zero_cap(qmt_zero_cap(SIZE_MAX) + extra);
  // a malloc(0) may be sampled into a guarded slot: counted apart
  std::vector<void *> v, sampled;
  auto fill = [&] {
    std::set<void *> seen;
    for (void *p; (p = qm_malloc(0));) {
      ASSERT_TRUE(seen.insert(p).second) << "handed out twice: " << p;
      (qmt_is_small(p) ? v : sampled).push_back(p);
      ASSERT_LE(v.size(), size_t{1} << 24);
    }
    EXPECT_EQ(errno, ENOMEM);
  };
  fill();
  size_t all = v.size();
  EXPECT_GE(all, extra);
  for (int round = 0; round < 3; round++) {
    void *last = v.back();
    for (void *p : v)
      qm_free(p);
    v.clear();
    fill();
    EXPECT_EQ(v.size(), all) << "round " << round;
    EXPECT_NE(v[0], last);
  }
  for (void *p : v)
    qm_free(p);
  for (void *p : sampled)
    qm_free(p);
  qmt_zero_cap(SIZE_MAX);
}

TEST(ApiDeathTest, MallocZeroDoubleFreeIsReported) {
  void *a = qm_malloc(0);
  qm_free(a);
  EXPECT_DEATH(qm_free(a), "^" QM_LINE_OF(QM_K_DOUBLE_FREE, "zero-size chunk") "\n" QM_END);
}

// A file qmalloc reads at start-up that is missing must not leave errno set
// (a successful malloc(200000) once left ENOENT behind).
TEST(Api, FileReadsKeepErrno) {
  errno = 4321;
  char buf[16];
  EXPECT_EQ(qmt_read_file("/nonexistent/qmalloc", buf, sizeof buf), -1);
  EXPECT_EQ(errno, 4321);
  EXPECT_GT(qmt_read_file("/proc/self/stat", buf, sizeof buf), 0);
  EXPECT_EQ(errno, 4321);
}

// What a bounds check needs: bytes from any pointer to the end of its chunk.
TEST(Api, ObjectSize) {
  char *p = static_cast<char *>(qm_malloc(100));
  EXPECT_EQ(qm_malloc_object_size(p), 100u);
  EXPECT_EQ(qm_malloc_object_size(p + 40), 60u);
  EXPECT_EQ(qm_malloc_object_size(p + 100), 0u) << "the canary is not the program's";
  char *q = static_cast<char *>(qm_malloc(300000));
  EXPECT_EQ(qm_malloc_object_size(q + 1000), 299000u);
  EXPECT_EQ(qm_malloc_object_size(q + 300000), 0u);
  int local = 0;
  EXPECT_EQ(qm_malloc_object_size(&local), SIZE_MAX);
  qm_free(p);
  EXPECT_EQ(qm_malloc_object_size(p + 4), 0u);
  qm_free(q);
  EXPECT_EQ(qm_malloc_object_size(q + 4), 0u);
}

TEST(Api, ErrnoIsKeptOnSuccess) {
  errno = 1234;
  void *p = qm_malloc(1 << 20);
  void *q = qm_malloc(10);
  qm_free(p);
  qm_free(q);
  EXPECT_EQ(errno, 1234);
}

TEST(Api, MallinfoTrimAndStats) {
  void *big = qm_malloc(3 << 20);
  void *small = qm_malloc(100);
  struct mallinfo2 m = qm_mallinfo2();
  EXPECT_GE(m.hblks, 1u);
  EXPECT_GE(m.hblkhd, size_t{3} << 20);
  EXPECT_GE(m.uordblks, (size_t{3} << 20) + 100);
  qm_free(big);
  qm_free(small);
  EXPECT_GE(qm_malloc_trim(0), 0);
  testing::internal::CaptureStderr();
  qm_malloc_stats();
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("qmalloc: strategy "), std::string::npos) << out;
  EXPECT_NE(out.find("qmalloc: quarantine chunks"), std::string::npos) << out;
  qm_stats_t s;
  qm_stats(&s);
  EXPECT_GT(s.sys_mmap, 0u);
  EXPECT_GE(s.large_frees, 1u);
}

TEST(Api, DescribeNamesWhatAnAddressIs) {
  char buf[256];
  char *p = static_cast<char *>(qm_malloc(1 << 20));
  qm_free(p);
  EXPECT_EQ(qm_describe(p + 100, buf, sizeof buf), 1);
  EXPECT_EQ(std::string(buf).rfind("use-after-free: offset 100 in freed large chunk of 1048576 "
                                   "bytes at 0x",
                                   0),
            0u)
      << buf;
  static int not_heap;
  EXPECT_EQ(qm_describe(&not_heap, buf, sizeof buf), 0);
  EXPECT_STREQ(buf, "not in memory qmalloc manages");
}

// Every kind of chunk: small (live, freed), zero-size, large (live, freed);
// guarded slots in test_guarded.cpp, start-up chunks in test_init.cpp.
TEST(Api, DescribeKnowsEveryKindOfChunk) {
  char buf[256];
  auto describe = [&](const void *a) {
    EXPECT_EQ(qm_describe(a, buf, sizeof buf), 1) << buf;
    return std::string(buf);
  };
  auto starts = [](const std::string &s, const std::string &with) { return s.rfind(with, 0) == 0; };
  char *s = static_cast<char *>(qm_malloc(100));
  std::string d = describe(s + 8);
  EXPECT_TRUE(starts(d, "access: offset 8 in small chunk of 100 bytes (class ")) << d;
  char *l = static_cast<char *>(qm_malloc(300000));
  d = describe(l + 5);
  EXPECT_TRUE(starts(d, "access: offset 5 in large chunk of 300000 bytes at 0x")) << d;
  char *z = static_cast<char *>(qm_malloc(0));
  d = describe(z);
  EXPECT_TRUE(starts(d, "heap overflow: 1 byte past the end of zero-size chunk at 0x")) << d;
  qm_free(z);
  d = describe(z);
  EXPECT_TRUE(starts(d, "use-after-free: offset 0 in freed zero-size chunk at 0x")) << d;
  qm_free(l);
  d = describe(l + 5);
  EXPECT_TRUE(starts(d, "use-after-free: offset 5 in freed large chunk of 300000 bytes")) << d;
  qm_free(s);
  d = describe(s + 8);
  EXPECT_TRUE(starts(d, "use-after-free: offset 8 in freed small chunk of 100 bytes (class ")) << d;
}

// A signal handler's free lands wherever its thread is; while the thread
// holds one of qmalloc's locks unmarked, the free is applied at once and
// may wait for good on that lock (a shrink of a large chunk by realloc
// hung so under a timer's frees: its lookup held the large side's lock).
// Every call of the family, on every kind of chunk, is held to taking
// its locks marked busy, where a handler's free takes the nested path.
// Each runs on a thread of its own, from its first call to its exit's
// destructors.
static void expect_every_lock_marked(const char *what, void (*calls)()) {
  unsigned n = 0;
  const char *file = nullptr;
  int line = 0;
  std::thread t([&] {
    qmt_lock_watch(true);
    calls();
  });
  t.join();
  n = qmt_lock_unmarked(&file, &line);
  EXPECT_EQ(n, 0u) << what << ": " << n << " locks taken unmarked, the first at "
                   << (file ? file : "?") << ":" << line;
}

TEST(Api, EveryCallTakesItsLocksMarkedBusy) {
  expect_every_lock_marked("malloc and free", [] {
    for (size_t n : {0ul, 1ul, 100ul, 5000ul, 100000ul, 300000ul, 4000000ul}) {
      void *p = qm_malloc(n);
      qm_free(p);
    }
  });
  expect_every_lock_marked("calloc and the aligned family", [] {
    for (size_t n : {10ul, 3000ul, 200000ul}) {
      qm_free(qm_calloc(1, n));
      qm_free(qm_aligned_alloc(64, n));
      qm_free(qm_aligned_alloc(65536, n));
      qm_free(qm_memalign(4096, n));
      qm_free(qm_valloc(n));
      qm_free(qm_pvalloc(n));
      void *p = nullptr;
      if (!qm_posix_memalign(&p, 256, n))
        qm_free(p);
    }
  });
  expect_every_lock_marked("realloc", [] {
    // small to small (in place and moved), small to large, large in
    // place, large to a larger move, large to small, and to zero
    void *p = qm_realloc(nullptr, 100);
    for (size_t n : {120ul, 3000ul, 200000ul, 210000ul, 3000000ul, 100000ul, 50ul, 300000ul})
      p = qm_realloc(p, n);
    p = qm_reallocarray(p, 10, 30);
    qm_realloc(p, 0);
    // a zero-size chunk to a small and to a large one (its lookup locks)
    qm_free(qm_realloc(qm_malloc(0), 100));
    qm_free(qm_realloc(qm_malloc(0), 300000));
  });
  expect_every_lock_marked("sizes and sized frees", [] {
    for (size_t n : {0ul, 24ul, 2000ul, 200000ul}) {
      void *p = qm_malloc(n);
      (void)qm_malloc_usable_size(p);
      (void)qm_malloc_object_size(p);
      qm_free_sized(p, n);
      p = qm_aligned_alloc(64, n);
      qm_free_aligned_sized(p, 64, n);
    }
  });
  expect_every_lock_marked("stats, trim and describe", [] {
    void *l = qm_malloc(300000);
    char buf[128];
    (void)qm_describe(l, buf, sizeof buf);
    qm_free(l);
    (void)qm_describe(l, buf, sizeof buf);
    (void)qm_mallinfo2();
    (void)qm_malloc_trim(0);
  });
}

} // namespace
