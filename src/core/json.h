/*
 * json - helpers over Jansson (Debian libjansson-dev) for reading config-like JSON files
 * with errors that name the file, line, column and field.
 *
 * jload_file/jload_buf parse; the getters look up `key` in an object and check its type.
 * Each getter returns WELD_OK, WELD_ERR_NOT_FOUND when the key is absent (with *out left
 * unchanged, so callers preset defaults and ignore NOT_FOUND for optional keys), or
 * WELD_ERR_FORMAT naming "<where>: field '<key>'" when the value has the wrong type or range.
 * `where` is usually the file name. JSON null counts as absent.
 */
#ifndef WELD_CORE_JSON_H
#define WELD_CORE_JSON_H

#include "core/err.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

json_t *jload_file(const char *path, struct weld_err *e);
json_t *jload_buf(const char *buf, size_t len, const char *where, struct weld_err *e);

int jget_int(const json_t *obj, const char *key, int64_t *out, const char *where,
             struct weld_err *e);
int jget_double(const json_t *obj, const char *key, double *out, const char *where,
                struct weld_err *e);
int jget_bool(const json_t *obj, const char *key, bool *out, const char *where,
              struct weld_err *e);
/* *out points into obj (valid while obj lives). */
int jget_str(const json_t *obj, const char *key, const char **out, const char *where,
             struct weld_err *e);

/* Write a JSON value to path, pretty-printed with 2-space indent. */
int jsave_file(const json_t *v, const char *path, struct weld_err *e);

#endif
