/* json - see json.h. */
#include "core/json.h"

#include "core/mfile.h"

#include <string.h>

json_t *jload_buf(const char *buf, size_t len, const char *where, struct weld_err *e)
{
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    if (!v)
        err_set(e, WELD_ERR_FORMAT, "%s:%d:%d: bad JSON: %s", where, je.line, je.column,
                je.text);
    return v;
}

json_t *jload_file(const char *path, struct weld_err *e)
{
    struct mfile m;
    if (mfile_open(&m, path, e) != WELD_OK)
        return NULL;
    json_t *v = jload_buf((const char *)m.data, m.size, path, e);
    mfile_close(&m);
    return v;
}

static const json_t *lookup(const json_t *obj, const char *key)
{
    if (!json_is_object(obj))
        return NULL;
    const json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

int jget_int(const json_t *obj, const char *key, int64_t *out, const char *where,
             struct weld_err *e)
{
    const json_t *v = lookup(obj, key);
    if (!v)
        return WELD_ERR_NOT_FOUND;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return WELD_OK;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d >= -9.2e18 && d <= 9.2e18 && d == (double)(int64_t)d) {
            *out = (int64_t)d;
            return WELD_OK;
        }
    }
    return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' must be an integer", where, key);
}

int jget_double(const json_t *obj, const char *key, double *out, const char *where,
                struct weld_err *e)
{
    const json_t *v = lookup(obj, key);
    if (!v)
        return WELD_ERR_NOT_FOUND;
    if (!json_is_number(v))
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' must be a number", where, key);
    *out = json_number_value(v);
    return WELD_OK;
}

int jget_bool(const json_t *obj, const char *key, bool *out, const char *where,
              struct weld_err *e)
{
    const json_t *v = lookup(obj, key);
    if (!v)
        return WELD_ERR_NOT_FOUND;
    if (!json_is_boolean(v))
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' must be true or false", where,
                       key);
    *out = json_is_true(v);
    return WELD_OK;
}

int jget_str(const json_t *obj, const char *key, const char **out, const char *where,
             struct weld_err *e)
{
    const json_t *v = lookup(obj, key);
    if (!v)
        return WELD_ERR_NOT_FOUND;
    if (!json_is_string(v))
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' must be a string", where, key);
    *out = json_string_value(v);
    return WELD_OK;
}

int jsave_file(const json_t *v, const char *path, struct weld_err *e)
{
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "%s: cannot serialize JSON", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return err_set(e, WELD_ERR_NOMEM, "%s: cannot serialize JSON", path);
    }
    s = t;
    s[n] = '\n';
    int rc = file_write_all(path, s, n + 1, e);
    free(s);
    return rc;
}
