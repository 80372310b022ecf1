/*
 * mfile - a read-only view of a whole file, memory-mapped.
 *
 * Model weights are mmapped and pointed into, never copied. mfile_wrap() gives the same
 * view over caller-owned memory (fuzz targets, tests, files already in memory); close
 * then does not unmap. An empty file maps to data == NULL, size == 0.
 */
#ifndef WELD_CORE_MFILE_H
#define WELD_CORE_MFILE_H

#include "core/err.h"

#include <stddef.h>
#include <stdint.h>

struct mfile {
    const uint8_t *data; /* size bytes, read-only */
    size_t size;
    int owned;           /* 1: mmapped by mfile_open, unmapped by mfile_close */
};

int mfile_open(struct mfile *m, const char *path, struct weld_err *e);
void mfile_wrap(struct mfile *m, const void *data, size_t size);
void mfile_close(struct mfile *m); /* safe on a zeroed or closed mfile */
/* Tell the kernel the whole pages inside [p, p + n) will not be read again for a while:
   they leave this process's resident set (MADV_DONTNEED) and come back from the file if
   touched. Only for a file mmapped by mfile_open (a wrapped buffer would be lost, so it
   is left alone) and only where the range lies inside it; returns 1 if pages were
   released. Used after weights were repacked into a copy. */
int mfile_release(const struct mfile *m, const void *p, size_t n);
/* Map every page of [p, p + n) (mapped memory) into the page tables now, so that reading
   a random row of it later costs no page fault (MADV_POPULATE_READ, or one read a page
   where the kernel lacks it). Used for the token embeddings, read one row a token. */
void mfile_prefault(const void *p, size_t n);

/* Read a whole (small) file into a NUL-terminated heap buffer; *len gets its size. */
int file_read_all(const char *path, char **out, size_t *len, struct weld_err *e);
/* Write n bytes to path atomically enough for our use (write then rename). */
int file_write_all(const char *path, const void *data, size_t n, struct weld_err *e);

#endif
