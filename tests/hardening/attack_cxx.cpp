// attack_cxx.cpp: delete of the wrong type or with the wrong alignment, as
// C++14's sized and C++17's aligned deallocation pass them to operator
// delete: qmalloc checks them as free_sized and free_aligned_sized do.
#include <cstdio>
#include <cstring>
#include <new>

struct Small {
  long x[4];
};
struct Big {
  long x[8];
};
struct alignas(64) Wide {
  long x[8];
};

static void *volatile sink;

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  if (!std::strcmp(m, "sized-ok")) {
    Small *s = new Small;
    sink = s;
    delete s; // sized delete with the right size: accepted
    Wide *w = new Wide;
    sink = w;
    delete w; // aligned, sized: accepted
    char *a = new char[0];
    sink = a;
    delete[] a;
    return 0;
  }
  if (!std::strcmp(m, "sized-mismatch")) {
    Small *s = new Small;
    sink = s;
    ::operator delete(s, sizeof(Big)); // deleting a Small as if it were a Big
    return 0;
  }
  if (!std::strcmp(m, "aligned-mismatch")) {
    // a plain new that happens to sit on a 256-byte boundary, deleted as
    // if it were aligned new's: the chunk remembers it was not asked for
    // that alignment (the pointer alone would pass)
    for (int i = 0; i < 4096; i++) {
      void *p = ::operator new(48);
      sink = p;
      if (!(reinterpret_cast<unsigned long>(p) % 256))
        ::operator delete(p, std::align_val_t(256));
    }
    return 2; // no chunk on the boundary: the test proves nothing
  }
  std::fprintf(stderr, "attack_cxx: unknown attack '%s'\n", m);
  return 2;
}
