// test_age.cpp: the aging queue (src/platform/age.h) through the shim, as its users
// drive it: entries leave oldest first across the ring's wrap, a full
// queue's oldest leaves early, and "older than d" holds across the clock's
// wrap at 2^32; entries that leave from within (the large quarantine's
// chunks) keep the order of the rest, their positions and the aged mark
// across skips, compaction and growth, checked against a plain list.
#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "util.h"

namespace {

TEST(Age, OldestFirstAcrossTheWrap) {
  qmt_age_reset(3);
  uintptr_t next_out = 1;
  // eight rounds of one in, one out go round a ring of three several times
  for (uintptr_t item = 1; item <= 8; item++) {
    EXPECT_EQ(qmt_age_push(item, 0), 0u);
    if (item >= 2) { // two wait: the oldest leaves once the second is in
      EXPECT_EQ(qmt_age_pop_due(1, 0), next_out++);
    }
  }
  EXPECT_EQ(qmt_age_pop_due(1, 0), 8u);
  EXPECT_EQ(qmt_age_pop_due(1, 0), 0u); // empty
}

TEST(Age, AFullQueuesOldestLeavesEarly) {
  qmt_age_reset(3);
  for (uintptr_t item = 1; item <= 3; item++)
    EXPECT_EQ(qmt_age_push(item, 0), 0u);
  EXPECT_EQ(qmt_age_push(4, 0), 1u);
  EXPECT_EQ(qmt_age_push(5, 0), 2u);
  for (uintptr_t item = 3; item <= 5; item++)
    EXPECT_EQ(qmt_age_pop_due(100, 0), item);
}

TEST(Age, DueOnlyWhenOlderThanDAcrossTheClocksWrap) {
  qmt_age_reset(4);
  uint32_t t = UINT32_MAX - 2;
  qmt_age_push(1, t);
  qmt_age_push(2, t + 2);                   // wraps to 0 past UINT32_MAX
  EXPECT_EQ(qmt_age_pop_due(t + 4, 4), 0u); // 4 ticks: not older than 4
  EXPECT_EQ(qmt_age_pop_due(t + 5, 4), 1u);
  EXPECT_EQ(qmt_age_pop_due(t + 5, 4), 0u); // the next is 3 ticks old
  EXPECT_EQ(qmt_age_pop_due(t + 7, 4), 2u);
}

// The live entries from the oldest, and whether each item's kept position
// is its place.
static std::vector<uint32_t> live_entries(uint32_t *n_all) {
  uint32_t e[64];
  bool pos_ok;
  *n_all = qmt_age32_entries(e, &pos_ok);
  EXPECT_TRUE(pos_ok);
  std::vector<uint32_t> v;
  for (uint32_t k = 0; k < *n_all; k++)
    if (e[k] != UINT32_MAX)
      v.push_back(e[k]);
  return v;
}

TEST(Age, LeavingFromWithinKeepsTheOrderAndFreesTheRoom) {
  qmt_age32_reset(4, 4);
  for (uint32_t i = 1; i <= 4; i++)
    qmt_age32_push(i);
  qmt_age32_leave(2);
  qmt_age32_leave(3);
  uint32_t n;
  EXPECT_EQ(live_entries(&n), (std::vector<uint32_t>{1, 4}));
  EXPECT_EQ(n, 4u) << "empty entries within wait for the head or a compaction";
  qmt_age32_leave(1); // the oldest: the head passes it and the empties behind it
  EXPECT_EQ(live_entries(&n), (std::vector<uint32_t>{4}));
  EXPECT_EQ(n, 1u);
  for (uint32_t i = 5; i <= 7; i++)
    qmt_age32_push(i);
  qmt_age32_leave(5);
  qmt_age32_push(8); // full, one empty: compacted in place across the wrap
  EXPECT_EQ(live_entries(&n), (std::vector<uint32_t>{4, 6, 7, 8}));
  EXPECT_EQ(qmt_age32_cap(), 4u);
}

TEST(Age, AFullQueueWithFewEmptiesGrowsAcrossTheWrap) {
  qmt_age32_reset(4, 16);
  for (uint32_t i = 1; i <= 6; i++) { // head at 2, entries wrapped
    qmt_age32_push(i);
    if (i == 2) {
      qmt_age32_leave(1);
      qmt_age32_leave(2);
    }
  }
  qmt_age32_leave(4);
  qmt_age32_set_mark(2); // 3 and the empty 4 aged; 5 the first not
  qmt_age32_push(7);     // 3 live of 4: grows to 8
  uint32_t n;
  EXPECT_EQ(live_entries(&n), (std::vector<uint32_t>{3, 5, 6, 7}));
  EXPECT_EQ(qmt_age32_cap(), 8u);
  EXPECT_EQ(qmt_age32_mark(), 1u) << "on 5, the first entry after it that did not leave";
}

// Random pushes, leaves from anywhere and advances of the mark, against a
// list: the order, the positions and the aged entries agree throughout.
TEST(Age, FromWithinAgreesWithAList) {
  std::mt19937 rng(29);
  qmt_age32_reset(2, 64);
  std::deque<uint32_t> model; // live items, oldest first
  uint32_t aged_below = 0;    // items are pushed in increasing order: aged ones are < this
  uint32_t next = 1;
  for (int step = 0; step < 20000; step++) {
    unsigned r = rng() % 8;
    if (r < 3 && model.size() < 31 && next < 256) {
      qmt_age32_push(next);
      model.push_back(next++);
    } else if (r < 6 && !model.empty()) {
      size_t k = rng() % model.size();
      qmt_age32_leave(model[k]);
      model.erase(model.begin() + static_cast<long>(k));
    } else if (r == 6) { // the mark passes the next entry that did not leave
      uint32_t e[64];
      bool ok;
      uint32_t n = qmt_age32_entries(e, &ok), m = qmt_age32_mark();
      while (m < n && e[m] == UINT32_MAX)
        m++;
      if (m < n) {
        aged_below = e[m] + 1;
        qmt_age32_set_mark(m + 1);
      }
    }
    if (next == 256 && model.empty()) { // start again: items are positions' indices
      qmt_age32_reset(2, 64);
      next = 1;
      aged_below = 0;
    }
    uint32_t n;
    std::vector<uint32_t> got = live_entries(&n);
    ASSERT_EQ(got, std::vector<uint32_t>(model.begin(), model.end())) << "step " << step;
    ASSERT_LE(n, qmt_age32_cap());
    // the mark: the live entries before it are exactly the aged ones
    uint32_t e[64];
    bool ok;
    qmt_age32_entries(e, &ok);
    uint32_t m = qmt_age32_mark();
    ASSERT_LE(m, n);
    for (uint32_t k = 0; k < n; k++) {
      if (e[k] != UINT32_MAX) {
        ASSERT_EQ(k < m, e[k] < aged_below) << "step " << step << " entry " << e[k];
      }
    }
  }
}

} // namespace
