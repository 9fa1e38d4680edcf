/* bugs_named.c: one planted bug per run, each in a function of its own
 * (built with -g, no inlining), for the reports' first frame and SUMMARY:
 *   overflow     a 1-byte overflow of a 24-byte chunk, then free_small()
 *                frees it; a later puts finds it (default profile) or the
 *                free does (hardening=max): blame free_small
 *   double-free  free_again() frees a small chunk a second time
 *   invalid-free free_inside() frees a pointer 8 bytes into a chunk
 *   uaf          write_freed() writes to a freed large chunk
 * check_bugs.sh runs it and names the function each report must blame.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void free_small(char *p);
void free_again(char *p);
void free_inside(char *p);
void write_freed(char *p);

__attribute__((noinline)) void free_small(char *p) {
  free(p);
  __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void free_again(char *p) {
  free(p);
  __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void free_inside(char *p) {
  free(p + 8);
  __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void write_freed(char *p) {
  volatile char *volatile d = p;
  d[16] = 2;
}

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  if (!strcmp(m, "overflow")) {
    char *volatile p = malloc(24);
    memset(p, 'x', 25);
    free_small(p);
    puts("after the free");      /* stdout's first buffer: a malloc */
    for (int i = 0; i < 64; i++) /* parked frees: the batch checks it */
      free(malloc(24));
    return 0;
  }
  if (!strcmp(m, "double-free")) {
    char *p = malloc(40);
    free(p);
    free_again(p);
    return 0;
  }
  if (!strcmp(m, "invalid-free")) {
    free_inside(malloc(50));
    return 0;
  }
  if (!strcmp(m, "uaf")) {
    char *p = malloc((size_t)1 << 20);
    memset(p, 1, (size_t)1 << 20);
    free(p);
    write_freed(p);
    return 0;
  }
  fprintf(stderr, "usage: bugs_named overflow|double-free|invalid-free|uaf\n");
  return 2;
}
