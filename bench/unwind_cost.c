/* unwind_cost.c: what a stack costs to capture, by the two unwinders one
 * could use: libgcc's _Unwind_Backtrace (qmalloc's qm__stack_capture) and a
 * frame-pointer walk. Each captures up to 16 frames from the bottom of a
 * call chain of --depth frames, built once with frame pointers and once
 * without (the default of gcc -O2 on x86-64, and of Debian's libc); prints
 * ns per capture (median of 9 rounds) and the frames each found.
 * The two chains are unwind_chain.c compiled twice, this file with frame
 * pointers (bench/meson.build: clang has no per-function optimize("...")).
 * usage: unwind_cost [--depth D] [--iters N]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qmalloc.h"
#include "unwind_cost.h"

unsigned qm__stack_capture(uintptr_t *pcs, unsigned max);

#define FRAMES 16

/* The walk one would write: follow %rbp, stop at anything that does not
 * look like the next frame up (it cannot know the stack's bounds without
 * pthread_getattr_np, which allocates). */
__attribute__((noinline)) static unsigned fp_walk(uintptr_t *pcs, unsigned max) {
  uintptr_t *fp = __builtin_frame_address(0);
  uintptr_t top = (uintptr_t)fp + ((uintptr_t)8 << 20);
  unsigned n = 0;
  while (n < max) {
    uintptr_t next = fp[0], ret = fp[1];
    if (!ret)
      break;
    pcs[n++] = ret - 1;
    if (next <= (uintptr_t)fp || next >= top || (next & 7))
      break;
    fp = (uintptr_t *)next;
  }
  return n;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned iters = 20000;
volatile uintptr_t uc_sink;

/* With frame pointers itself: a frame without one between the walk and the
 * chain (the compiler may use %rbp as a plain register there) ends it. */
__attribute__((noinline)) void uc_measure(result_t *r) {
  uintptr_t pcs[FRAMES];
  for (int m = 0; m < 2; m++) {
    uint64_t t0 = now_ns();
    unsigned n = 0;
    for (unsigned i = 0; i < iters; i++) {
      n = m ? fp_walk(pcs, FRAMES) : qm__stack_capture(pcs, FRAMES);
      uc_sink = pcs[0];
    }
    r->ns[m] = (now_ns() - t0) / iters;
    r->frames[m] = n;
  }
}

static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int depth = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--depth"))
      depth = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters"))
      iters = (unsigned)atoi(argv[i + 1]);
  }
  qm_free(qm_malloc(1)); /* initialises qmalloc: capture is off before */
  for (int c = 0; c < 2; c++) {
    uint64_t ns[2][9];
    result_t r;
    for (int k = 0; k < 9; k++) {
      (c ? uc_chain_nofp : uc_chain_fp)(depth, &r);
      ns[0][k] = r.ns[0];
      ns[1][k] = r.ns[1];
    }
    qsort(ns[0], 9, sizeof ns[0][0], cmp);
    qsort(ns[1], 9, sizeof ns[1][0], cmp);
    printf("chain of %d frames %s frame pointers: libgcc %llu ns, %u frames; "
           "frame-pointer walk %llu ns, %u frames (of at most %d)\n",
           depth, c ? "without" : "with", (unsigned long long)ns[0][4], r.frames[0],
           (unsigned long long)ns[1][4], r.frames[1], FRAMES);
  }
  return 0;
}
