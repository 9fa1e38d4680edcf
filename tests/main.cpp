// main.cpp: the gtest entry point of every test binary. Death tests run in
// the "threadsafe" style (a fresh exec of the binary), because the allocator
// under test has threads and locks that a plain fork() would copy mid-flight.
// Under an emulator (qmt_emulated) the binary is the target's, which the
// host cannot exec by itself (no binfmt_misc): the fresh process is started
// through the emulator, as meson started this one (MESON_EXE_WRAPPER: the
// guest's execve of the host's qemu runs it natively); without the wrapper
// in the environment, in the "fast" style (fork only).
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "shim.h"

// The command that runs a target program: MESON_EXE_WRAPPER's words, its
// first resolved in PATH (execv does not search it); empty where there is none.
static std::vector<std::string> exe_wrapper() {
  std::vector<std::string> w;
  const char *env = getenv("MESON_EXE_WRAPPER");
  std::istringstream in(env ? env : "");
  for (std::string s; in >> s;)
    w.push_back(s);
  if (w.empty() || w[0].find('/') != std::string::npos)
    return w;
  std::istringstream path(getenv("PATH") ? getenv("PATH") : "");
  for (std::string dir; std::getline(path, dir, ':');) {
    std::string cand = dir + "/" + w[0];
    if (access(cand.c_str(), X_OK) == 0) {
      w[0] = cand;
      return w;
    }
  }
  return {};
}

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  const char *style = "threadsafe";
  // QMT_ONE_VMA_MOVES=1 (unit-belt-*-one-vma): the test hook refuses a move
  // of a range that /proc/self/maps does not show as one mapping. Under
  // qemu-user 7.2 that file is the emulator's: it leaves out any mapping
  // holding the source of an mremap(MREMAP_DONTUNMAP) (kept mapped by the
  // kernel, taken for unmapped by qemu), so the hook refuses moves the
  // kernel would make; and qemu builds the file by walking its flags of
  // every guest page, tens of ms a read at each move (7 minutes a process).
  // The whole process skips (77, meson's "skipped").
  const char *one = getenv("QMT_ONE_VMA_MOVES");
  if (const char *emu = qmt_emulated(); emu && one && *one == '1') {
    std::printf("skipped: under %s the one-VMA hook reads the emulator's /proc/self/maps, "
                "which leaves out every mapping holding the source of an "
                "mremap(MREMAP_DONTUNMAP)\n",
                emu);
    return 77;
  }
  if (qmt_emulated()) {
    std::vector<std::string> w = exe_wrapper();
    if (w.empty()) {
      style = "fast";
    } else {
      for (const std::string &a : testing::internal::GetArgvs())
        w.push_back(a);
      testing::internal::SetInjectableArgvs(w);
    }
  }
  GTEST_FLAG_SET(death_test_style, style);
  return RUN_ALL_TESTS();
}
