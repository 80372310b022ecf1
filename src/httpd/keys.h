/*
 * keys - the API keys of an HTTP command (--api-key, repeatable, and --api-key-file) and
 * the check of "Authorization: Bearer KEY".
 *
 * The scheme is matched in any case (RFC 7235), blanks around the token are ignored, and
 * the token is compared in constant time with every key, whichever matches, so the time
 * says nothing about where a guess differs. No message names a key; httpd_keys_free wipes
 * them. With no key at all every request passes.
 */
#ifndef WELD_HTTPD_KEYS_H
#define WELD_HTTPD_KEYS_H

#include "core/err.h"

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

struct httpd_keys {
    char **v;    /* (n) */
    size_t *len; /* (n) */
    int n;
};

/* keys (n_keys, each non-empty), then file (NULL: none; one key a line, blank lines
   skipped, at least one key). Errors name the flag and the file. */
int httpd_keys_load(struct httpd_keys *k, const char *const *keys, int n_keys, const char *file,
                    struct weld_err *e);
/* The request carries one of the keys (always true with none). */
bool httpd_keys_check(const struct httpd_keys *k, struct MHD_Connection *c);
void httpd_keys_free(struct httpd_keys *k);

#endif
