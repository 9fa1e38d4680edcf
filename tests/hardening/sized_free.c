/* sized_free.c: C23's free_sized and free_aligned_sized given what the
 * chunk was not allocated with, one case per run: a size of SIZE_MAX, and
 * an aligned_alloc(4096, n) chunk freed with alignment 64 or 48, small and
 * large; "ok" frees every chunk with what it was allocated with.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* C23 names that Debian 12's glibc neither declares nor defines: looked up
 * in the process, where qmalloc (preloaded or linked) defines them */
static void (*free_sized)(void *p, size_t n);
static void (*free_aligned_sized)(void *p, size_t a, size_t n);

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sized-free size-max|align-64|align-48|ok BYTES\n");
    return 2;
  }
  *(void **)&free_sized = dlsym(RTLD_DEFAULT, "free_sized");
  *(void **)&free_aligned_sized = dlsym(RTLD_DEFAULT, "free_aligned_sized");
  if (!free_sized || !free_aligned_sized) {
    fprintf(stderr, "sized-free: no free_sized in this process\n");
    return 3;
  }
  size_t n = strtoul(argv[2], NULL, 10);
  void *plain = malloc(n);
  void *al = aligned_alloc(4096, n);
  if (!plain || !al)
    return 3;
  if (!strcmp(argv[1], "size-max"))
    free_sized(plain, SIZE_MAX);
  else if (!strcmp(argv[1], "align-64"))
    free_aligned_sized(al, 64, n);
  else if (!strcmp(argv[1], "align-48"))
    free_aligned_sized(al, 48, n);
  else if (strcmp(argv[1], "ok"))
    return 2;
  free_sized(plain, n);
  free_aligned_sized(al, 4096, n);
  return 0;
}
