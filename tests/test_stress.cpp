// test_stress.cpp: four threads, hundreds of thousands of mixed-size
// operations each, swapping chunks through shared slots so that most frees
// happen on another thread than the malloc; every chunk carries a pattern
// that is checked before it is freed. Also runs in the sanitizer build.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "util.h"

namespace {

constexpr int kThreads = 4, kOps = 250000, kSlots = 4096;

// Every chunk in a guarded slot (the unit-guard-all and unit-sampled runs):
// each malloc and free is a few system calls, so a tenth of the operations
// (the full count runs in the unit and unit-no-thread-cache runs).
int ops() {
  const char *o = std::getenv("QMALLOC_OPTIONS");
  std::string opts = std::string(":") + (o ? o : "") + ":";
  bool guarded = opts.find(":guard_all=1:") != std::string::npos ||
                 opts.find(":sample_rate=1:") != std::string::npos;
  return guarded ? kOps / 10 : kOps;
}

struct Slot {
  std::atomic<unsigned char *> p{nullptr};
};

uint64_t next(uint64_t &s) { // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A chunk starts with its size; the rest is a byte pattern keyed by both.
unsigned char *make(size_t n) {
  n = n < sizeof(size_t) + 1 ? sizeof(size_t) + 1 : n;
  unsigned char *p = static_cast<unsigned char *>(qm_malloc(n));
  if (!p)
    return nullptr;
  std::memcpy(p, &n, sizeof n);
  unsigned char v = static_cast<unsigned char>(n * 31 + 7);
  std::memset(p + sizeof n, v, n - sizeof n);
  return p;
}

bool check_and_free(unsigned char *p) {
  size_t n;
  std::memcpy(&n, p, sizeof n);
  unsigned char v = static_cast<unsigned char>(n * 31 + 7);
  // a large chunk is checked at both ends, a small one all through
  bool ok = n < 4096 ? all_bytes(p + sizeof n, n - sizeof n, v)
                     : p[sizeof n] == v && p[n - 1] == v && p[n / 2] == v;
  qm_free(p);
  return ok;
}

TEST(Stress, MixedSizesAcrossThreads) {
  std::vector<Slot> slots(kSlots);
  std::atomic<long> bad{0}, failed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++) {
    ts.emplace_back([&, t] {
      uint64_t seed = 0x1234 + t;
      for (int i = 0, nops = ops(); i < nops; i++) {
        uint64_t r = next(seed);
        size_t n;
        if (r % 1000 == 0)
          n = (128 << 10) + (r >> 20) % (1 << 20); // large, now and then
        else if (r % 100 < 5)
          n = 1024 + (r >> 12) % (64 << 10);
        else
          n = (r >> 8) % 512;
        unsigned char *p = make(n);
        if (!p) {
          failed++;
          continue;
        }
        unsigned char *old = slots[(r >> 40) % kSlots].p.exchange(p);
        if (old && !check_and_free(old))
          bad++;
        if (r % 7 == 0) { // and sometimes free one outright
          unsigned char *o = slots[(r >> 24) % kSlots].p.exchange(nullptr);
          if (o && !check_and_free(o))
            bad++;
        }
      }
    });
  }
  for (auto &t : ts)
    t.join();
  for (auto &s : slots)
    if (unsigned char *p = s.p.exchange(nullptr))
      if (!check_and_free(p))
        bad++;
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(failed.load(), 0);
}

// Frees of every kind at once: each thread frees some of its own chunks
// (the owner's plain stores), hands the rest to the next thread and exits;
// the next one frees them after their owner is gone (an id with no thread:
// the closed path) while a consumer frees chunks a live producer keeps
// allocating (sent to the producer, applied on its refills). Every chunk's
// pattern is checked before its free; a double free or a lost transition
// aborts. Built with ThreadSanitizer too (build-tsan), where it must report
// no race.
TEST(Stress, LocalRemoteAndExitingThreadFrees) {
  constexpr int kRounds = 24, kChunks = 2000;
  std::atomic<long> bad{0};
  // a live producer and a consumer that frees what it makes
  std::atomic<bool> stop{false};
  std::vector<Slot> pc(256);
  std::thread producer([&] {
    uint64_t seed = 99;
    while (!stop) {
      uint64_t r = next(seed);
      unsigned char *p = make(16 + r % 700);
      unsigned char *old = pc[(r >> 32) % pc.size()].p.exchange(p);
      if (old && !check_and_free(old)) // sometimes its own, sometimes back
        bad++;
    }
  });
  std::thread consumer([&] {
    uint64_t seed = 7;
    while (!stop) {
      uint64_t r = next(seed);
      if (unsigned char *p = pc[r % pc.size()].p.exchange(nullptr))
        if (!check_and_free(p))
          bad++;
    }
  });
  // successors: each frees its predecessor's leftovers, after it exited
  std::vector<unsigned char *> left;
  for (int round = 0; round < kRounds; round++) {
    std::thread t([&, round] {
      std::vector<unsigned char *> mine, prev;
      prev.swap(left);
      uint64_t seed = 1000 + round;
      for (int i = 0; i < kChunks; i++)
        mine.push_back(make(8 + next(seed) % 1000));
      for (unsigned char *p : prev)
        if (!check_and_free(p))
          bad++;
      for (size_t i = 0; i < mine.size(); i++) {
        if (i % 2 && !check_and_free(mine[i]))
          bad++;
        else if (!(i % 2))
          left.push_back(mine[i]);
      }
    });
    t.join();
  }
  for (unsigned char *p : left)
    if (!check_and_free(p))
      bad++;
  stop = true;
  producer.join();
  consumer.join();
  for (auto &s : pc)
    if (unsigned char *p = s.p.exchange(nullptr))
      if (!check_and_free(p))
        bad++;
  EXPECT_EQ(bad.load(), 0);
}

} // namespace
