// test_fork.cpp: fork() while other threads allocate and free small and
// large chunks: the child can allocate and free at once (no lock inherited
// held), and the parent goes on. Two children of one parent draw every
// random choice afresh: a forking server is no crash oracle.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "util.h"

namespace {

// Reads up to n bytes of a child's pipe into to, until it ends, and closes
// it; how many came.
size_t read_all(int fd, void *to, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, static_cast<char *>(to) + got, n - got);
    if (r <= 0)
      break;
    got += size_t(r);
  }
  close(fd);
  return got;
}

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
  // under qemu-user a round takes 2-3 s (its fork, and a child whose code
  // is translated afresh beside the parent's two threads): 10 rounds there,
  // 97 s of the unit process's 295 with 40
  const int rounds = qmt_emulated() ? 10 : 40;
  for (int round = 0; round < rounds; round++) {
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // a deadlock here would otherwise hang the suite. Not sooner: a child
      // takes 50-700 ms on a loaded 2-core host, its parent's two threads
      // running beside it, and over 20 s once in 40 rounds in a 5.10 guest
      // under QEMU's software emulation (one CPU)
      alarm(120);
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
    ASSERT_TRUE(WIFEXITED(status)) << "round " << round << " status " << status << " after "
                                   << std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count()
                                   << " ms";
    ASSERT_EQ(WEXITSTATUS(status), 0);
    void *p = qm_malloc(1000);
    qm_free(p);
  }
  stop = true;
  for (auto &t : ts)
    t.join();
}

// The random choices a process makes from here on, one list per stream:
// the order a thread's bin hands chunks back in after they were freed into
// it, the order a batch from the central lists comes in (shuffled when
// carved or taken), which aged large chunk each request gets, the sampling
// countdown.
struct Draws {
  std::vector<uintptr_t> first, canary, reuse, batch, large;
  uintptr_t sample = 0;
};

constexpr int kFirst = 16, kSmall = 64, kLarge = 12;

Draws draw() {
  Draws d;
  d.sample = qmt_sample_left();
  std::vector<void *> v;
  // the first mallocs, from what the parent freed, and their canaries
  for (int i = 0; i < kFirst; i++) {
    v.push_back(qm_malloc(48));
    uint64_t k = 0; // a sampled chunk (guarded slot) has none
    if (!qmt_is_guarded(v.back()))
      std::memcpy(&k, static_cast<char *>(v.back()) + 48, 8);
    d.first.push_back(reinterpret_cast<uintptr_t>(v.back()));
    d.canary.push_back(k);
  }
  for (void *p : v)
    qm_free(p);
  v.clear();
  for (int i = 0; i < kSmall; i++)
    v.push_back(qm_malloc(48));
  for (void *p : v)
    qm_free(p);
  v.clear();
  for (int i = 0; i < kSmall; i++) {
    v.push_back(qm_malloc(48));
    d.reuse.push_back(reinterpret_cast<uintptr_t>(v.back()));
  }
  for (void *p : v)
    qm_free(p);
  v.clear();
  qmt_flush_thread_cache(); // the next malloc of 2000 takes a batch
  for (int i = 0; i < 16; i++) {
    v.push_back(qm_malloc(2000));
    d.batch.push_back(reinterpret_cast<uintptr_t>(v.back()));
  }
  for (void *p : v)
    qm_free(p);
  v.clear();
  for (int i = 0; i < kLarge; i++) {
    v.push_back(qm_malloc(1 << 20));
    d.large.push_back(reinterpret_cast<uintptr_t>(v.back()));
  }
  for (void *p : v)
    qm_free(p);
  return d;
}

void put(int fd, const std::vector<uintptr_t> &v) {
  ASSERT_EQ(write(fd, v.data(), v.size() * sizeof v[0]), ssize_t(v.size() * sizeof v[0]));
}

Draws child_draws() {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    close(fds[0]);
    Draws d = draw();
    put(fds[1], d.first);
    put(fds[1], d.canary);
    put(fds[1], d.reuse);
    put(fds[1], d.batch);
    put(fds[1], d.large);
    put(fds[1], {d.sample});
    _exit(0);
  }
  close(fds[1]);
  Draws d;
  d.first.resize(kFirst);
  d.canary.resize(kFirst);
  d.reuse.resize(kSmall);
  d.batch.resize(16);
  d.large.resize(kLarge);
  std::vector<uintptr_t> all(2 * kFirst + kSmall + 16 + kLarge + 1);
  size_t want = all.size() * sizeof all[0], got = read_all(fds[0], all.data(), want);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(got, want);
  auto at = all.begin();
  std::copy(at, at + kFirst, d.first.begin());
  std::copy(at + kFirst, at + 2 * kFirst, d.canary.begin());
  at += 2 * kFirst;
  std::copy(at, at + kSmall, d.reuse.begin());
  std::copy(at + kSmall, at + kSmall + 16, d.batch.begin());
  std::copy(at + kSmall + 16, all.end() - 1, d.large.begin());
  d.sample = all.back();
  return d;
}

TEST(Fork, ChildrenDrawAfresh) {
  // a parent with chunks in its bin, aged large chunks (48 frees and 48 MiB
  // are past the window) and a sampling countdown under way
  std::vector<void *> v;
  for (int i = 0; i < 48; i++)
    v.push_back(qm_malloc(1 << 20));
  for (int i = 0; i < 100; i++)
    v.push_back(qm_malloc(48));
  for (void *p : v)
    qm_free(p);
  v.clear();
  for (int i = 0; i < 4; i++) // the parent's streams have drawn
    v.push_back(qm_malloc(1 << 20));
  for (void *p : v)
    qm_free(p);
  Draws a = child_draws(), b = child_draws(), p = draw();
  // inherited free chunks: neither the same first chunks in one order, nor
  // one canary in common (a forking server is no canary oracle)
  EXPECT_NE(a.first, b.first) << "two children's first mallocs get the same chunks";
  EXPECT_NE(a.first, p.first) << "a child's first mallocs get its parent's next chunks";
  for (int i = 0; i < kFirst; i++)
    for (int j = 0; j < kFirst; j++)
      if (a.first[i] == b.first[j] && a.canary[i]) {
        EXPECT_NE(a.canary[i], b.canary[j]) << "one chunk with one canary in two children";
      }
  EXPECT_NE(a.reuse, b.reuse) << "two children reuse small chunks in one order";
  EXPECT_NE(a.reuse, p.reuse) << "a child reuses small chunks in its parent's order";
  EXPECT_NE(a.batch, b.batch) << "two children get a batch in one order";
  EXPECT_NE(a.batch, p.batch) << "a child gets a batch in its parent's order";
  EXPECT_NE(a.large, b.large) << "two children reuse large chunks in one order";
  EXPECT_NE(a.large, p.large) << "a child reuses large chunks in its parent's order";
  EXPECT_NE(a.sample, b.sample) << "two children sample the same allocation";
  EXPECT_NE(a.sample, p.sample) << "a child samples its parent's allocation";
}

// Chunks carved after the fork, the same slots in two children, take a
// drawn first generation: with generation 0 for every fresh chunk, two
// children handed them out with one canary (2,866 of 2,994 slots alike),
// and a canary one child leaked was its sibling's.
std::vector<uintptr_t> fresh_canaries() {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  constexpr int n = 2000;
  pid_t pid = fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    close(fds[0]);
    std::vector<uintptr_t> out;
    for (int i = 0; i < n; i++) {
      void *p = qm_malloc(5000); // mostly carved now: few tests use this class
      uint64_t k = 0;
      if (!qmt_is_guarded(p))
        std::memcpy(&k, static_cast<char *>(p) + 5000, 8);
      out.push_back(reinterpret_cast<uintptr_t>(p));
      out.push_back(k);
    }
    put(fds[1], out);
    _exit(0);
  }
  close(fds[1]);
  std::vector<uintptr_t> all(2 * n);
  size_t want = all.size() * sizeof all[0];
  EXPECT_EQ(read_all(fds[0], all.data(), want), want);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(fds[0]);
  return all;
}

TEST(Fork, ChunksCarvedInTwoChildrenHaveNoCanaryInCommon) {
  std::vector<uintptr_t> a = fresh_canaries(), b = fresh_canaries();
  std::map<uintptr_t, uintptr_t> at;
  for (size_t i = 0; i < a.size(); i += 2)
    if (a[i + 1])
      at[a[i]] = a[i + 1];
  size_t shared = 0, same = 0;
  for (size_t i = 0; i < b.size(); i += 2) {
    auto it = at.find(b[i]);
    if (it == at.end() || !b[i + 1])
      continue;
    shared++;
    same += it->second == b[i + 1];
  }
  EXPECT_GT(shared, 1000u) << "the children carved the same slots";
  // one generation in 65,536 by chance: 0.03 alike expected
  EXPECT_LE(same, 2u) << same << " of " << shared << " slots with one canary in two children";
}

// The state (2: free) and generation of each of v's chunks in a fork child
// that has emptied its cache (its frees on their way to other threads sent).
std::vector<unsigned> child_entries(const std::vector<void *> &v) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    close(fds[0]);
    qmt_flush_thread_cache();
    std::vector<unsigned> e;
    for (void *p : v) {
      qmt_entry_t w = qmt_entry(p);
      e.push_back(w.state << 16 | w.gen);
    }
    ssize_t want = ssize_t(e.size() * sizeof e[0]);
    _exit(write(fds[1], e.data(), size_t(want)) == want ? 0 : 1);
  }
  close(fds[1]);
  std::vector<unsigned> e(v.size());
  size_t want = e.size() * sizeof e[0], got = read_all(fds[0], e.data(), want);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(got, want);
  return e;
}

// Frees on their way to another thread when the process forks (in the
// owner's inbox, or still in the forking thread's outbox) make free chunks
// of the child like any other: they take fresh generations too, so two
// children do not hand them out with one canary. Settled after the
// generations were drawn, they had the parent's next one in every child.
TEST(Fork, ChunksFreedInFlightTakeFreshGenerations) {
  constexpr int kN = 32;
  std::vector<void *> v(2 * kN);
  std::atomic<int> phase{0};
  std::thread owner([&] {
    for (void *&p : v)
      p = qm_malloc(48);
    phase = 1;
    while (phase != 2) // no malloc: its inbox is not drained
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (phase != 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  qm_free(qm_malloc(48)); // this thread has a cache: its frees are batched
  for (int i = 0; i < kN; i++)
    qm_free(v[i]);
  qmt_flush_thread_cache(); // sent: in the owner's inbox
  for (int i = kN; i < 2 * kN; i++)
    qm_free(v[i]); // still in this thread's outbox
  std::vector<unsigned> a = child_entries(v), b = child_entries(v);
  phase = 2;
  owner.join();
  qmt_flush_thread_cache();
  int same = 0, n = 0;
  for (size_t i = 0; i < v.size(); i++) {
    if (qmt_is_guarded(v[i])) // sampled: a guarded slot, no entry
      continue;
    n++;
    EXPECT_EQ(a[i] >> 16, 2u) << "chunk " << i << " not free in the child";
    same += a[i] == b[i];
  }
  EXPECT_LE(same, 2) << same << " of " << n
                     << " chunks freed in flight have one generation in two children";
}

// A sender applying frees to an exited thread's id holds that id's lock
// (here a thread holds it through the hook, for 100 ms). fork waits for it
// instead of copying it held: the child's free of one of that thread's
// chunks takes the lock, and before it waited there forever.
TEST(Fork, ChildFreesToAClosedIdWhileASenderHeldItsLock) {
  if (!qmt_option("thread_cache"))
    GTEST_SKIP() << "no thread has a cache, hence an id";
  void *p[2] = {nullptr, nullptr};
  unsigned id = 0;
  std::thread owner([&] {
    p[0] = qm_malloc(40);
    p[1] = qm_malloc(40);
    id = qmt_owner_id();
  }); // exits: its id closes
  owner.join();
  ASSERT_NE(id, 0u);
  std::atomic<bool> held{false};
  std::thread sender([&] {
    qmt_owner_lock(id, 1);
    held = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    qmt_owner_lock(id, 0);
  });
  while (!held)
    std::this_thread::yield();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10); // a lock inherited held: killed
    qm_free(p[0]);
    qmt_flush_thread_cache(); // the batch sent: applied under id's lock
    _exit(0);
  }
  sender.join();
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  qm_free(p[0]);
  qm_free(p[1]);
}

// A signal handler's free landing in fork's handlers, while they hold
// every lock: it takes the nested path (the forking thread is marked busy
// from prepare on), applied in parent and child as the handlers end.
// Unmarked, a large chunk's free waited for good on the lock fork held. In
// a process of its own, killed by an alarm if it hangs.
static void *fork_victim;
static void fork_hook_frees() {
  qmt_set_fork_hook(nullptr); // once
  qm_free(fork_victim);
}
TEST(Fork, AHandlersFreeInForksHandlersIsAppliedInParentAndChild) {
  pid_t outer = fork();
  ASSERT_GE(outer, 0);
  if (outer == 0) {
    alarm(20);
    fork_victim = qm_malloc(200000);
    qm_stats_t before, after;
    qm_stats(&before);
    qmt_set_fork_hook(fork_hook_frees);
    pid_t pid = fork();
    if (pid < 0)
      _exit(10);
    qm_stats(&after);
    bool applied = after.large_live_chunks == before.large_live_chunks - 1;
    if (pid == 0)
      _exit(applied ? 0 : 11);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
      _exit(12);
    _exit(!applied ? 13 : WEXITSTATUS(st));
  }
  int st = 0;
  ASSERT_EQ(waitpid(outer, &st, 0), outer);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << "status " << st << " (killed by signal 14: the free waited for fork's lock; 11: not "
      << "applied in the child, 13: in the parent)";
}

} // namespace
