// test_linked.cpp: gtest linked with libqmalloc.so, so the framework, the C++
// runtime and libc all allocate through qmalloc's malloc. Checks that the
// libc names are qmalloc's, that detection works through them, that C++
// new/delete and failures behave as the standard says, and that dlopen, NSS
// and threads with fork live on it.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <malloc.h>
#include <netdb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "../report_re.h"
#include "qmalloc.h"

// The offending calls of the death tests below: exported (the executable is
// linked with -rdynamic) and never inlined, so that a report's SUMMARY line
// names them from the dynamic symbol table, as it would a program's
// function.
extern "C" {
void free_sized(void *p, size_t n); // C23's, exported by libqmalloc
__attribute__((noinline, visibility("default"))) void bad_free(void *p) {
  free(p);
  asm volatile("" ::: "memory"); // not a tail call: this frame stays
}
__attribute__((noinline, visibility("default"))) void *bad_realloc(void *p, size_t n) {
  void *q = realloc(p, n);
  asm volatile("" ::: "memory");
  return q;
}
__attribute__((noinline, visibility("default"))) void bad_free_sized(void *p, size_t n) {
  free_sized(p, n);
  asm volatile("" ::: "memory");
}
__attribute__((noinline, visibility("default"))) size_t bad_usable_size(void *p) {
  size_t n = malloc_usable_size(p);
  asm volatile("" ::: "memory");
  return n;
}
__attribute__((noinline, visibility("default"))) void bad_write(volatile char *p) {
  *p = 1;
  asm volatile("" ::: "memory");
}
}

namespace {

qm_stats_t stats() {
  qm_stats_t s;
  qm_stats(&s);
  return s;
}

TEST(Linked, LibcNamesAreQmalloc) {
  qm_stats_t before = stats();
  void *p = malloc(1 << 20);
  EXPECT_EQ(stats().large_live_chunks, before.large_live_chunks + 1);
  EXPECT_GE(malloc_usable_size(p), size_t{1} << 20);
  struct mallinfo2 m = mallinfo2();
  EXPECT_GE(m.hblks, 1u);
  free(p);
  EXPECT_EQ(stats().large_live_chunks, before.large_live_chunks);
  void *q = nullptr;
  ASSERT_EQ(posix_memalign(&q, 1 << 16, 300000), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % (1 << 16), 0u);
  free(q);
}

TEST(LinkedDeathTest, UseAfterFreeThroughPlainFree) {
  char *p = static_cast<char *>(malloc(256 << 10));
  char *volatile dangling = p;
  free(p);
  EXPECT_EXIT(
      ((volatile char *)dangling)[8] = 1, testing::KilledBySignal(SIGSEGV),
      "^" QM_LINE_AT(
          QM_K_UAF, "write",
          "offset 8 in freed large chunk of 262144 bytes at " HEX) "\n" QM_ACCESSED QM_FREED);
}

TEST(LinkedDeathTest, UseAfterDeleteOfALargeArray) {
  auto *v = new double[100000];
  double *volatile dangling = v;
  delete[] v;
  EXPECT_EXIT((void)*(volatile double *)(dangling + 10), testing::KilledBySignal(SIGSEGV),
              "use-after-free \\(read\\)");
}

// A size of its own: a freed small chunk goes back to the thread's cache
// and the next malloc of its class (gtest's, here) may take it again.
TEST(LinkedDeathTest, DoubleFreeThroughPlainFree) {
  void *p = malloc(77777);
  void *volatile dangling = p;
  free(p);
  EXPECT_DEATH(free(dangling),
               "^" QM_LINE_OF(QM_K_DOUBLE_FREE, "small chunk, 77777 bytes") "\n" QM_END);
}

// Every report of each kind ends in the stack of the call that found the
// error and a SUMMARY line naming that call's function, small and large.
TEST(LinkedDeathTest, SummaryNamesTheOffendingCall) {
  const size_t sizes[] = {7777, 262144}; // a small size of its own (gtest allocates others); large,
                                         // flush against its guard page
  for (size_t n : sizes) {
    SCOPED_TRACE(n);
    char *p = static_cast<char *>(malloc(n));
    char *volatile dangling = p;
    EXPECT_DEATH(bad_free(p + 16), QM_CALL_THEN(QM_K_INVALID_FREE, "bad_free"));
    EXPECT_DEATH(bad_free_sized(p, n + 1),
                 QM_CALL_THEN(QM_K_SIZE_MISMATCH("free_sized"), "bad_free_sized"));
    if (n > 10000) { // the guard page after the chunk's last one, at the access
      EXPECT_EXIT(bad_write(dangling + n), testing::KilledBySignal(SIGSEGV),
                  QM_ACCESS_THEN(QM_K_OVERFLOW, "bad_write"));
    }
    free(p);
    EXPECT_DEATH(bad_free(dangling), QM_CALL_THEN(QM_K_DOUBLE_FREE, "bad_free"));
    EXPECT_DEATH(bad_realloc(dangling, 2 * n), QM_CALL_THEN(QM_K_REALLOC, "bad_realloc"));
    std::string kind = n > 10000 ? "large" : "small";
    // the first line's shape from report.re, its details filled in here
    std::string first = "^" QM_LINE_OF(QM_K_USABLE_SIZE, "@D@") "\n";
    first.replace(first.find("@D@"), 3,
                  kind + " chunk, " + std::to_string(n) + " bytes, already freed");
    EXPECT_DEATH(bad_usable_size(dangling),
                 first + QM_CALL_THEN(QM_K_USABLE_SIZE, "bad_usable_size"));
    if (n > 10000) {
      EXPECT_EXIT(bad_write(dangling + 8), testing::KilledBySignal(SIGSEGV),
                  QM_ACCESS_THEN(QM_K_UAF, "bad_write"));
    }
  }
  void *z = malloc(0);
  void *volatile zd = z;
  free(z);
  EXPECT_DEATH(bad_free(zd), QM_CALL_THEN(QM_K_DOUBLE_FREE, "bad_free"));
  EXPECT_DEATH(bad_usable_size(zd), QM_CALL_THEN(QM_K_USABLE_SIZE, "bad_usable_size"));
  int local = 0;
  EXPECT_DEATH(bad_free(&local), QM_CALL_THEN(QM_K_INVALID_FREE, "bad_free"));
}

TEST(Linked, OperatorNewThrowsBadAllocWhenNothingFits) {
  volatile size_t huge = size_t{1} << 46;
  EXPECT_THROW(
      {
        char *p = new char[huge];
        p[0] = 0;
        delete[] p;
      },
      std::bad_alloc);
  char *q = new (std::nothrow) char[huge];
  EXPECT_EQ(q, nullptr);
}

TEST(Linked, ContainersOfEverySize) {
  std::vector<std::string> strings;
  std::map<int, std::vector<int>> m;
  for (int i = 0; i < 20000; i++) {
    strings.push_back(std::string(i % 300, 'a' + i % 26));
    m[i].resize(i % 50);
  }
  std::vector<char> big;
  for (int i = 0; i < (64 << 20); i += 4096)
    big.insert(big.end(), 4096, static_cast<char>(i >> 12));
  EXPECT_EQ(big.size(), size_t{64} << 20);
  EXPECT_EQ(big[(32 << 20) + 5], static_cast<char>(8192));
  EXPECT_EQ(strings[12345].size(), 12345u % 300);
}

TEST(Linked, DlopenAndNssLiveOnIt) {
  for (int i = 0; i < 20; i++) {
    void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    ASSERT_NE(dlsym(h, "cos"), nullptr);
    dlclose(h);
  }
  struct addrinfo *ai = nullptr;
  if (getaddrinfo("localhost", "80", nullptr, &ai) == 0)
    freeaddrinfo(ai);
}

TEST(Linked, ThreadsAndForkOnPlainMalloc) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; t++)
    ts.emplace_back([&] {
      std::vector<std::string> v;
      while (!stop) {
        v.emplace_back(1 + v.size() % 700, 'x');
        if (v.size() % 97 == 0)
          v.emplace_back(200000, 'y');
        if (v.size() > 500)
          v.clear();
      }
    });
  for (int i = 0; i < 20; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(20);
      std::vector<std::string> v(1000, std::string(100, 'z'));
      std::string big(3 << 20, 'q');
      _exit(big[100] == 'q' && v[999][99] == 'z' ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  }
  stop = true;
  for (auto &t : ts)
    t.join();
}

} // namespace
