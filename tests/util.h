// util.h: helpers shared by the C++ tests: volatile accesses the compiler
// cannot drop (a store to freed memory is otherwise dead code), RSS reads,
// (the regexes of qmalloc's reports are in report_re.h).
#ifndef QM_TEST_UTIL_H
#define QM_TEST_UTIL_H

#include <gtest/gtest.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "qmalloc.h"
#include "report_re.h"
#include "shim.h"

// Skips a test whose result means nothing under an emulator (qmt_emulated):
// qemu-user runs the program on the host's kernel and page tables, so fault
// counts, timings and the probe's verdict are the host's and the emulator's,
// and RLIMIT_AS is not applied to the guest (qemu ignores it).
#define QMT_SKIP_IF_EMULATED(why)                                                                  \
  do {                                                                                             \
    if (const char *emu_ = qmt_emulated())                                                         \
      GTEST_SKIP() << "under " << emu_ << ": " << (why);                                           \
  } while (0)

// Why the mappings /proc/self/maps shows cannot be counted under qemu-user
// (7.2): it takes the source of an mremap with MREMAP_DONTUNMAP, which the
// kernel keeps mapped, for unmapped, and its maps leaves out every host
// mapping whose pages its flags disagree on, so a mapping that holds such
// pages is not shown at all (tests/main.cpp skips the one-VMA processes).
#define QMT_MAPS_AFTER_DONTUNMAP                                                                   \
  "its /proc/self/maps leaves out every mapping that holds the source of an "                      \
  "mremap(MREMAP_DONTUNMAP), which it takes for unmapped: the mappings cannot be counted"

// The library runs no belt in a build under AddressSanitizer (secondary.c).
constexpr bool asan_build() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

// Accesses through a volatile pointer: kept even after free().
inline void poke(void *p, size_t off = 0, char v = 1) { static_cast<volatile char *>(p)[off] = v; }
inline char peek(const void *p, size_t off = 0) {
  return static_cast<const volatile char *>(p)[off];
}

// Frees a chunk of size bytes, runs `cycles` further alloc/free cycles of
// the same size, then reads or writes the freed chunk at off: a death test's
// statement, which must die of SIGSEGV with the report.
inline void use_after_free(size_t size, int cycles, bool write, size_t off) {
  char *p = static_cast<char *>(qm_malloc(size));
  std::memset(p, 0x11, size);
  qm_free(p);
  for (int i = 0; i < cycles; i++) {
    void *q = qm_malloc(size);
    std::memset(q, 0x22, size);
    qm_free(q);
  }
  if (write)
    poke(p, off);
  else
    (void)peek(p, off);
}

// Resident set of the whole process, bytes (/proc/self/statm).
inline size_t rss_bytes() {
  FILE *f = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0;
  if (f) {
    if (std::fscanf(f, "%lu %lu", &size, &res) != 2)
      res = 0;
    std::fclose(f);
  }
  return res * qmt_page();
}

// Resident bytes of [p, p+len) (mincore). A range mincore cannot answer
// fails the calling test, at the caller's line, with the errno, and gives
// SIZE_MAX, so that no check on it passes by default: ENOMEM where a page
// of the range is unmapped, and under qemu-user (7.2) also where one is
// PROT_NONE (it asks that the whole range be readable before it calls the
// kernel's mincore). A check of a range that may hold either uses
// qmt_resident_mapped.
inline size_t qmt_resident(const void *p, size_t len, const char *file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
  size_t res;
  if (int err = qmt_mincore(p, len, &res)) {
    ADD_FAILURE_AT(file, line) << "mincore(" << p << ", " << len << "): " << std::strerror(err);
    return SIZE_MAX;
  }
  return res;
}

// Resident bytes of the mapped parts of [p, p+len), for a freed range that
// may be unmapped in part or whole (an unmapped page holds none) or
// PROT_NONE. Under an emulator its PROT_NONE pages cannot be asked
// (qmt_resident): they are left out, their bytes in *unseen, and a check
// that "no page is resident" covers only the readable rest there; natively
// every mapped page is measured (*unseen 0). An error fails the test as
// qmt_resident does.
inline size_t qmt_resident_mapped(const void *p, size_t len, size_t *unseen = nullptr,
                                  const char *file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
  size_t res, none;
  if (int err = qmt_mincore_mapped(p, len, qmt_emulated() != nullptr, &res, &none)) {
    ADD_FAILURE_AT(file, line) << "mincore of the mappings in [" << p << ", +" << len
                               << "): " << std::strerror(err);
    return SIZE_MAX;
  }
  if (unseen)
    *unseen = none;
  return res;
}

inline bool all_bytes(const void *p, size_t n, unsigned char v) {
  const unsigned char *c = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; i++)
    if (c[i] != v)
      return false;
  return true;
}

#endif
