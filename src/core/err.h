/*
 * err - status codes and error messages.
 *
 * Fallible functions take a `struct weld_err *e` (may be NULL) and return an enum
 * weld_status. err_set() fills the slot and returns the status, so a failure path reads
 *     return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': offset %llu past end", ...);
 * Messages name the file, then the field or offset, then what is wrong; if the caller can do
 * something about it, say what.
 *
 * WELD_ASSERT is for programmer errors only: always on, prints file:line and aborts.
 */
#ifndef WELD_CORE_ERR_H
#define WELD_CORE_ERR_H

#include "weld.h"

#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define WELD_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define WELD_PRINTF(a, b)
#endif

/* Fill e (if not NULL) with status s and a formatted message; returns s. */
int err_set(struct weld_err *e, enum weld_status s, const char *fmt, ...) WELD_PRINTF(3, 4);

/* Prefix the message already in e with "prefix: " (keeps the status); returns e->status. */
int err_prefix(struct weld_err *e, const char *fmt, ...) WELD_PRINTF(2, 3);

/* Reset e to WELD_OK and an empty message. */
void err_clear(struct weld_err *e);

#define WELD_ASSERT(cond)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);    \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#endif
