/* alloc.h: what alloc.c offers the rest of the library beyond the public
 * qm_ names: the one checked sized free behind free_sized,
 * free_aligned_sized and C++'s sized and aligned operator delete.
 */
#ifndef QM_ALLOC_H
#define QM_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* Frees p after checking that size (SIZE_MAX: not passed) and align (0 or
 * 1: not passed) name it; call names the entry point in the report. cxx
 * accepts what C++'s operator new makes of a request (0 -> 1, rounding up
 * to the alignment). */
void qm__free_checked(const char *call, void *p, size_t align, size_t size, bool cxx);

#endif
