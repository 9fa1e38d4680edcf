// main.cpp: the gtest entry point of every test binary. Death tests run in
// the "threadsafe" style (a fresh exec of the binary), because the allocator
// under test has threads and locks that a plain fork() would copy mid-flight.
#include <gtest/gtest.h>

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
