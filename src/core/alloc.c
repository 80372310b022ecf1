/*
 * alloc - see alloc.h. A countdown decides whether the next allocation fails; with the
 * countdown at 0 (the default) the wrappers are malloc with an overflow check.
 */
#include "core/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static long fail_countdown; /* 0: off; else fail when it reaches 1 */
static long fail_count;

static int should_fail(void)
{
    if (fail_countdown <= 0)
        return 0;
    if (--fail_countdown == 0) {
        fail_count++;
        return 1;
    }
    return 0;
}

void alloc_fail_at(long n)
{
    fail_countdown = n > 0 ? n : 0;
    fail_count = 0;
}

long alloc_failed_count(void)
{
    return fail_count;
}

void *wmalloc(size_t n)
{
    if (should_fail())
        return NULL;
    return malloc(n ? n : 1);
}

void *wcalloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *wrealloc(void *p, size_t n)
{
    if (should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

char *wstrndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = wmalloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *wstrdup(const char *s)
{
    return wstrndup(s, SIZE_MAX);
}

void wfree(void *p)
{
    free(p);
}

#define HUGE_ALIGN ((size_t)2 << 20)
#define HUGE_MIN ((size_t)64 << 20)

void *wmap_huge(size_t n)
{
    if (should_fail())
        return NULL;
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX - 2 * HUGE_ALIGN)
        return NULL;
    if (n < HUGE_MIN) { /* small pools: plain pages, no 2 MiB rounding of what RSS sees */
        void *q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return q == MAP_FAILED ? NULL : q;
    }
    size_t len = (n + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN, map = len + HUGE_ALIGN;
    uint8_t *raw = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    /* Keep the 2 MiB-aligned len bytes inside, give back the edges. */
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN);
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + map - (p + len));
    if (tail)
        munmap(p + len, tail);
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* advice only: without THP the pool still works */
#endif
    return p;
}

void wunmap(void *p, size_t n)
{
    if (!p)
        return;
    if (n == 0)
        n = 1;
    munmap(p, n < HUGE_MIN ? n : (n + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN);
}
