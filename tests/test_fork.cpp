// test_fork.cpp: fork() while other threads allocate and free small and
// large chunks: the child can allocate and free at once (no lock inherited
// held), and the parent goes on.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "util.h"

namespace {

TEST(Fork, ChildAllocatesWhileParentThreadsDid) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; t++)
    ts.emplace_back([&, t] {
      std::vector<void *> v;
      unsigned i = 0;
      while (!stop) {
        size_t n = (i % 50 == 0) ? (256u << 10) : 16 + (i * 37 + t) % 2000;
        v.push_back(qm_malloc(n));
        if (v.size() > 64) {
          qm_free(v.front());
          v.erase(v.begin());
        }
        i++;
      }
      for (void *p : v)
        qm_free(p);
    });
  for (int round = 0; round < 40; round++) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(20); // a deadlock here would otherwise hang the suite
      std::vector<void *> v;
      for (int i = 0; i < 2000; i++)
        v.push_back(qm_malloc(i % 100 == 0 ? (300u << 10) : 8 + i % 3000));
      for (void *p : v)
        qm_free(p);
      void *big = qm_malloc(2 << 20);
      std::memset(big, 1, 2 << 20);
      qm_free(big);
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "round " << round << " status " << status;
    ASSERT_EQ(WEXITSTATUS(status), 0);
    void *p = qm_malloc(1000);
    qm_free(p);
  }
  stop = true;
  for (auto &t : ts)
    t.join();
}

} // namespace
