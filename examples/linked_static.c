/* linked_static.c: qmalloc linked in as the malloc replacement, from
 * libqmalloc.a: no preload, the program's own malloc and free are qmalloc's.
 * Build: cc app.c -Wl,--whole-archive libqmalloc.a -Wl,--no-whole-archive
 * -lpthread (the whole archive, so malloc resolves to it and not to libc).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qmalloc.h"

int main(void) {
  qm_stats_t before, after;
  qm_stats(&before);
  char *small = malloc(100), *large = malloc(512 << 10);
  strcpy(small, "hello");
  memset(large, 1, 512 << 10);
  qm_stats(&after);
  int ours = after.large_live_chunks == before.large_live_chunks + 1;
  printf("malloc is qmalloc's: %s (large chunks live %llu -> %llu)\n", ours ? "yes" : "NO",
         (unsigned long long)before.large_live_chunks, (unsigned long long)after.large_live_chunks);
  char *volatile dangling = large;
  free(small);
  free(large);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    ((volatile char *)dangling)[10] = 2; /* freed above: must fault */
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  int caught = WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
  printf("use-after-free caught: %s\n", caught ? "yes" : "NO");
  return ours && caught ? 0 : 1;
}
