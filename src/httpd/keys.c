/*
 * keys - API keys (keys.h): loading from the flags and a file, and the constant-time check.
 */
#include "httpd/keys.h"

#include "core/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int add_key(struct httpd_keys *k, int *cap, const char *t, size_t n, struct weld_err *e)
{
    if (k->n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        char **nv = wrealloc(k->v, (size_t)nc * sizeof *nv);
        if (nv)
            k->v = nv;
        size_t *nl = nv ? wrealloc(k->len, (size_t)nc * sizeof *nl) : NULL;
        if (nl)
            k->len = nl;
        if (!nv || !nl)
            return err_set(e, WELD_ERR_NOMEM, "out of memory");
        *cap = nc;
    }
    char *s = wmalloc(n + 1);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    memcpy(s, t, n);
    s[n] = 0;
    k->v[k->n] = s;
    k->len[k->n++] = n;
    return WELD_OK;
}

int httpd_keys_load(struct httpd_keys *k, const char *const *keys, int n_keys, const char *file,
                    struct weld_err *e)
{
    memset(k, 0, sizeof *k);
    int cap = 0, rc = WELD_OK;
    for (int i = 0; !rc && i < n_keys; i++) {
        if (!keys[i][0])
            return err_set(e, WELD_ERR_INVALID_ARG, "--api-key: the key is empty");
        rc = add_key(k, &cap, keys[i], strlen(keys[i]), e);
    }
    if (rc || !file)
        return rc;
    FILE *f = fopen(file, "r");
    if (!f)
        return err_set(e, WELD_ERR_IO, "--api-key-file %s: %s", file, strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    int n_file = 0;
    while (!rc && (n = getline(&line, &lcap, f)) >= 0) {
        char *t = line;
        while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t'))
            t[--n] = 0;
        while (*t == ' ' || *t == '\t')
            t++, n--;
        if (!n)
            continue;
        if (!(rc = add_key(k, &cap, t, (size_t)n, e)))
            n_file++;
    }
    if (!rc && ferror(f))
        rc = err_set(e, WELD_ERR_IO, "--api-key-file %s: read error", file);
    if (!rc && !n_file)
        rc = err_set(e, WELD_ERR_INVALID_ARG,
                     "--api-key-file %s: no key in the file (one "
                     "key a line)",
                     file);
    free(line);
    fclose(f);
    return rc;
}

/* Equal, in a time that depends on the lengths only, never on where the bytes differ. */
static bool same_secret(const char *a, size_t na, const char *b, size_t nb)
{
    volatile unsigned char d = na != nb;
    for (size_t i = 0; i < na && nb; i++)
        d |= (unsigned char)(a[i] ^ b[i < nb ? i : 0]);
    return nb && !d;
}

bool httpd_keys_check(const struct httpd_keys *k, struct MHD_Connection *c)
{
    if (!k->n)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t'))
        return false;
    const char *t = h + 6;
    while (*t == ' ' || *t == '\t')
        t++;
    size_t n = strlen(t);
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t'))
        n--;
    bool ok = false;
    for (int i = 0; i < k->n; i++)
        ok |= same_secret(t, n, k->v[i], k->len[i]);
    return ok;
}

void httpd_keys_free(struct httpd_keys *k)
{
    for (int i = 0; i < k->n; i++) {
        memset(k->v[i], 0, k->len[i]);
        wfree(k->v[i]);
    }
    wfree(k->v);
    wfree(k->len);
    memset(k, 0, sizeof *k);
}
