/*
 * alloc - see alloc.h. A countdown decides whether the next allocation fails; with the
 * countdown at 0 (the default) the wrappers are malloc with an overflow check.
 */
#include "core/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
