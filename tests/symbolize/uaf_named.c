/* uaf_named.c: allocates a large buffer in make_buffer(), frees it in
 * release_buffer(), then writes to it. Built with -g: the symbolized report
 * must name both functions with their source lines (the lines marked).
 */
#include <stdlib.h>
#include <string.h>

char *make_buffer(size_t n);
void release_buffer(char *p);

__attribute__((noinline)) char *make_buffer(size_t n) {
  char *p = malloc(n); /* ALLOC-LINE */
  __asm__ volatile("" ::: "memory");
  return p;
}

__attribute__((noinline)) void release_buffer(char *p) {
  free(p); /* FREE-LINE */
  __asm__ volatile("" ::: "memory");
}

int main(void) {
  char *p = make_buffer((size_t)1 << 20);
  memset(p, 1, (size_t)1 << 20);
  release_buffer(p);
  volatile char *volatile dangling = p;
  dangling[16] = 2; /* ACCESS-LINE */
  return 0;
}
