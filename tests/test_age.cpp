// test_age.cpp: the aging queue (src/age.h) through the shim, as its users
// drive it: entries leave oldest first across the ring's wrap, a full
// queue's oldest leaves early, and "older than d" holds across the clock's
// wrap at 2^32.
#include <gtest/gtest.h>

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

} // namespace
