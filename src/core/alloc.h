/*
 * alloc - checked heap allocation with fault injection.
 *
 * All library allocations go through these wrappers so tests can make the Nth allocation
 * fail (alloc_fail_at) and check that every cleanup path releases what it took and reports
 * WELD_ERR_NOMEM. They return NULL on failure like malloc; they never abort.
 * wfree(NULL) is a no-op. Counters are process-wide and not thread-safe for injection (tests
 * inject from one thread); plain allocation is thread-safe.
 */
#ifndef WELD_CORE_ALLOC_H
#define WELD_CORE_ALLOC_H

#include <stddef.h>

void *wmalloc(size_t n);
void *wcalloc(size_t count, size_t size); /* checks count*size overflow */
void *wrealloc(void *p, size_t n);
char *wstrdup(const char *s);
char *wstrndup(const char *s, size_t n);  /* copies at most n bytes, always NUL-terminates */
void wfree(void *p);

/* A zeroed region of n bytes in its own anonymous mapping; from 64 MiB up, 2 MiB aligned
   with transparent huge pages requested (MADV_HUGEPAGE), for big pools read in scattered
   stripes (the KV cache: 4 KiB pages there cost a TLB miss per stripe). Pages are
   committed on first touch. Free with wunmap(p, n); wunmap(NULL, n) is a no-op. Counts as
   one allocation for alloc_fail_at. */
void *wmap_huge(size_t n);
void wunmap(void *p, size_t n);

/* Make the n-th allocation from now fail (1 = the next one); 0 disables. */
void alloc_fail_at(long n);
/* Number of allocations that were made to fail since the last alloc_fail_at(). */
long alloc_failed_count(void);

#endif
