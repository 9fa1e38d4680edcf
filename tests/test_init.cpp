// test_init.cpp: start-up on a kernel that refuses getrandom() (no entropy
// yet early in a 5.10 boot, or a seccomp policy): the secret then comes from
// the AT_RANDOM bytes, which need not be 8-byte aligned, and qmalloc must
// still start and allocate. The child runs in a fresh exec of this binary,
// with getrandom() made to fail by a seccomp filter inherited across exec.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

namespace {

// getrandom() fails with ENOSYS; every other call is allowed.
bool refuse_getrandom() {
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog = {static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Run only as the child of the test below (gtest skips DISABLED_ tests).
TEST(InitChild, DISABLED_AllocatesWithoutGetrandom) {
  char b;
  errno = 0;
  ASSERT_EQ(getrandom(&b, 1, GRND_NONBLOCK), -1);
  ASSERT_EQ(errno, ENOSYS) << "the seccomp filter is not in place";
  for (size_t n : {16ul, 4000ul, 300000ul}) {
    char *p = static_cast<char *>(qm_malloc(n));
    ASSERT_NE(p, nullptr) << n;
    std::memset(p, 1, n);
    qm_free(p);
  }
}

TEST(Init, StartsWhenGetrandomFails) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!refuse_getrandom())
      _exit(3);
    char self[] = "unit-tests";
    char filter[] = "--gtest_filter=InitChild.DISABLED_AllocatesWithoutGetrandom";
    char disabled[] = "--gtest_also_run_disabled_tests";
    char *argv[] = {self, filter, disabled, nullptr};
    execv("/proc/self/exe", argv);
    _exit(4);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "child killed by signal " << WTERMSIG(st);
  if (WEXITSTATUS(st) == 3)
    GTEST_SKIP() << "no seccomp filters in this kernel (CONFIG_SECCOMP_FILTER): getrandom() "
                    "cannot be made to fail";
  ASSERT_NE(WEXITSTATUS(st), 4) << "could not exec /proc/self/exe";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "qmalloc did not start, or allocate, without getrandom()";
}

} // namespace
