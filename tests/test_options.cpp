// test_options.cpp: QMALLOC_OPTIONS parsing: values applied, defaults kept on
// bad input, and the exact one-line warnings for unknown names, malformed and
// out-of-range values. Every test restores the options the process started
// with.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

using testing::internal::CaptureStderr;
using testing::internal::GetCapturedStderr;

namespace {

class Options : public testing::Test {
protected:
  void SetUp() override { qmt_options_reset(); }
  void TearDown() override { qmt_options_init(); }
  // Applies s and returns what was printed on stderr.
  std::string apply(const char *s, int *warnings = nullptr) {
    CaptureStderr();
    int w = qmt_options_apply(s);
    if (warnings)
      *warnings = w;
    return GetCapturedStderr();
  }
};

TEST_F(Options, DefaultsAreTheTable) {
  EXPECT_EQ(qmt_option("quarantine_mb"), 96u);
  EXPECT_EQ(qmt_option("large_threshold_kb"), 128u);
  EXPECT_EQ(qmt_option("strategy"), 0u); // auto
  EXPECT_EQ(qmt_option("probe"), 0u);    // auto
  EXPECT_EQ(qmt_option("fault_report"), 1u);
  EXPECT_EQ(qmt_option("no_such_option"), UINT64_MAX);
}

TEST_F(Options, ValidStringApplies) {
  int w = -1;
  EXPECT_EQ(apply("quarantine_mb=32:verbose=1:strategy=discard:probe=slow", &w), "");
  EXPECT_EQ(w, 0);
  EXPECT_EQ(qmt_option("quarantine_mb"), 32u);
  EXPECT_EQ(qmt_option("verbose"), 1u);
  EXPECT_EQ(qmt_option("strategy"), 2u);
  EXPECT_EQ(qmt_option("probe"), 2u);
}

TEST_F(Options, BooleansTakeWords) {
  apply("verbose=yes:fault_report=false");
  EXPECT_EQ(qmt_option("verbose"), 1u);
  EXPECT_EQ(qmt_option("fault_report"), 0u);
  apply("verbose=no:fault_report=true");
  EXPECT_EQ(qmt_option("verbose"), 0u);
  EXPECT_EQ(qmt_option("fault_report"), 1u);
}

TEST_F(Options, UnknownNameWarnsAndTheRestApplies) {
  int w = 0;
  std::string err = apply("bogus=1:quarantine_mb=16", &w);
  EXPECT_EQ(err, "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option 'bogus' ignored\n");
  EXPECT_EQ(w, 1);
  EXPECT_EQ(qmt_option("quarantine_mb"), 16u);
}

// A name one or two edits from a known one (a letter dropped, added,
// changed, or two swapped) is named; further off, nothing is guessed.
TEST_F(Options, NearMissNamesTheOptionMeant) {
  const std::string w = "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option '";
  EXPECT_EQ(apply("quarantin_mb=5"), w + "quarantin_mb' ignored; did you mean 'quarantine_mb'?\n");
  EXPECT_EQ(apply("qaurantine_mb=5"),
            w + "qaurantine_mb' ignored; did you mean 'quarantine_mb'?\n");
  EXPECT_EQ(apply("hardenning=max"), w + "hardenning' ignored; did you mean 'hardening'?\n");
  EXPECT_EQ(apply("stats_at_exti=1"),
            w + "stats_at_exti' ignored; did you mean 'stats_at_exit'?\n");
  EXPECT_EQ(apply("quarantine=5"), w + "quarantine' ignored\n"); // 3 edits: no guess
  EXPECT_EQ(apply("bogus=1"), w + "bogus' ignored\n");
  EXPECT_EQ(qmt_option("quarantine_mb"), 96u); // nothing applied on a guess
}

TEST_F(Options, OutOfRangeNamesTheRangeAndKeepsTheValue) {
  std::string err = apply("quarantine_mb=99999999");
  EXPECT_EQ(err, "qmalloc: WARNING: QMALLOC_OPTIONS: option 'quarantine_mb' takes an integer in "
                 "[0, 1048576], not '99999999'; keeping 96\n");
  EXPECT_EQ(qmt_option("quarantine_mb"), 96u);
  err = apply("large_threshold_kb=2");
  EXPECT_EQ(err, "qmalloc: WARNING: QMALLOC_OPTIONS: option 'large_threshold_kb' takes an "
                 "integer in [4, 128], not '2'; keeping 128\n");
}

TEST_F(Options, MalformedValues) {
  EXPECT_EQ(apply("quarantine_mb=abc"),
            "qmalloc: WARNING: QMALLOC_OPTIONS: option 'quarantine_mb' takes an integer in "
            "[0, 1048576], not 'abc'; keeping 96\n");
  EXPECT_EQ(apply("quarantine_mb="),
            "qmalloc: WARNING: QMALLOC_OPTIONS: option 'quarantine_mb' takes an integer in "
            "[0, 1048576], not ''; keeping 96\n");
  EXPECT_EQ(apply("quarantine_mb=-1"),
            "qmalloc: WARNING: QMALLOC_OPTIONS: option 'quarantine_mb' takes an integer in "
            "[0, 1048576], not '-1'; keeping 96\n");
  EXPECT_EQ(apply("quarantine_mb=123456789012345678901234"),
            "qmalloc: WARNING: QMALLOC_OPTIONS: option 'quarantine_mb' takes an integer in "
            "[0, 1048576], not '123456789012345678901234'; keeping 96\n");
  EXPECT_EQ(apply("strategy=fast"),
            "qmalloc: WARNING: QMALLOC_OPTIONS: option 'strategy' takes one of "
            "auto|protect|discard|guard|unmap|none, not 'fast'; keeping auto\n");
  EXPECT_EQ(apply("verbose=2"), "qmalloc: WARNING: QMALLOC_OPTIONS: option 'verbose' takes 0 or "
                                "1, not '2'; keeping 0\n");
  EXPECT_EQ(apply("noequals"),
            "qmalloc: WARNING: QMALLOC_OPTIONS: 'noequals' is not name=value; ignored\n");
  EXPECT_EQ(apply("=5"), "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option '' ignored\n");
  EXPECT_EQ(qmt_option("quarantine_mb"), 96u);
  EXPECT_EQ(qmt_option("strategy"), 0u);
}

TEST_F(Options, EmptyEntriesAreNothing) {
  int w = -1;
  EXPECT_EQ(apply("", &w), "");
  EXPECT_EQ(apply(":::", &w), "");
  EXPECT_EQ(apply(":quarantine_mb=3:", &w), "");
  EXPECT_EQ(w, 0);
  EXPECT_EQ(qmt_option("quarantine_mb"), 3u);
}

TEST_F(Options, LongGarbageIsCutInTheMessage) {
  std::string s = "quarantine_mb=" + std::string(5000, 'x');
  std::string err = apply(s.c_str());
  EXPECT_NE(err.find("not '" + std::string(80, 'x') + "...'; keeping 96"), std::string::npos)
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1);
}

// Whatever the string, every value stays inside its documented range.
TEST_F(Options, RandomStringsNeverLeaveTheRanges) {
  std::mt19937 rng(12345);
  const char *names[] = {"quarantine_mb", "strategy",           "probe",
                         "verbose",       "large_threshold_kb", "max_mappings"};
  const char alphabet[] = "=:0123456789abcdefx_-";
  for (int round = 0; round < 2000; round++) {
    std::string s;
    int parts = rng() % 4;
    for (int i = 0; i < parts; i++) {
      s += names[rng() % 6];
      int n = rng() % 8;
      for (int k = 0; k < n; k++)
        s += alphabet[rng() % (sizeof alphabet - 1)];
      s += ':';
    }
    apply(s.c_str());
    ASSERT_LE(qmt_option("quarantine_mb"), 1048576u) << s;
    ASSERT_LE(qmt_option("strategy"), 5u) << s;
    ASSERT_LE(qmt_option("probe"), 2u) << s;
    ASSERT_LE(qmt_option("verbose"), 1u) << s;
    ASSERT_GE(qmt_option("large_threshold_kb"), 4u) << s;
    ASSERT_LE(qmt_option("large_threshold_kb"), 128u) << s;
  }
}

// What the environment holds is printed with its control bytes escaped: a
// name or value cannot start a line of its own nor steer a terminal.
TEST_F(Options, ControlBytesAreEscaped) {
  std::string err = apply("bo\ngus=1:quarantine_mb=1\x1b[2J:a\\b\xff=1");
  EXPECT_EQ(err, "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option 'bo\\x0agus' ignored\n"
                 "qmalloc: WARNING: QMALLOC_OPTIONS: option 'quarantine_mb' takes an integer in "
                 "[0, 1048576], not '1\\x1b[2J'; keeping 96\n"
                 "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option 'a\\x5cb\\xff' ignored\n");
}

// Option log_path: the file PATH.<pid>, opened as the first line is written.
class LogPath : public Options {
protected:
  std::string dir, file;
  void SetUp() override {
    Options::SetUp();
    char tmpl[] = "/tmp/qmlogXXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    file = dir + "/qm." + std::to_string(getpid());
  }
  void TearDown() override {
    qmt_options_reset(); // closes nothing: the descriptor is forgotten
    qmt_log_forget();
    Options::TearDown();
    std::string rm = "rm -rf '" + dir + "'";
    ASSERT_EQ(system(rm.c_str()), 0);
  }
  // Sets log_path=path, then prints two warnings; returns stderr.
  std::string twice(const std::string &path) {
    qmt_log_forget();
    EXPECT_EQ(apply(("log_path=" + path).c_str()), "");
    return apply("bogus=1:bogus=2");
  }
  static std::string read(const std::string &path) {
    std::string s;
    FILE *f = fopen(path.c_str(), "r");
    if (!f)
      return "(none)";
    int c;
    while ((c = fgetc(f)) != EOF)
      s += static_cast<char>(c);
    fclose(f);
    return s;
  }
  // Creates an empty file at path.
  static void touch(const std::string &path) {
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fclose(f);
  }
  // The one warning for a log file that is refused, then the two warnings.
  static std::string refused(const std::string &path, const std::string &why);
};

const char *const kBogus = "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option 'bogus' ignored\n"
                           "qmalloc: WARNING: QMALLOC_OPTIONS: unknown option 'bogus' ignored\n";

std::string LogPath::refused(const std::string &path, const std::string &why) {
  return "qmalloc: WARNING: log_path: cannot open '" + path + "': " + why +
         "; reports go to stderr only\n" + kBogus;
}

TEST_F(LogPath, WritesThePidFileReadableByItsOwnerOnly) {
  EXPECT_EQ(twice(dir + "/qm"), kBogus);
  EXPECT_EQ(read(file), kBogus);
  struct stat st;
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(LogPath, SymbolicLinkIsRefused) {
  std::string target = dir + "/target";
  touch(target);
  ASSERT_EQ(symlink(target.c_str(), file.c_str()), 0);
  EXPECT_EQ(twice(dir + "/qm"), refused(file, "it is a symbolic link, refused"));
  EXPECT_EQ(read(target), "");
}

TEST_F(LogPath, MissingDirectoryWarnsOnce) {
  EXPECT_EQ(twice(dir + "/nothere/qm"), refused(dir + "/nothere/qm." + std::to_string(getpid()),
                                                "its directory does not exist"));
}

const char *const kNotOwnRegular =
    "not a regular file with one link owned by the user writing it, refused";

TEST_F(LogPath, FileWithAnotherLinkIsRefused) {
  std::string other = dir + "/other";
  touch(other);
  ASSERT_EQ(link(other.c_str(), file.c_str()), 0);
  EXPECT_EQ(twice(dir + "/qm"), refused(file, kNotOwnRegular));
  EXPECT_EQ(read(other), "");
}

TEST_F(LogPath, FileOfAnotherUserIsRefused) {
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root to make a file another user owns";
  touch(file);
  ASSERT_EQ(chown(file.c_str(), 65534, 65534), 0);
  EXPECT_EQ(twice(dir + "/qm"), refused(file, kNotOwnRegular));
  EXPECT_EQ(read(file), "");
}

TEST_F(LogPath, PathIsPrintedEscaped) {
  EXPECT_EQ(twice(dir + "/no\nthere/qm"),
            refused(dir + "/no\\x0athere/qm." + std::to_string(getpid()),
                    "its directory does not exist"));
}

// Run with QMALLOC_OPTIONS="quarantine_mb=7:nonsense=1:probe=maybe" (meson test
// "unit-env-options"): what the library read at start-up, and again now.
TEST(EnvOptions, ReadFromTheEnvironmentAtStartup) {
  EXPECT_EQ(qmt_option("quarantine_mb"), 7u);
  EXPECT_EQ(qmt_option("probe"), 0u);
  CaptureStderr();
  qmt_options_init();
  std::string err = GetCapturedStderr();
  EXPECT_NE(err.find("qmalloc: WARNING: QMALLOC_OPTIONS: unknown option 'nonsense' ignored\n"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("option 'probe' takes one of auto|fast|slow, not 'maybe'; keeping auto\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(qmt_option("quarantine_mb"), 7u);
  // the allocator still works with the rest applied
  void *p = qm_malloc(1 << 20);
  ASSERT_NE(p, nullptr);
  qm_free(p);
}

} // namespace
